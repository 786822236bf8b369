"""The server's side of device-to-device rounds.

The devices' side: :mod:`splitfl.net.device.clusters`.

* :func:`run_cluster` — a group whose server part runs on a device (``Clusters.hosts``:
  ParallelSFL's top worker, §3.3). The server sends the top worker the cluster's bottom and
  top parts and one-round tokens for its members, tells each member where to connect, and
  waits for ``hosted``: the Eq. (4) average of the bottom parts, the trained top part, each
  member's tally and measured times. Every member's update is that average (the algorithm's
  per-worker τ_c weights then give Eq. 18 exactly: N_c equal states of weight τ_c). A member
  lost mid-cluster is dropped by its top worker, the others complete (Eq. 4 over those that
  finished); a lost top worker drops its cluster for the round. The round's top workers are
  then held against each other (:func:`reject_outlying_tops`).
* :func:`~splitfl.net.server.ring.run_ring` — RingSFL's ring. Each member gets the global
  model, the ring and links to its neighbours; each replies ``ring_done`` with its blended
  model. Alg. 2 needs every member in every step, so one failure (lost link, timeout,
  invalid tensor) abandons the round: the server tells the others to abort, records the
  member at fault as failed and the others as abandoned because of it; the global model
  stays as it was, and RingSFL forms the next rounds' ring without that member.

Everything a device reports is checked (tensor names, shapes, dtypes, finite values; counts
and times in range) before the algorithm sees it.

Over 400 lines as one concept, the hosted cluster's round on the server's end: the command
that hands a top worker its cluster, the checks of its ``hosted`` report and the holding of
the round's top workers against each other all read the same report.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, field, replace

import torch

from splitfl.config import BoundsConfig
from splitfl.core import plan_codec
from splitfl.core.plan import ClientUpdate, RoundPlan
from splitfl.core.topology import Clusters
from splitfl.models import BlockModel, ModelPart
from splitfl.net.device.emulation import UNSHAPED, Profile
from splitfl.net.server.cluster_deadline import ClusterClock, await_top
from splitfl.net.server.groups import NETWORKED_GROUPS, Groups, NetRound
from splitfl.net.server.remote_fleet import Meter
from splitfl.net.transport.auth import new_token, token_hash
from splitfl.net.transport.hub import LOST, DeviceLink, Hub
from splitfl.net.transport.wire import Message, payload_bytes, state_from, state_tensors
from splitfl.net.trust.checks import (
    MAX_BYTES,
    PeerHistory,
    bounded,
    check_state,
    loss_problem,
    state_specs,
)
from splitfl.net.trust.direction import direction_outliers
from splitfl.net.trust.expect import Expect
from splitfl.net.trust.reference import ServerStep, own_step
from splitfl.net.trust.spread import RoundMoves
from splitfl.roles.fleet import GroupRun
from splitfl.system.cost import d2d_rate

State = dict[str, torch.Tensor]
_seq = itertools.count(1 << 40)  # apart from RemoteFleet's sequence numbers


@dataclass
class D2DRound:
    """What a device-to-device coordinator needs of the round."""

    hub: Hub
    tag: str
    round_seed: int
    timeout_s: float
    meters: dict[int, Meter]
    lost: dict[int, str]
    bounds: BoundsConfig = field(default_factory=BoundsConfig)
    #: group → its top worker's accepted report (for :func:`reject_outlying_tops`)
    hosted: dict[int, Hosted] = field(default_factory=dict)
    #: the accepted reports' moves per local step, group → top part / bottom average (the
    #: spread check across top workers, :mod:`splitfl.net.trust.spread`)
    moves: dict[str, RoundMoves] = field(
        default_factory=lambda: {"top part": RoundMoves(), "bottom average": RoundMoves()}
    )
    #: the round deadline (``time.monotonic()``; None: none), relative to the measured rounds
    #: (:func:`~splitfl.net.server.executor.round_deadline`): a RingSFL round still running then is
    #: aborted (:mod:`splitfl.net.server.ring`)
    deadline: float | None = None
    #: RingSFL: ``network.round_deadline_factor`` for the members' start latencies (0: not
    #: checked), and the members found slow to start, with why (:mod:`splitfl.net.server.ring`)
    late_start_factor: float = 0.0
    late_starts: dict[int, str] = field(default_factory=dict)
    #: ParallelSFL: the deadline relative to the round's other clusters (None: none;
    #: :mod:`splitfl.net.server.cluster_deadline`)
    clock: ClusterClock | None = None
    #: ParallelSFL: this run's accepted cluster report times so far (the executor's list,
    #: kept across rounds: a round with one hosted cluster is judged against them)
    cluster_reports: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Hosted:
    """A top worker's accepted report, for the round's peer check across top workers: its
    reporting members, and the distance per local step of its top part and of its bottom
    average from the parts it was sent."""

    host: int
    members: tuple[int, ...]
    top: float
    bottom: float


@dataclass(frozen=True)
class ClusterEmulation:
    """Emulated profiles of a cluster: members' ``begin`` fields (FLOPS, D2D rate to the top
    worker as both link rates, device-part FLOPs) and the top worker's FLOPS."""

    members: dict[int, dict[str, float]]
    top_flops: float
    server_flops_per_sample: float


def send_command(link: DeviceLink, client: int, msg: Message) -> tuple[int, int, float]:
    seq = next(_seq)
    msg.fields.update(client=client, seq=seq)
    return seq, link.send(msg), time.perf_counter()


def await_reply(link: DeviceLink, client: int, seq: int, deadline: float):
    """The reply to ``seq`` ((message, bytes, arrival) or a reason string)."""
    got = link.reply(client, seq, deadline - time.monotonic())
    if got is None:
        return "no reply within the round's deadline"
    if got is LOST:
        return f"device {link.name} lost: {link.reason}"
    return got


def run_cluster(
    rnd: D2DRound,
    run: GroupRun,
    host: int,
    plan: RoundPlan,
    model: BlockModel,
    expect: Expect,
    emulation: ClusterEmulation | None,
) -> tuple[list[ClientUpdate], State | None]:
    """One hosted group (see module docstring): its members' updates and the top part."""
    hub, lost = rnd.hub, rnd.lost
    cuts = {t.cut for t in run.tasks}
    if len(cuts) != 1 or any(t.init_state is not None for t in run.tasks):
        raise ValueError("a hosted group needs one cut point and the global device part")
    cut = cuts.pop()
    top = hub.link_of(host)
    if top is None or not top.peer_address:
        for t in run.tasks:
            lost[t.client] = f"top worker {host} not connected (or not listening for peers)"
        return [], None
    links = {t.client: hub.link_of(t.client) for t in run.tasks}
    tasks = [t for t in run.tasks if links[t.client] is not None]
    for t in run.tasks:
        if links[t.client] is None:
            lost[t.client] = "device not connected"
        else:
            rnd.meters[t.client].device = links[t.client].name
    if not tasks:
        return [], None
    tokens = {t.client: new_token() for t in tasks}
    names = {t.client: f"{rnd.tag}-g{run.group}-c{t.client}" for t in tasks}
    members = []
    for t in tasks:
        entry = {"client": t.client, "name": names[t.client]}
        entry["token_hash"] = token_hash(tokens[t.client])
        if emulation is not None:
            entry["emulate"] = emulation.members[t.client]
        members.append(entry)
    # the group's plan, whole: its connected members' tasks (server_lr None: the first's lr)
    hosted, plan_tensors = plan_codec.encode(replace(plan, tasks=tasks))
    fields = {"group": run.group, "members": members, "round_seed": rnd.round_seed}
    fields |= {"timeout_s": rnd.timeout_s, "plan": hosted}
    if emulation is not None:
        fields |= {"top_flops": emulation.top_flops}
        fields |= {"server_flops_per_sample": emulation.server_flops_per_sample}
    server_part = ModelPart(model, cut, model.num_blocks).state_dict()
    bottom = run.parts[tasks[0].client]
    tensors = {**state_tensors("part", bottom), **state_tensors("server", server_part)}
    tensors |= state_tensors("plan", plan_tensors)
    host_msg = Message("host", fields, tensors)
    seq, down, sent_at = send_command(top, host, host_msg)
    joins = {}
    for t in tasks:
        join = {"address": top.peer_address, "cert": top.peer_cert, "name": names[t.client]}
        join["token"] = tokens[t.client]
        joins[t.client] = send_command(links[t.client], t.client, Message("join", join))[0]
    deadline = time.monotonic() + rnd.timeout_s * (max(t.steps for t in tasks) + 3)
    got = await_top(rnd.clock, top, host, seq, deadline)
    failed = isinstance(got, str) or got[0].type != "hosted" or got[0].fields.get("error")
    if failed:  # members may still be waiting for the top worker: release them
        for t in tasks:
            links[t.client].send(Message("abort", {"session": joins[t.client]}))
    join_errors = _joined(links, joins, rnd.timeout_s)
    if failed:
        why = got if isinstance(got, str) else str(got[0].fields.get("error", got[0].type))[:200]
        for t in tasks:
            lost[t.client] = f"top worker {host}: {why}"
        return [], None
    reply, up, arrived = got
    checked = _check_hosted(reply, tasks, expect, (bottom, server_part), arrived - sent_at)
    if isinstance(checked, str):
        for t in tasks:
            lost[t.client] = f"top worker {host}: rejected report: {checked}"
        return [], None
    average, server_state, report = checked
    if rnd.clock is not None:
        rnd.clock.reported()
    if report:
        steps = max(t.steps for t in tasks)
        tops, bottoms = rnd.moves["top part"], rnd.moves["bottom average"]
        tops.add(run.group, server_state, server_part, steps)
        bottoms.add(run.group, average, bottom, steps)
        moved = (tops.distance[run.group], bottoms.distance[run.group])
        rnd.hosted[run.group] = Hosted(host, tuple(report), *moved)
    dropped = reply.fields.get("dropped")
    for c, reason in (dropped if isinstance(dropped, dict) else {}).items():
        if c.isdigit() and int(c) in tokens:
            why = str(reason)[:200]
            lost[int(c)] = join_errors.get(int(c)) or f"dropped by top worker {host}: {why}"
    share = _ps_share(arrived - sent_at, reply, up, down, payload_bytes(host_msg), len(report))
    updates = []
    for t in tasks:
        if t.client not in report:
            lost.setdefault(t.client, f"top worker {host}: no report")
            continue
        stats = report[t.client]
        _fill_meter(rnd.meters[t.client], stats, share)
        updates.append(
            ClientUpdate(
                t.client, cut, run.group, stats["samples"], t.steps, average, stats["loss_sum"]
            )
        )
    return updates, server_state


def reject_outlying_tops(
    rnd: D2DRound,
    updates: list[ClientUpdate],
    server_states: dict[int, State],
    history: dict[str, PeerHistory],
    reference: ServerStep | None = None,
    direction: bool = False,
) -> list[ClientUpdate]:
    """The peer check across top workers, the server's rule for client updates
    (:class:`~splitfl.net.trust.checks.PeerHistory`: the round's median with 3 or more
    clusters, else
    the earlier rounds', else the server's own step on its held samples, ``reference``,
    :mod:`splitfl.net.trust.reference`): a top worker whose top part or bottom average moved
    more than
    ``peer_update_factor`` × that median (per local step), or whose move lies far from the
    round's median move (3 or more clusters: ``peer_spread_factor``,
    :mod:`splitfl.net.trust.spread`),
    is rejected. Its whole report goes:
    the top part (``server_states``, in place) and the bottom
    average it computed (the updates of its members, returned without them): both came from
    the one untrusted device, and the members trained against its top part. Each member is
    recorded as dropped with a reason that names the top worker (``top worker <w>: ...``, so
    ParallelSFL does not elect it next round). With ``direction`` (``network.trust:
    untrusted``), a top part or bottom average pointing against the round's median move (3 or
    more clusters) is rejected too (:mod:`splitfl.net.trust.direction`)."""
    hosted = rnd.hosted
    top_names = [k for g in hosted for k in server_states.get(g, {})]
    bottom_names = [k for u in updates if u.group in hosted for k in u.state]
    own = own_step(reference, top_names), own_step(reference, bottom_names)
    factor = rnd.bounds.peer_spread_factor
    spread = {kind: rnd.moves[kind].spread_outliers(factor, kind) for kind in rnd.moves}
    if direction:  # 3 or more clusters only: an honest top part's cosine with the server's
        # own step was -0.04 (the graph-split run of the tests), none to tell it by
        for kind, moves in rnd.moves.items():
            spread[kind] |= direction_outliers(moves.delta, None, rnd.bounds.min_cosine, kind)
    top = {g: h.top for g, h in hosted.items()}
    tops = history["top part"].outliers(top, "top part", own[0], spread["top part"])
    bottom = {g: h.bottom for g, h in hosted.items()}
    bottoms = history["bottom average"].outliers(
        bottom, "bottom average", own[1], spread["bottom average"]
    )
    rejected = spread["bottom average"] | spread["top part"] | bottoms | tops
    for g, why in rejected.items():
        server_states.pop(g, None)
        for c in hosted[g].members:
            rnd.lost[c] = f"top worker {hosted[g].host}: {why}"
    return [u for u in updates if u.group not in rejected]


def _joined(links, joins: dict[int, int], timeout_s: float) -> dict[int, str]:
    """Collect the members' ``joined`` replies; the errors they report."""
    deadline, errors = time.monotonic() + timeout_s, {}
    for c, seq in joins.items():
        got = await_reply(links[c], c, seq, deadline)
        if isinstance(got, str):
            errors[c] = got
        elif got[0].fields.get("error"):
            errors[c] = f"link to top worker: {got[0].fields['error']}"
    return errors


def _ps_share(rtt, reply, up, down, down_payload, members) -> dict[str, float]:
    """Each member's share of the top worker's model traffic with the server (the cost model
    splits it equally): time = round trip − the session, split by bytes."""
    session = reply.fields.get("session_s")
    session = min(float(session), rtt) if bounded(session, math.inf) else rtt
    comm, n = rtt - session, max(members, 1)
    return {
        "download_s": comm * down / max(up + down, 1) / n,
        "upload_s": comm * up / max(up + down, 1) / n,
        "model_down": down_payload / n,
        "model_up": payload_bytes(reply) / n,
        "wire_down": down / n,
        "wire_up": up / n,
    }


def _fill_meter(meter: Meter, stats: dict, share: dict[str, float]) -> None:
    for key in ("compute_s", "upload_s", "download_s", "server_s"):
        setattr(meter, key, getattr(meter, key) + stats[key])
    meter.upload_s += share["upload_s"]
    meter.download_s += share["download_s"]
    meter.wire_up += int(stats["wire_up"] + share["wire_up"])
    meter.wire_down += int(stats["wire_down"] + share["wire_down"])
    d2d = stats["payload"]
    meter.count("model_down", int(share["model_down"]))
    meter.count("model_up", int(share["model_up"]))
    meter.count("d2d_model", d2d.get("model_down", 0) + d2d.get("model_up", 0))
    meter.count("d2d_activations", d2d.get("activations_up", 0) + d2d.get("labels_up", 0))
    meter.count("d2d_gradients", d2d.get("gradients_down", 0))


#: Per-member numbers of a top worker's report (times in seconds, then bytes).
_TIMES = ("compute_s", "upload_s", "download_s", "server_s")
_BYTES = ("wire_up", "wire_down")


def _check_hosted(reply: Message, tasks, expect: Expect, sent: tuple[State, State], rtt: float):
    """(average bottom, top part, per-member stats) or what is wrong with the report: the
    parts against what was sent (``sent``: bottom, top; :func:`~splitfl.net.trust.check_state`),
    each member's loss, times (at most the round trip ``rtt``) and byte counts."""
    bottom, top = sent
    steps = {t.client: t for t in tasks}
    most = sum(t.steps for t in tasks) * len(tasks)  # top-part forwards: ≤ one per member-step
    server_state = state_from("server", reply.tensors)
    problem = check_state(server_state, state_specs(top), top, expect.bounds, most)
    if problem:
        return f"top part: {problem}"
    report, members = {}, reply.fields.get("members") or {}
    if not isinstance(members, dict):
        return "members is not an object"
    for key, stats in members.items():
        c = int(key) if str(key).isdigit() else -1
        if c not in steps or not isinstance(stats, dict):
            return f"bad member entry {str(key)[:40]!r}"
        t = steps[c]
        problem = loss_problem(
            stats.get("loss_sum"), stats.get("samples"), t.steps * t.batch_size, expect.bounds
        )
        if problem or not all(bounded(stats.get(k), rtt) for k in _TIMES):
            return f"member {c}: {problem or 'bad times'}"
        payload = stats.get("payload")
        counts = [stats.get(k) for k in _BYTES] + list((payload or {}).values())
        if not isinstance(payload, dict) or not all(bounded(v, MAX_BYTES) for v in counts):
            return f"member {c}: bad byte counts"
        report[c] = stats
    average = state_from("part", reply.tensors)
    if report:
        cut = tasks[0].cut
        most = max(t.steps for t in tasks)
        problem = check_state(average, expect.part_specs[cut], bottom, expect.bounds, most)
        if problem:
            return f"bottom part: {problem}"
    return average, server_state, report


def cluster_emulation(
    ctx, plan: RoundPlan, run: GroupRun, host: int, links: bool = True
) -> ClusterEmulation:
    """A hosted group's profiles for the plan's round: members compute at their FLOPS and
    reach the top worker at the D2D rate of the pair (both directions); the top worker
    computes the top part at its FLOPS."""
    r = plan.round_idx or 0
    top = ctx.population.at(host, r)
    members = {}
    for t in run.tasks:
        device = ctx.population.at(t.client, r)
        rate = d2d_rate(device, top) if links else UNSHAPED
        members[t.client] = Profile(device.flops, rate, rate, ctx.profile.device_flops(t.cut))
    cut = run.tasks[0].cut
    return ClusterEmulation(
        {c: p.to_fields() for c, p in members.items()}, top.flops, ctx.profile.server_flops(cut)
    )


def clusters_round(at: NetRound) -> Groups:
    """The group runner of :class:`~splitfl.core.topology.Clusters` plans
    (:data:`~splitfl.net.server.groups.NETWORKED_GROUPS`): a group ``Clusters.hosts`` names
    runs on its top worker (:func:`run_cluster`), any other on the server as a split family's."""
    hosts, plan = at.plan.topology.hosts, at.plan
    net = at.ctx.config.network
    factor, min_s = net.cluster_deadline_factor, net.round_deadline_min_s
    at.d2d.clock = ClusterClock(
        len(hosts), factor, min_s, slack_s=net.timeout_s, earlier=at.d2d.cluster_reports
    )

    def group(run: GroupRun):
        if run.group not in hosts:
            return at.split_group(run)
        host = hosts[run.group]
        emulation = cluster_emulation(at.ctx, plan, run, host, at.links) if at.emulate else None
        return run_cluster(at.d2d, run, host, plan, at.model, at.expect, emulation)

    relayed = frozenset(t.client for t in plan.tasks if t.group in hosts)
    return Groups(group, relayed)


NETWORKED_GROUPS[Clusters] = clusters_round

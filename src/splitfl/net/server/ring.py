"""The server's side of a networked RingSFL round (see :mod:`splitfl.net.server.clusters` for the
rules and :mod:`splitfl.net.device.ring` for the members' side).

A round that fails is abandoned (Alg. 2 needs every member in every step), and the member at
fault is named: the one whose device is not connected, was lost or went silent (no reply
within ``timeout_s`` of the abort the others answer), whose report was rejected, whose hop
a neighbour refused, or, at the round deadline (relative to the measured rounds, as for every
round: ``network.round_deadline_factor``), the one that answers the abort late. RingSFL
leaves it out of the next rounds' ring (:data:`~splitfl.core.plan.RING_MEMBER_FAILED`,
``options.ringsfl.exclude_rounds``).

Over 400 lines as one concept: one ring round on the server, from its commands to the member
it names (the peer check of the uploaded models and the stalled-after-ack naming are the
round's own verdicts on its members)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from splitfl.core.plan import RING_MEMBER_FAILED, RING_MEMBER_STALLED, ClientUpdate, RoundPlan
from splitfl.core.topology import Ring
from splitfl.models import BlockModel
from splitfl.net.device.emulation import UNSHAPED, Profile
from splitfl.net.server.clusters import D2DRound, send_command
from splitfl.net.server.groups import NETWORKED_ROUNDS, NetRound, WholeRound
from splitfl.net.server.lateness import LATE_START
from splitfl.net.server.remote_fleet import LATE, Meter
from splitfl.net.transport.auth import new_token, token_hash
from splitfl.net.transport.hub import LOST, DeviceLink
from splitfl.net.transport.wire import Message, payload_bytes, state_from, state_tensors
from splitfl.net.trust.checks import (
    MAX_BYTES,
    PeerHistory,
    bounded,
    check_state,
    loss_problem,
    state_specs,
)
from splitfl.net.trust.reference import ServerStep, server_step
from splitfl.net.trust.spread import RoundMoves
from splitfl.system.cost import d2d_rate


@dataclass(frozen=True)
class RingEmulation:
    """Emulated profiles of the ring: each member's ``emulate`` fields (FLOPS, server link
    rates, D2D rates to its successor ``d2d_next`` and predecessor ``d2d_prev``) and every
    block's per-sample forward+backward FLOPs."""

    members: dict[int, dict[str, float]]
    block_flops: list[float]


def run_ring(
    rnd: D2DRound,
    plan: RoundPlan,
    model: BlockModel,
    emulation: RingEmulation | None,
    reference: ServerStep | None | bool = None,
) -> list[ClientUpdate]:
    """One ring round: every member's blended model, or none (round abandoned). Each
    member's model is held against the others' and the server's own step (``reference``,
    :func:`peer_faults`; ``False``: not, ``network.trust: trusted``)."""
    ring = plan.topology.spec
    order = ring.order
    links = {c: rnd.hub.link_of(c) for c in order}
    missing = [c for c in order if links[c] is None or not links[c].peer_address]
    if missing:
        _abandon(rnd, order, dict.fromkeys(missing, "not connected (or not listening for peers)"))
        return []
    for c in order:
        rnd.meters[c].device = links[c].name
    tokens = {c: new_token() for c in order}  # the token of the edge *into* c
    names = {c: f"{rnd.tag}-ring-into-{c}" for c in order}
    global_state = state_tensors("model", model.state_dict())
    tasks = {t.client: t for t in plan.tasks}
    sent, began = {}, {}  # member → (seq, bytes, sent, payload); member → before the send
    for pos, c in enumerate(order):
        succ = order[(pos + 1) % len(order)]
        fields = {
            "order": order,
            "starts": [t.client for t in plan.tasks],  # the reference's order of batches
            "lengths": {str(k): v for k, v in ring.lengths.items()},
            "weights": {str(k): v for k, v in ring.weights.items()},
            "dynamic_lr": ring.dynamic_lr,
            "steps": {str(k): t.steps for k, t in tasks.items()},
            "batch_size": tasks[c].batch_size,
            "lr": tasks[c].lr,
            "round_seed": rnd.round_seed,
            "timeout_s": rnd.timeout_s,
            "expect": {"name": names[c], "token_hash": token_hash(tokens[c])},
            "next": {
                "address": links[succ].peer_address,
                "cert": links[succ].peer_cert,
                "name": names[succ],
                "token": tokens[succ],
            },
        }
        if emulation is not None:
            fields["emulate"] = emulation.members[c]
            fields["block_flops"] = emulation.block_flops
        msg = Message("ring", fields, dict(global_state))
        began[c] = time.perf_counter()  # before the send: the member may start while it runs
        sent[c] = (*send_command(links[c], c, msg), payload_bytes(msg))
    started: dict[int, float] = {}  # member → when its ring_started arrived
    replies, faults, cause = _collect(rnd, links, sent, max(t.steps for t in plan.tasks), started)
    if not faults and cause is None:
        faults = _check(replies, model, tasks, rnd.bounds, began)
    if not faults and cause is None and reference is not False:
        faults = peer_faults(replies, model, tasks, rnd.bounds, reference)
    late = late_starts(start_latency(sent, started, emulation), rnd.late_start_factor)
    if not faults and cause is not None:
        faults = late  # a failure naming no member (the deadline's abort): the late starter
    if faults or cause is not None:
        _abandon(rnd, order, faults, cause)
        return []
    rnd.late_starts = late  # the ring completed: their work is kept, the executor benches them
    updates = []
    for group, c in enumerate(order):
        reply, up, arrived = replies[c]
        _, down, sent_at, down_payload = sent[c]
        _meter(rnd.meters[c], reply, arrived - sent_at, up, down, down_payload)
        f = reply.fields
        state = state_from("model", reply.tensors)
        updates.append(
            ClientUpdate(
                c,
                model.num_blocks,
                group,
                f["samples"],
                tasks[c].steps,
                state,
                float(f["loss_sum"]),
            )
        )
    return updates


def _collect(rnd: D2DRound, links: dict[int, DeviceLink], sent: dict, steps: int, started: dict):
    """Every member's reply. On the first failure, or at the round deadline (``rnd.deadline``,
    relative to the measured rounds: :func:`~splitfl.net.server.executor.round_deadline`), the
    others are told to abort and have ``timeout_s`` more to answer. Returns (replies, faults,
    cause): ``faults`` names the members that failed — the device lost or silent (dead,
    stalled), what it sent refused by a neighbour (the reply's ``blame``), its reply an
    error, or, at the round deadline, an answer to the abort later than :data:`ANSWER_S`
    (busy with something else than waiting for its neighbours) — with why; ``cause`` is the
    failure where no member can be named. The members next to a failure report a lost link,
    a timeout or the abort: they are not blamed, and a reason that is none of these is
    preferred as the cause. Each finished member's arrival is its meter's ``finished_at``;
    ``started`` gets when each member is known to have started (``time.perf_counter``): its
    ``ring_started``'s arrival, or else its reply's (skipping the acknowledgement hides
    nothing)."""
    deadline = time.monotonic() + rnd.timeout_s * (steps + 3)
    replies, faults, reported = {}, {}, []
    pending, released, aborted = dict(sent), False, None

    def release() -> None:  # the others have timeout_s more to answer
        nonlocal released, deadline
        released = True
        for other, (seq, *_rest) in pending.items():
            links[other].send(Message("abort", {"session": seq}))
        deadline = min(deadline, time.monotonic() + rnd.timeout_s)

    while pending:
        if not released and rnd.deadline is not None and time.monotonic() >= rnd.deadline:
            aborted = time.monotonic()
            release()
        for c in list(pending):
            got = links[c].reply(c, pending[c][0], 0.05)
            if _acknowledged(got, pending[c][2], started, c):
                got = None  # it started: its reply is still to come (a flood still times out)
            if got is None and time.monotonic() < deadline:
                continue  # still running
            del pending[c]
            if got is not None and got is not LOST:  # started, at the latest, when it answered
                started.setdefault(c, got[2])
            if got is not None and got is not LOST and got[0].type == "ring_done":
                replies[c] = got
                rnd.meters[c].finished_at = time.monotonic()
                continue
            acked = c in started  # a silent member that acknowledged its command: hung
            _fault(c, got, links[c], sent, faults, reported, released, rnd.timeout_s, acked)
            if aborted is not None and c not in faults:
                _late_answer(c, time.monotonic() - aborted, faults, rnd)
            if not released:
                release()
    causes = [f for f in reported if " lost (" not in f and "aborted" not in f]
    cause = None if faults or not reported else (causes or reported)[0]
    if aborted is not None and not faults:  # the deadline, not the members' aborted reports
        cause = f"{LATE} (network.round_deadline_factor); every member answered the abort at once"
    return replies, faults, cause


#: At the round deadline: an honest member waiting for its neighbours answers the abort
#: within its 0.2 s poll (:meth:`~splitfl.net.device.ring._Member._next`) and a message's
#: trip; one that answers more than this many seconds after it was busy with something
#: else — the member holding the ring's progress. splitfl's choice (no paper has lateness).
ANSWER_S = 1.0


def _acknowledged(got, sent_at: float, started: dict[int, float], c: int) -> bool:
    """Whether ``got`` is member ``c``'s start acknowledgement (``ring_started`` with its
    command's seq); the first one's arrival is recorded, unless it arrived before the command
    was sent (a guessed seq): then the member counts as starting at its reply."""
    if got is None or got is LOST or got[0].type != "ring_started":
        return False
    if c not in started and got[2] >= sent_at:
        started[c] = got[2]
    return True


def start_latency(
    sent: dict, started: dict[int, float], emulation: RingEmulation | None
) -> dict[int, float]:
    """Each member known to have started (``started``, :func:`_collect`): the time from its
    ring command's send to its start (the server's clock), less the command's emulated
    download (wire bytes / the member's emulated downlink: an honest slow emulated link is
    not late)."""
    latency = {}
    for c, at in started.items():
        _, wire, sent_at, _ = sent[c]
        rate = float((emulation.members[c] if emulation else {}).get("downlink") or 0.0)
        latency[c] = at - sent_at - (wire / rate if rate > 0 else 0.0)
    return latency


def late_starts(latency: dict[int, float], factor: float) -> dict[int, str]:
    """The members slow to start the ring, with why: a start latency above both ``factor``
    (``network.round_deadline_factor``; 0: none) × the ring's lower median (in a ring of two:
    the other member's) and that median + :data:`ANSWER_S` (an honest member starts as the
    command arrives). A member late from the first round sets the measured ring round itself,
    so the round deadline cannot catch it (every member finishes with the ring); its start
    can. In a completed ring its work is kept and the executor benches it
    (``network.late_bench_rounds``); in a ring the deadline aborted without naming anyone, it
    is the one named (:func:`run_ring`)."""
    if not factor or len(latency) < 2:
        return {}
    median = sorted(latency.values())[(len(latency) - 1) // 2]  # lower: a ring of two's other
    limit = max(factor * median, median + ANSWER_S)
    return {
        c: (
            f"{LATE_START}: started the ring {t:.2g} s after its command, the ring's median "
            f"{median:.2g} s (above network.round_deadline_factor {factor:g} x it and "
            f"{ANSWER_S:g} s over it)"
        )
        for c, t in sorted(latency.items())
        if t > limit
    }


def _late_answer(c: int, after_s: float, faults: dict[int, str], rnd: D2DRound) -> None:
    """Name member ``c`` as at fault when it answered the round deadline's abort late."""
    if after_s > ANSWER_S:
        faults[c] = (
            f"{LATE}: answered the abort {after_s:.2g} s after it (network."
            f"round_deadline_factor; busy, not waiting for a neighbour)"
        )


def _fault(
    c, got, link, sent, faults, reported, released: bool, timeout_s: float, acked: bool = False
) -> None:
    """Record member ``c``'s failed reply ``got`` (None: none in time; LOST; a message);
    ``acked``: it acknowledged its command (:data:`~splitfl.core.plan.RING_MEMBER_STALLED`
    when it is then silent past the abort)."""
    if got is None:
        stalled = RING_MEMBER_STALLED if acked else "stalled"
        faults[c] = (
            f"no reply within {timeout_s:g} s of the abort ({stalled})"
            if released
            else "no reply within the round's deadline"
        )
    elif got is LOST:
        faults[c] = f"device {link.name} lost: {link.reason}"
    elif got[0].type != "ring_failed":
        faults[c] = str(got[0].fields.get("error", got[0].type))[:300]
    else:
        why = str(got[0].fields.get("reason", "ring_failed"))[:300]
        reported.append(why)
        blame = got[0].fields.get("blame")
        if isinstance(blame, int) and not isinstance(blame, bool) and blame in sent:
            if blame != c:
                faults.setdefault(blame, f"refused by {why}")


def _check(replies, model: BlockModel, tasks, bounds, began: dict[int, float]) -> dict:
    """What is wrong with the members' reports (member → problem): each one's loss, times (at
    most its round trip, timed from before the command's send: an honest member starts its
    clock once the command arrives, which may be before the server's send call returns),
    byte counts and blended model (against the global model,
    :mod:`splitfl.net.trust.checks`)."""
    state = model.state_dict()
    specs, steps = state_specs(state), sum(t.steps for t in tasks.values()) * len(tasks)
    faults = {}
    for c, (reply, _, arrived) in replies.items():
        f, t = reply.fields, tasks[c]
        most = t.steps * t.batch_size
        problem = loss_problem(f.get("loss_sum"), f.get("samples"), most, bounds)
        times = ("compute_s", "d2d_s", "session_s")
        payload = f.get("payload")
        counts = [f.get("d2d_wire")] + list((payload or {}).values())
        if problem or not all(bounded(f.get(k), arrived - began[c]) for k in times):
            faults[c] = f"bad ring report: {problem or 'times'}"
        elif not isinstance(payload, dict) or not all(bounded(v, MAX_BYTES) for v in counts):
            faults[c] = "bad payload counts"
        else:
            problem = check_state(state_from("model", reply.tensors), specs, state, bounds, steps)
            if problem:
                faults[c] = f"rejected model: {problem}"
    return faults


def peer_faults(
    replies, model: BlockModel, tasks, bounds, reference: ServerStep | None
) -> dict[int, str]:
    """The members whose uploaded model is out of line with the others' (issue 51: one
    member uploading ``global − 9.9 ‖global‖ · unit(update)``, inside the model-relative
    bound, left the run at chance for every round), with why: each member's move from the
    global model per local step is held against the ring's as a star round's updates are
    (:meth:`~splitfl.net.trust.spread.RoundMoves.outliers`: the spread and the norm against
    the members' median, 3 or more; fewer: the server's own step, ``reference``) and its
    direction (``network.bounds.min_cosine``: the members' median move, 3 or more). The
    round is then abandoned naming them, as for a rejected report. The norm history is the
    round's own (a ring round is the only update of its round)."""
    sent, moves = model.state_dict(), RoundMoves()
    for c, (reply, _, _) in replies.items():
        moves.add(c, state_from("model", reply.tensors), sent, tasks[c].steps)
    found = moves.outliers(
        PeerHistory(bounds.peer_update_factor),
        bounds.peer_spread_factor,
        "ring model",
        None if reference is None else reference.distance,
        None,  # a ring of 2: no direction (the server's step misjudged honest parts)
        bounds.min_cosine,
    )
    return dict(sorted(found.items()))


def _meter(meter: Meter, reply: Message, rtt: float, up: int, down: int, down_payload) -> None:
    """Compute and ring hops as the member measured them; the model's trip to and from the
    server = round trip − the session, split by bytes."""
    f = reply.fields
    session = min(float(f["session_s"]), rtt)
    comm = rtt - session
    meter.compute_s += float(f["compute_s"])
    meter.upload_s += float(f["d2d_s"]) + comm * up / max(up + down, 1)
    meter.download_s += comm * down / max(up + down, 1)
    meter.wire_up += up + int(f["d2d_wire"])
    meter.wire_down += down
    meter.count("model_down", down_payload)
    meter.count("model_up", payload_bytes(reply))
    for kind, nbytes in f["payload"].items():
        meter.count(str(kind), int(nbytes))


def _abandon(rnd: D2DRound, order, faults: dict[int, str], cause: str | None = None) -> None:
    """RingSFL's step needs every member: the round is abandoned for all of them. The members
    in ``faults`` are recorded as the ones that failed
    (:data:`~splitfl.core.plan.RING_MEMBER_FAILED`: RingSFL leaves them out of the next rounds'
    ring), the others as abandoned because of them (or because of ``cause``, where no member
    could be named)."""
    named = "; ".join(f"client {k} failed: {why}" for k, why in sorted(faults.items()))
    for c in order:
        if c in faults:
            rnd.lost[c] = f"{RING_MEMBER_FAILED}, ring round abandoned: {faults[c]}"
        else:
            rnd.lost[c] = f"ring round abandoned: {named or _unknown(cause)}"


def _unknown(cause: str | None) -> str:
    """The reason of a round whose failure names no member (the first report, which comes
    from a member that saw it: not blamed)."""
    return f"no member named as at fault (first report: {cause})"


def ring_emulation(ctx, plan: RoundPlan, links: bool = True) -> RingEmulation:
    """The ring's profiles for the plan's round: FLOPS, server link rates and the D2D rates
    to each member's successor and predecessor (the cost model's ``ring_client_cost``)."""
    r, order = plan.round_idx or 0, plan.topology.spec.order
    members = {}
    for pos, c in enumerate(order):
        device = ctx.population.at(c, r)
        nxt = ctx.population.at(order[(pos + 1) % len(order)], r)
        prv = ctx.population.at(order[pos - 1], r)
        up, down = (device.uplink, device.downlink) if links else (UNSHAPED, UNSHAPED)
        fields = Profile(device.flops, up, down, 0.0).to_fields()
        if links:
            fields |= {"d2d_next": d2d_rate(device, nxt), "d2d_prev": d2d_rate(device, prv)}
        members[c] = fields
    blocks = [ctx.profile.part_flops(k, k + 1) for k in range(ctx.profile.num_blocks)]
    return RingEmulation(members, blocks)


def ring_round(at: NetRound) -> WholeRound:
    """The whole-round runner of :class:`~splitfl.core.topology.Ring` plans
    (:data:`~splitfl.net.server.groups.NETWORKED_ROUNDS`): :func:`run_ring`; the members slow
    to start are recorded for lateness (benched, their work kept)."""
    emulation = ring_emulation(at.ctx, at.plan, at.links) if at.emulate else None
    trusted = at.ctx.config.network.trust == "trusted"
    reference = False if trusted else server_step(at.ctx, at.model, at.plan)
    updates = run_ring(at.d2d, at.plan, at.model, emulation, reference)
    return WholeRound(updates, {}, (list(at.plan.topology.spec.order), at.d2d.late_starts))


NETWORKED_ROUNDS[Ring] = ring_round

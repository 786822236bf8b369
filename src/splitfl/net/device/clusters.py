"""A device's side of device-to-device sessions.

The server's side: :mod:`splitfl.net.server.clusters`.

Three commands, each one whole session with one reply at its end:

* ``host`` — this client is a ParallelSFL **top worker** (§3.3): it receives its cluster's
  bottom part and top part from the server, expects the members' links on its peer listener,
  runs the cluster's split loop itself (its topology family's schedule over a
  :class:`~splitfl.net.server.remote_fleet.RemoteFleet` of its peers, the top part in a
  :class:`~splitfl.roles.sides.ServerRole`: Eq. 2–3), averages the members' bottom parts
  (Eq. 4) and replies ``hosted`` with the average, the top part and each member's tally and
  measured times.
* ``join`` — this client is a **bottom worker**: it connects to its top worker's listener and
  answers its commands (the same ``begin``/``forward``/``backward``/``finish`` as from the
  server) until the top says bye; replies ``joined``
  (:func:`splitfl.net.device.session.join_cluster`: it reuses the connection loop).
* ``ring`` — this client is a **RingSFL ring member** (:mod:`splitfl.net.device.ring`).

Peers authenticate with one-round tokens the server hands out over its own authenticated links;
every tensor a peer sends is checked before use (the same checks as the server's).
"""

from __future__ import annotations

import copy
import time

import numpy as np

from splitfl.aggregation.robust import Rule, robust_average
from splitfl.core import plan_codec
from splitfl.core.plan import RoundPlan
from splitfl.core.seeding import derive_seed
from splitfl.net.device.emulation import Profile
from splitfl.net.device.ring import ring_session
from splitfl.net.server.remote_fleet import Meter, RemoteFleet, TimedServer
from splitfl.net.transport.wire import Message, state_from, state_tensors
from splitfl.net.trust.checks import REFERENCE_SAMPLES, PeerHistory
from splitfl.net.trust.expect import expect_for
from splitfl.roles.fleet import GroupRun, server_role
from splitfl.topologies import family_of


def host_cluster(agent, c: int, msg: Message) -> Message:
    """``host``: run the cluster's split loop as its top worker (see module docstring)."""
    started = time.perf_counter()
    if agent.peer is None:
        return Message("hosted", {"error": "this device does not listen for peers"})
    names = {m["name"]: m["token_hash"] for m in msg.fields["members"]}
    agent.peer.hub.expect(names)
    try:
        updates, server, meters, lost = _run_cluster(agent, msg)
    except Exception as err:  # noqa: BLE001 (reported to the server, which drops the cluster)
        return Message("hosted", {"error": f"{type(err).__name__}: {err}"})
    finally:
        agent.peer.hub.forget(names)
    tensors = state_tensors("server", server.state())
    if updates:  # Eq. (4): the top worker averages its members' bottom parts
        bottom = state_from("part", msg.tensors)
        # the server's rule (untrusted: robust); fltrust needs the server's root-data step,
        # which a top worker has not: robust_average centre-clips instead (aggregation/robust)
        rule = Rule.of_run(agent.config)
        states = [u.state for u in updates]
        average = robust_average(states, [1.0] * len(updates), rule, reference=bottom)
        tensors.update(state_tensors("part", average))
    report = {
        str(u.client): {"samples": u.samples, "loss_sum": u.loss_sum, **_meter(meters[u.client])}
        for u in updates
    }
    fields = {"members": report, "dropped": {str(k): v for k, v in lost.items()}}
    fields["session_s"] = time.perf_counter() - started
    return Message("hosted", fields, tensors)


def _run_cluster(agent, msg: Message):
    """The cluster's split loop on this top worker: (updates, server role, meters, lost)."""
    f, members = msg.fields, msg.fields["members"]
    plan = plan_codec.decode(f["plan"], state_from("plan", msg.tensors), RoundPlan)
    tasks = plan.tasks
    if [t.client for t in tasks] != [m["client"] for m in members]:
        raise ValueError("the hosted plan's tasks are not the cluster's members")
    if any(t.group != f["group"] for t in tasks):
        raise ValueError(f"the hosted plan's tasks are not all of group {f['group']}")
    model = copy.deepcopy(agent.model)
    bottom, top = state_from("part", msg.tensors), state_from("server", msg.tensors)
    model.load_state_dict({**bottom, **top})
    model.train()
    timeout = float(f["timeout_s"])
    agent.peer.hub.wait_clients([t.client for t in tasks], timeout)
    meters = {t.client: Meter() for t in tasks}
    lost: dict[int, str] = {}
    profiles = None
    if all(m.get("emulate") for m in members):
        profiles = {m["client"]: Profile.from_fields(m["emulate"]) for m in members}
    x, y = next(iter(agent.data.samples.values()))[:2]
    cuts, bounds = sorted({t.cut for t in tasks}), agent.config.network.bounds
    expect = expect_for(model, x[:REFERENCE_SAMPLES], agent.data.num_classes, cuts, y[:1], bounds)
    fleet = RemoteFleet(agent.peer.hub, f["round_seed"], timeout, expect, meters, lost, profiles)
    gen = np.random.default_rng(derive_seed(f["round_seed"], "mix"))
    server = server_role(model, tasks, plan, agent.config.train, agent.runtime, gen)
    if server is None:
        raise ValueError("a hosted group needs a server part (cut < number of blocks)")
    emulate = None
    if f.get("top_flops"):
        per_sample = float(f["server_flops_per_sample"])
        emulate = (lambda cut: per_sample, float(f["top_flops"]))
    run = GroupRun(f["group"], tasks, {t.client: bottom for t in tasks}, {})
    updates = family_of(plan).schedule(fleet, TimedServer(server, meters, emulate), run, plan)
    history = PeerHistory(bounds.peer_update_factor)  # the round's alone: no earlier rounds
    outliers = fleet.moves.outliers(history, bounds.peer_spread_factor)  # as the server's
    lost.update(outliers)
    return [u for u in updates if u.client not in outliers], server, meters, lost


def _meter(m: Meter) -> dict:
    return {
        "compute_s": m.compute_s,
        "upload_s": m.upload_s,
        "download_s": m.download_s,
        "server_s": m.server_s,
        "wire_up": m.wire_up,
        "wire_down": m.wire_down,
        "payload": dict(m.payload),
    }


def ring_member(agent, c: int, msg: Message) -> Message:
    """``ring``: this client's part of RingSFL's ring for the round, told to the server as
    started first (``ring_started``: the server names a member slow to start,
    :func:`~splitfl.net.server.ring.late_starts`)."""
    if agent.peer is None:
        return Message("ring_failed", {"reason": "this device does not listen for peers"})
    seq = msg.fields.get("seq")
    agent.notify(Message("ring_started", {"client": c, "seq": seq}))  # the server times it
    return ring_session(agent, c, msg, agent.abort_event(seq))

"""The networked executor: the server's side of a round over real device processes.

``executor: networked`` runs the same :class:`~splitfl.core.plan.RoundPlan` as the in-process
executors, with the same schedule (its topology family's, :mod:`splitfl.topologies`) and
:class:`~splitfl.roles.sides.ServerRole`, but each client's device part lives in a device
process reached through the :class:`~splitfl.net.transport.hub.Hub`
(:class:`~splitfl.net.server.remote_fleet.RemoteFleet`). Groups run concurrently (one thread
each; the server copies are independent), except with LocFedMix-SL's mixup, whose pairs are
drawn from one per-round stream in group order. The result carries what was measured
(:class:`~splitfl.net.server.remote_fleet.Meter` per client, the round's wall time) and the
clients that were lost, with the reason.
"""

from __future__ import annotations

import copy
import itertools
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from splitfl.config import ExperimentConfig
from splitfl.core.allocator import keep_freed_memory
from splitfl.core.plan import ClientUpdate, RoundPlan, RoundResult
from splitfl.core.seeding import derive_seed
from splitfl.core.topology import Clusters, Ring
from splitfl.models import BlockModel
from splitfl.net.device.emulation import Profile
from splitfl.net.server import ushaped  # noqa: F401  (registers its NETWORKED_GROUPS runner)
from splitfl.net.server.client_data import RemoteClientData
from splitfl.net.server.clusters import (
    ClusterEmulation,
    D2DRound,
    reject_outlying_tops,
    run_cluster,
)
from splitfl.net.server.groups import NETWORKED_GROUPS, NetRound
from splitfl.net.server.lateness import LateClients
from splitfl.net.server.remote_fleet import LATE, Meter, RemoteFleet, TimedServer
from splitfl.net.server.ring import RingEmulation, run_ring
from splitfl.net.server.session import NetworkSession
from splitfl.net.trust.checks import REFERENCE_SAMPLES, PeerHistory, PeerScale
from splitfl.net.trust.expect import Expect, expect_for
from splitfl.net.trust.reference import ServerStep, own_step
from splitfl.net.trust.spread import RoundMoves
from splitfl.roles.aux_numerics import spec_flops
from splitfl.roles.fleet import GroupRun, server_role
from splitfl.roles.sides import Runtime
from splitfl.system.cost import d2d_rate
from splitfl.topologies import family_of


class NetworkedExecutor:
    """Runs plans on device processes; :meth:`open`/:meth:`close` bracket the run."""

    def __init__(self, config: ExperimentConfig, device: str = "cpu"):
        self.config = config
        self.runtime = Runtime(torch.device(device), config.precision, config.channels_last)
        self.session: NetworkSession | None = None
        self._rounds = itertools.count()
        #: each client's time to its finished update in the last round it was contacted (at
        #: the deadline, censored, if it was late): the round deadline is relative to the
        #: median over a round's clients, benched ones included (else a slow device, once
        #: benched, would meet a deadline set by the fast ones alone)
        self._client_s: dict[int, float] = {}
        self._deadline: float | None = None
        #: seconds :meth:`reachable` waited for devices before this round was planned
        self._waited: float | None = None
        #: the run's accepted smashed-data scales (the peer RMS check, across rounds)
        b = config.network.bounds
        self._peers = PeerScale(b.activation_rms_factor, b.activation_rms_abs)
        #: the run's accepted update distances (the peer update check, across rounds)
        parts = ("model update", "top part", "bottom average")
        self._updates = {what: PeerHistory(b.peer_update_factor) for what in parts}
        #: clients dropped for lateness, left out of the next rounds (network.late_bench_rounds)
        self._late = LateClients(config.network.late_bench_rounds)
        self._next_round = 0  # the run's round planned next (from 0): whom reachable() benches
        #: per-sample FLOPs of each auxiliary model the plans named (emulation)
        self._aux_cost: dict = {}

    def open(self, ctx, run_dir: Path) -> None:
        """Start listening (and the local device processes, if any) and wait for devices."""
        keep_freed_memory()  # each batch's message buffers reuse the last one's pages
        own = self.config.data.source == "devices"
        data = {
            "input_shape": list(ctx.bundle.input_shape),
            "num_classes": int(ctx.bundle.num_classes),
            "own": own,
            # a crop's padding value in the stored inputs (own-data devices pad as the server)
            "black": list(ctx.bundle.black) if ctx.bundle.black else None,
            "histogram_epsilon": self.config.network.histogram_epsilon,
        }
        self.session = NetworkSession(self.config, ctx.num_clients, run_dir, data)
        self.session.start()
        if own:  # computations on a client's own samples (IFCA's identity) run on its device
            ctx.client_compute = RemoteClientData(self.session.hub, self.config.network.timeout_s)
        ctx.reachable = self.reachable  # RingSFL forms its ring of these

    def reachable(self) -> set[int]:
        """The clients whose device is connected, once lost devices have had up to
        ``network.rejoin_s`` to come back (as before a round), but those benched for lateness
        in the coming round (a RingSFL member slow to start); none before :meth:`open`."""
        if self.session is None or self.session.hub is None:
            return set()
        started = time.perf_counter()
        self.session.wait_ready()
        self._waited = time.perf_counter() - started  # the round's wait: not waited again
        hub, late = self.session.hub, self._late.sit_out
        return {
            c
            for c in range(hub.num_clients)
            if hub.link_of(c) is not None and not late.out(c, self._next_round)
        }

    def announced(self) -> dict:
        """``data.source: devices``: client → what its device announced at join."""
        return dict(self.session.hub.announced)

    def close(self) -> None:
        if self.session is not None:
            self.session.stop()
            self.session = None

    def run_round(
        self, ctx, global_state: dict[str, torch.Tensor], plan: RoundPlan, round_seed: int
    ) -> RoundResult:
        if self.session is None:
            raise RuntimeError("NetworkedExecutor.open() was not called")
        waited, self._waited = self._waited, None
        if waited is None:
            waited = time.perf_counter()
            self.session.wait_ready()  # up to network.rejoin_s: part of the round's wall time
            waited = time.perf_counter() - waited
        model: BlockModel = copy.deepcopy(ctx.model).to(self.runtime.device)
        model.load_state_dict(global_state)
        model.train()
        meters = {t.client: Meter() for t in plan.tasks}
        lost: dict[int, str] = {}
        number = next(self._rounds)
        tag = f"r{plan.round_idx}-{number}"
        r = number if plan.round_idx is None else plan.round_idx  # the run's round, from 0
        net = self.config.network
        rnd = D2DRound(self.session.hub, tag, round_seed, net.timeout_s, meters, lost, net.bounds)
        began = time.monotonic()
        known = [self._client_s[t.client] for t in plan.tasks if t.client in self._client_s]
        self._deadline = round_deadline(net, float(np.median(known)) if known else None, began)
        start = time.perf_counter()
        on_server: list[int] = []  # the clients the server itself contacts (lateness)
        hosts = plan.topology.hosts if isinstance(plan.topology, Clusters) else {}
        if isinstance(plan.topology, Ring):
            emulation = ring_emulation(ctx, plan, net.emulate_links) if net.emulate else None
            rnd.deadline, rnd.late_start_factor = self._deadline, net.round_deadline_factor
            updates, server_states = run_ring(rnd, plan, model, emulation), {}
            self._late.record(r, plan.topology.spec.order, rnd.late_starts)  # benched, work kept
        else:
            on_server = [t.client for t in plan.tasks if t.group not in hosts]
            lost.update(self._late.benched(r, on_server))  # not contacted this round
            updates, server_states, moves = self._groups(ctx, model, plan, rnd)
            own = server_step(ctx, model, plan)
            updates = reject_outlying_tops(rnd, updates, server_states, self._updates, own)
            checked = moves.distance
            names = own_step(own, [k for u in updates if u.client in checked for k in u.state])
            history, factor = self._updates["model update"], net.bounds.peer_spread_factor
            outliers = moves.outliers(history, factor, reference=names)
            updates = [u for u in updates if u.client not in outliers]
            lost.update(outliers)
        wall = time.perf_counter() - start
        for c, m in meters.items():  # the next deadlines: when these clients finished
            if m.finished_at and c not in lost:
                self._client_s[c] = m.finished_at - began
            elif lost.get(c, "").startswith(LATE):  # censored: finishing at the deadline
                self._client_s[c] = self._deadline - began
        self._late.record(r, on_server, lost)
        self._next_round = r + 1
        return RoundResult(
            updates=updates,
            server_states=server_states,
            measured_time={c: m.busy_s for c, m in meters.items() if c not in lost},
            measured_bytes={c: m.wire_up + m.wire_down for c, m in meters.items()},
            measured={c: measured_fields(m, wall) for c, m in meters.items()},
            dropped=dict(sorted(lost.items())),
            measured_round_time=waited + wall,
            devices={c: m.device for c, m in meters.items() if m.device and c not in lost},
            events=[f"ring member {c} {why}" for c, why in rnd.late_starts.items()],
        )

    def _aux_flops(self, plan: RoundPlan, model: BlockModel) -> float:
        """Per-sample FLOPs of the plan's auxiliary model (0 without one), measured once per
        auxiliary model: the emulation charges them on the device, as the cost model does."""
        if plan.aux is None:
            return 0.0
        if plan.aux not in self._aux_cost:
            self._aux_cost[plan.aux] = spec_flops(plan.aux, next(model.parameters()).dtype)
        return self._aux_cost[plan.aux]

    def _groups(self, ctx, model: BlockModel, plan: RoundPlan, rnd: D2DRound):
        """Every group of a parameter-server plan, concurrently: on the server, or on the
        device ``Clusters.hosts`` names (device-to-device,
        :func:`~splitfl.net.server.clusters.run_cluster`). Returns the updates, the server-side
        copies and each server-checked update's move from the part it was sent
        (:class:`~splitfl.net.trust.spread.RoundMoves`: the peer checks). A payload with a
        round runner in :data:`~splitfl.net.server.groups.NETWORKED_GROUPS` (U-shaped split
        learning) runs its groups with it instead."""
        expect = expectations(ctx, model, plan)
        gen = np.random.default_rng(derive_seed(rnd.round_seed, "mix"))
        emulate = self.config.network.emulate
        links = self.config.network.emulate_links
        profiles = None
        if emulate:
            profiles = emulated_profiles(ctx, plan, links, self._aux_flops(plan, model))
        server_emulation, moves, peers = None, RoundMoves(), self._peers
        if profiles is not None:
            server_emulation = (ctx.profile.server_flops, ctx.population.server.flops)

        hosts = plan.topology.hosts if isinstance(plan.topology, Clusters) else {}
        family = family_of(plan)

        def fleet_of(cls=RemoteFleet, **extra) -> RemoteFleet:
            return cls(
                rnd.hub,
                rnd.round_seed,
                rnd.timeout_s,
                expect,
                rnd.meters,
                rnd.lost,
                profiles,
                moves,
                self._deadline,
                peers,
                plan.aux,
                plan.device_loss,
                **extra,
            )

        # a payload with its own networked groups (NETWORKED_GROUPS, net/server/groups.py)
        runner, own = NETWORKED_GROUPS.get(type(plan.topology)), None
        if runner is not None:
            own = runner(NetRound(ctx, model, plan, self.runtime, rnd.meters, fleet_of, emulate))

        def group(run: GroupRun):
            if own is not None:
                return own(run)
            if run.group in hosts:
                host = hosts[run.group]
                emulation = cluster_emulation(ctx, plan, run, host, links) if emulate else None
                return run_cluster(rnd, run, host, plan, model, expect, emulation)
            server = server_role(model, run.tasks, plan, ctx.config.train, self.runtime, gen)
            timed = None if server is None else TimedServer(server, rnd.meters, server_emulation)
            updates = family.schedule(fleet_of(), timed, run, plan)
            return updates, None if server is None else server.state()

        runs = family.units(model, plan)
        spec = plan.topology.server
        if (spec is not None and spec.mixup) or len(runs) == 1:
            done = [group(run) for run in runs]
        else:
            with ThreadPoolExecutor(max_workers=len(runs)) as pool:
                done = list(pool.map(group, runs))
        updates: list[ClientUpdate] = [u for group_updates, _ in done for u in group_updates]
        server_states = {
            run.group: state
            for run, (_, state) in zip(runs, done, strict=True)
            if state is not None
        }
        return updates, server_states, moves


def round_deadline(net, median_client_s: float | None, began: float) -> float | None:
    """When this round's clients must be done (``time.monotonic()``): ``round_deadline_factor``
    × the median over the round's clients of each one's time from its round's start to its
    finished update, in the last round it was contacted (clients run one after another count
    their wait: a chain's deadline grows with it), at least ``round_deadline_min_s``, after
    ``began``; None before any was measured or with the factor 0. A late client counts as
    finishing at the deadline, so a staller cannot stretch the next deadline."""
    if not net.round_deadline_factor or median_client_s is None:
        return None
    return began + max(net.round_deadline_factor * median_client_s, net.round_deadline_min_s)


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


#: The link rate sent when links are not emulated (``network.emulate_links: false``): a
#: transfer held for bytes / 1e18 s is no hold at all.
UNSHAPED = 1e18


def emulated_profiles(
    ctx, plan: RoundPlan, links: bool = True, aux_flops: float = 0.0
) -> dict[int, Profile]:
    """Each task's device profile for the plan's round and its part's per-sample FLOPs (plus
    ``aux_flops``, the auxiliary model's, for a split task of an auxiliary plan)."""
    r = plan.round_idx or 0
    out = {}
    for t in plan.tasks:
        device = ctx.population.at(t.client, r)
        flops = ctx.profile.device_flops(t.cut)
        flops += aux_flops if t.cut < ctx.profile.num_blocks else 0.0
        up, down = (device.uplink, device.downlink) if links else (UNSHAPED, UNSHAPED)
        out[t.client] = Profile(device.flops, up, down, flops)
    return out


def expectations(ctx, model: BlockModel, plan: RoundPlan) -> Expect:
    """What valid device replies look like for ``plan``'s cut points (the activation bound
    relative to the global part on the first :data:`REFERENCE_SAMPLES` test samples: the
    server holds those whatever the devices hold)."""
    cuts = sorted({t.cut for t in plan.tasks})
    test = ctx.bundle.test  # the server may hold no training data (data.source: devices)
    sample, bounds = test.x[:REFERENCE_SAMPLES], ctx.config.network.bounds
    return expect_for(model, sample, ctx.bundle.num_classes, cuts, test.y[:1], bounds)


def server_step(ctx, model: BlockModel, plan: RoundPlan) -> ServerStep | None:
    """The server's own step on its first ``network.bounds.reference_samples`` test samples
    (:mod:`splitfl.net.trust.reference`; None with 0 or no tasks), at the round's learning rate and
    local steps (its most): trained only if a peer check has no median to use."""
    n = ctx.config.network.bounds.reference_samples
    if not n or not plan.tasks:
        return None
    test = ctx.bundle.test
    steps = max(t.steps for t in plan.tasks)
    return ServerStep(model, (test.x[:n], test.y[:n]), ctx.config.train, plan.tasks[0].lr, steps)


def measured_fields(m: Meter, wall: float) -> dict[str, float]:
    """A client's measured round as metrics-row numbers (seconds, bytes)."""
    return {
        "compute_s": m.compute_s,
        "upload_s": m.upload_s,
        "download_s": m.download_s,
        "server_s": m.server_s,
        "busy_s": m.busy_s,
        "wait_s": max(wall - m.busy_s, 0.0),
        "wire_up": m.wire_up,
        "wire_down": m.wire_down,
        **{f"payload_{k}": v for k, v in m.payload.items()},
    }

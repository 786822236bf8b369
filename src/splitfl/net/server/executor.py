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

One concept over ~400 lines: the executor's round and the state it checkpoints (deadlines,
lateness, peer windows) for an exact ``--resume``; the fleet, the ring and the clusters are
their own modules.
"""

from __future__ import annotations

import copy
import itertools
import math
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from splitfl.aggregation.robust import Rule
from splitfl.config import ExperimentConfig
from splitfl.core.allocator import keep_freed_memory
from splitfl.core.plan import ClientUpdate, RoundPlan, RoundResult
from splitfl.core.seeding import derive_seed
from splitfl.models import BlockModel
from splitfl.net.device.emulation import UNSHAPED, Profile
from splitfl.net.server import ring, ushaped  # noqa: F401  (they register their runners)
from splitfl.net.server.client_data import RemoteClientData
from splitfl.net.server.clusters import D2DRound, reject_outlying_tops
from splitfl.net.server.groups import NETWORKED_GROUPS, NETWORKED_ROUNDS, Groups, NetRound
from splitfl.net.server.lateness import LateClients
from splitfl.net.server.remote_fleet import LATE, Meter, RemoteFleet, TimedServer
from splitfl.net.server.session import NetworkSession
from splitfl.net.server.stalls import StallClock
from splitfl.net.trust.checks import REFERENCE_SAMPLES, PeerHistory, PeerScale
from splitfl.net.trust.expect import Expect, expect_for
from splitfl.net.trust.reference import ServerStep, server_step
from splitfl.net.trust.spread import RoundMoves
from splitfl.roles.aux_numerics import spec_flops
from splitfl.roles.cut_record import tap_of
from splitfl.roles.fleet import GroupRun, server_role
from splitfl.roles.sides import Runtime
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
        #: ParallelSFL: the accepted cluster reports' times of the run so far (seconds after
        #: their round's start; :mod:`splitfl.net.server.cluster_deadline`)
        self._cluster_reports: list[float] = []
        self._deadline: float | None = None
        self._began: float | None = None  # when (time.monotonic()) the round began
        #: seconds :meth:`reachable` waited for devices before this round was planned
        self._waited: float | None = None
        #: the run's accepted smashed-data scales (the peer RMS check, across rounds) and
        #: accepted update distances (the peer update check, across rounds)
        self._peers, self._updates = self._peer_windows()
        #: clients dropped for lateness, left out of the next rounds (network.late_bench_rounds)
        self._late = LateClients(config.network.late_bench_rounds)
        self._next_round = 0  # the run's round planned next (from 0): whom reachable() benches
        #: per-sample FLOPs of each auxiliary model the plans named (emulation)
        self._aux_cost: dict = {}
        #: the server process's own stalls (:mod:`splitfl.net.server.stalls`): excluded from
        #: the clients' lateness; runs between :meth:`open` and :meth:`close`
        self._stalls: StallClock | None = None

    def _peer_windows(self) -> tuple[PeerScale, dict[str, PeerHistory]]:
        """Empty peer windows under ``network.bounds``: the smashed-data scales and the
        update histories of each checked part."""
        b = self.config.network.bounds
        parts = ("model update", "top part", "bottom average")
        peers = PeerScale(b.activation_rms_factor, b.activation_rms_abs)
        return peers, {what: PeerHistory(b.peer_update_factor) for what in parts}

    def state_dict(self) -> dict:
        """What judges the run's next rounds and must outlive the server process (checkpointed
        with each round, restored by ``splitfl server --resume``; plain numbers): each
        client's time to its update in its last contacted round (the round deadline), the
        accepted ParallelSFL cluster reports' times (a lone cluster's deadline,
        :mod:`~splitfl.net.server.cluster_deadline`), who sits out for lateness, the
        round planned next (whom :meth:`reachable` benches) and the peer windows: the accepted
        smashed-data RMS per cut, tensor and step (``peer_scale``,
        :class:`~splitfl.net.trust.checks.PeerScale`) and the accepted update distances per
        kind (``peer_history``, :class:`~splitfl.net.trust.checks.PeerHistory`), so that a
        resumed server holds a lone client or a round of two to the rounds before its restart
        as the uninterrupted run would (issue 51). Strict JSON: string keys, lists, finite
        floats and ints."""
        return {
            "client_s": {str(c): s for c, s in self._client_s.items()},
            "cluster_reports": list(self._cluster_reports),
            "late": self._late.sit_out.state_dict(),
            "next_round": self._next_round,
            "peer_scale": self._peers.state_dict(),
            "peer_history": {what: h.state_dict() for what, h in self._updates.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        """What :meth:`state_dict` returned (a checkpoint's): times must be finite and ≥ 0,
        the peer windows well formed (:meth:`PeerScale.load_state_dict
        <splitfl.net.trust.checks.PeerScale.load_state_dict>`, loaded whole or not at all); a
        checkpoint written before they were kept leaves them empty. Raises ValueError naming
        the malformed field."""
        times = [float(s) for s in state.get("client_s", {}).values()]
        reports = [float(s) for s in state.get("cluster_reports", [])]
        if not all(math.isfinite(t) and t >= 0 for t in times + reports):
            raise ValueError("the networked executor's checkpointed times must be finite, >= 0")
        histories = state.get("peer_history", {})
        if not isinstance(histories, dict) or not set(histories) <= set(self._updates):
            raise ValueError(f"peer_history: not a dict of {', '.join(self._updates)}")
        peers, updates = self._peer_windows()
        peers.load_state_dict(state.get("peer_scale", []))
        for what, history in updates.items():
            history.load_state_dict(histories.get(what, []), f"peer_history[{what!r}]")
        self._peers, self._updates = peers, updates
        self._client_s = {int(c): float(s) for c, s in state.get("client_s", {}).items()}
        self._cluster_reports[:] = reports
        self._late.sit_out.load_state_dict(state.get("late", {}))
        self._next_round = int(state.get("next_round", 0))

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
        self._stalls = StallClock().start()
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
        if self._stalls is not None:
            self._stalls.stop()
            self._stalls = None
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
        rnd.cluster_reports = self._cluster_reports
        began = self._began = time.monotonic()
        known = [self._client_s[t.client] for t in plan.tasks if t.client in self._client_s]
        self._deadline = round_deadline(net, float(np.median(known)) if known else None, began)
        start = time.perf_counter()
        emulate, links = net.emulate, net.emulate_links
        at = NetRound(ctx, model, plan, self.runtime, meters, emulate, links, rnd)
        whole = NETWORKED_ROUNDS.get(type(plan.topology))
        on_server: list[int] = []  # the clients the server itself contacts (lateness)
        own = None if net.trust == "trusted" else server_step(ctx, model, plan)
        if whole is not None:  # the members run the round (the ring)
            rnd.deadline, rnd.late_start_factor = self._deadline, net.round_deadline_factor
            done = whole(at)
            updates, server_states = done.updates, done.server_states
            self._late.record(r, *done.late)  # benched, work kept
        else:
            moves = self._equip(at)
            runner = NETWORKED_GROUPS.get(type(plan.topology))
            groups = Groups(at.split_group) if runner is None else runner(at)
            on_server = [t.client for t in plan.tasks if t.client not in groups.relayed]
            lost.update(self._late.benched(r, on_server))  # not contacted this round
            updates, server_states = run_groups(family_of(plan), model, plan, groups)
            if net.trust != "trusted":  # a lab fleet: the magnitude checks only
                updates = self._peer_checked(own, rnd, moves, updates, server_states)
        # fltrust's g_0, every untrusted round (inside the round's wall: the measured clock
        # charges it as the server's other work)
        server_move = self._server_move(own, global_state)
        wall = time.perf_counter() - start
        for c, m in meters.items():  # the next deadlines: when these clients finished
            if m.finished_at and c not in lost:  # the client's own time: the server's excluded
                stalled = self._stalls.since(began) if self._stalls else 0.0
                self._client_s[c] = max(m.finished_at - began - stalled - m.held_s, 0.0)
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
            server_move=server_move,
        )

    def _server_move(self, own: ServerStep | None, global_state) -> dict | None:
        """The server's own step over the model's parameters (``RoundResult.server_move``,
        FLTrust's ``g_0``) where the run aggregates with ``fltrust``, else None (``own`` is
        None for a trusted fleet, a plan without tasks, or no ``reference_samples``, which
        the validation refuses with ``fltrust``)."""
        if own is None or Rule.of_run(self.config).name != "fltrust":
            return None
        return own.move(global_state)

    def _peer_checked(self, own, rnd, moves: RoundMoves, updates, server_states):
        """The round's updates but those the checks against peers and against the server's
        own step reject (ParallelSFL's top workers, then each update: the spread, the
        direction — FLTrust's cosine, :mod:`splitfl.net.trust.direction` — and the norm),
        which are recorded in ``rnd.lost`` with their reasons."""
        b = self.config.network.bounds
        updates = reject_outlying_tops(rnd, updates, server_states, self._updates, own, True)
        history, names = self._updates["model update"], None if own is None else own.distance
        toward = None if own is None else own.move
        outliers = moves.outliers(
            history,
            b.peer_spread_factor,
            reference=names,
            toward=toward,
            min_cosine=b.min_cosine,
            floor=b.peer_update_floor,
            small_round_min_cosine=b.small_round_min_cosine,
        )
        rnd.lost.update(outliers)
        return [u for u in updates if u.client not in outliers]

    def _aux_flops(self, plan: RoundPlan, model: BlockModel) -> float:
        """Per-sample FLOPs of the plan's auxiliary model (0 without one), measured once per
        auxiliary model: the emulation charges them on the device, as the cost model does."""
        if plan.aux is None:
            return 0.0
        if plan.aux not in self._aux_cost:
            self._aux_cost[plan.aux] = spec_flops(plan.aux, next(model.parameters()).dtype)
        return self._aux_cost[plan.aux]

    def _equip(self, at: NetRound) -> RoundMoves:
        """Give ``at`` what group runners use: ``fleet`` (a new :class:`RemoteFleet` of the
        round), ``expect`` and ``split_group`` (a group on the server, its family's schedule
        over a fleet). Returns the round's :class:`~splitfl.net.trust.spread.RoundMoves`: each
        server-checked update's move from the part it was sent (the peer checks)."""
        ctx, model, plan, rnd = at.ctx, at.model, at.plan, at.d2d
        expect = expectations(ctx, model, plan)
        gen = np.random.default_rng(derive_seed(rnd.round_seed, "mix"))
        profiles = None
        if at.emulate:
            profiles = emulated_profiles(ctx, plan, at.links, self._aux_flops(plan, model))
        server_emulation, moves, peers = None, RoundMoves(), self._peers
        if profiles is not None:
            server_emulation = (ctx.profile.server_flops, ctx.population.server.flops)
        family = family_of(plan)

        tap = tap_of(ctx, plan)

        def fleet_of(cls=RemoteFleet, **extra) -> RemoteFleet:
            fleet = cls(
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
                self._stalls,
                self._began,
                **extra,
            )
            fleet.tap = tap  # privacy.record: what arrives from the devices, as decoded
            return fleet

        def split_group(run: GroupRun):
            server = server_role(model, run.tasks, plan, ctx.config.train, self.runtime, gen)
            timed = None if server is None else TimedServer(server, rnd.meters, server_emulation)
            updates = family.schedule(fleet_of(), timed, run, plan)
            return updates, None if server is None else server.state()

        at.fleet, at.expect, at.split_group = fleet_of, expect, split_group
        return moves


def run_groups(family, model: BlockModel, plan: RoundPlan, groups: Groups):
    """Every group of the plan (``family.units``) through ``groups.run``, concurrently (one
    thread each), except with LocFedMix-SL's mixup, whose pairs come from one per-round stream
    in group order. Returns the updates and the server states (group → state)."""
    runs = family.units(model, plan)
    spec = plan.topology.server
    if (spec is not None and spec.mixup) or len(runs) == 1:
        done = [groups.run(run) for run in runs]
    else:
        with ThreadPoolExecutor(max_workers=len(runs)) as pool:
            done = list(pool.map(groups.run, runs))
    updates: list[ClientUpdate] = [u for group_updates, _ in done for u in group_updates]
    server_states = {
        run.group: state for run, (_, state) in zip(runs, done, strict=True) if state is not None
    }
    return updates, server_states


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

"""The networked executor: the server's side of a round over real device processes.

``executor: networked`` runs the same :class:`~splitfl.plan.RoundPlan` as the in-process
executors, with the same :func:`~splitfl.executors.fleet.run_group` loop and
:class:`~splitfl.executors.roles.ServerRole`, but each client's device part lives in a device
process reached through the :class:`~splitfl.net.hub.Hub`
(:class:`~splitfl.net.fleet.RemoteFleet`). Groups run concurrently (one thread each; the server
copies are independent), except with LocFedMix-SL's mixup, whose pairs are drawn from one
per-round stream in group order. The result carries what was measured
(:class:`~splitfl.net.fleet.Meter` per client, the round's wall time) and the clients that
were lost, with the reason.
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from splitfl.config import ExperimentConfig
from splitfl.executors.fleet import GroupRun, group_runs, run_group, server_role
from splitfl.executors.roles import Runtime, ServerRole
from splitfl.models import BlockModel, ModelPart
from splitfl.net.emulation import Profile, stretch
from splitfl.net.fleet import Expect, Meter, RemoteFleet
from splitfl.net.session import NetworkSession
from splitfl.plan import ClientUpdate, RoundPlan, RoundResult
from splitfl.seeding import derive_seed


class _TimedServer:
    """A :class:`ServerRole` whose step time is charged to every member it served; with
    ``emulate`` (per-sample server FLOPs by cut, server FLOPS) the step is stretched to
    ``Σ samples × FLOPs / Comp_s`` (S²FL Eq. 1's ``F_s / Comp_s``)."""

    def __init__(self, server: ServerRole, meters: dict[int, Meter], emulate=None):
        self.server, self.meters, self.stop = server, meters, server.stop
        self.emulate = emulate

    def step(self, sent):
        start = time.perf_counter()
        out = self.server.step(sent)
        if self.emulate is not None:
            per_cut, flops = self.emulate
            work = sum(len(s.labels) * per_cut(s.cut) for s in sent)
            stretch(start, 1, work, flops)
        spent = time.perf_counter() - start
        for s in sent:
            self.meters[s.client].server_s += spent
        return out


class NetworkedExecutor:
    """Runs plans on device processes; :meth:`open`/:meth:`close` bracket the run."""

    def __init__(self, config: ExperimentConfig, device: str = "cpu"):
        self.config = config
        self.runtime = Runtime(torch.device(device), config.precision, config.channels_last)
        self.session: NetworkSession | None = None

    def open(self, ctx, run_dir: Path) -> None:
        """Start listening (and the local device processes, if any) and wait for devices."""
        self.session = NetworkSession(self.config, ctx.num_clients, run_dir)
        self.session.start()

    def close(self) -> None:
        if self.session is not None:
            self.session.stop()
            self.session = None

    def run_round(
        self, ctx, global_state: dict[str, torch.Tensor], plan: RoundPlan, round_seed: int
    ) -> RoundResult:
        if plan.ring is not None:  # refused at config validation too (check_networked)
            raise ValueError(
                "a ring plan needs device-to-device links; the networked executor runs "
                "parameter-server plans only"
            )
        if self.session is None:
            raise RuntimeError("NetworkedExecutor.open() was not called")
        self.session.wait_ready()
        model: BlockModel = copy.deepcopy(ctx.model).to(self.runtime.device)
        model.load_state_dict(global_state)
        model.train()
        meters = {t.client: Meter() for t in plan.tasks}
        lost: dict[int, str] = {}
        expect = expectations(ctx, model, plan)
        gen = np.random.default_rng(derive_seed(round_seed, "mix"))
        timeout = self.config.network.timeout_s
        profiles = emulated_profiles(ctx, plan) if self.config.network.emulate else None
        server_emulation = None
        if profiles is not None:
            server_emulation = (ctx.profile.server_flops, ctx.population.server.flops)

        def group(run: GroupRun):
            server = server_role(model, run.tasks, plan, ctx.config.train, self.runtime, gen)
            timed = None if server is None else _TimedServer(server, meters, server_emulation)
            fleet = RemoteFleet(
                self.session.hub, round_seed, timeout, expect, meters, lost, profiles
            )
            return run_group(fleet, timed, run, plan), server

        start = time.perf_counter()
        runs = list(group_runs(ctx, model, plan))
        if plan.mixup_alpha or len(runs) == 1:
            done = [group(run) for run in runs]
        else:
            with ThreadPoolExecutor(max_workers=len(runs)) as pool:
                done = list(pool.map(group, runs))
        wall = time.perf_counter() - start
        updates: list[ClientUpdate] = [u for group_updates, _ in done for u in group_updates]
        server_states = {
            run.group: server.state()
            for run, (_, server) in zip(runs, done, strict=True)
            if server is not None
        }
        return RoundResult(
            updates=updates,
            server_states=server_states,
            measured_time={c: m.busy_s for c, m in meters.items() if c not in lost},
            measured_bytes={c: m.wire_up + m.wire_down for c, m in meters.items()},
            measured={c: measured_fields(m, wall) for c, m in meters.items()},
            dropped=dict(sorted(lost.items())),
            measured_round_time=wall,
        )


def emulated_profiles(ctx, plan: RoundPlan) -> dict[int, Profile]:
    """Each task's device profile for the plan's round and its part's per-sample FLOPs."""
    r = plan.round_idx or 0
    out = {}
    for t in plan.tasks:
        device = ctx.population.at(t.client, r)
        flops = ctx.profile.device_flops(t.cut)
        out[t.client] = Profile(device.flops, device.uplink, device.downlink, flops)
    return out


def expectations(ctx, model: BlockModel, plan: RoundPlan) -> Expect:
    """What valid device replies look like for ``plan``'s cut points (one-sample dry run
    of each device part gives the smashed-data shape)."""
    dtype = next(model.parameters()).dtype
    shapes, specs = {}, {}
    sample = ctx.bundle.train.x[:1].to(next(model.parameters()).device)
    if sample.is_floating_point():
        sample = sample.to(dtype)
    for cut in sorted({t.cut for t in plan.tasks}):
        part = ModelPart(model, 0, cut)
        specs[cut] = {k: (tuple(v.shape), v.dtype) for k, v in part.state_dict().items()}
        if cut < model.num_blocks:
            with torch.no_grad():
                shapes[cut] = tuple(part.eval()(sample).shape[1:])
            part.train()
    return Expect(dtype, shapes, ctx.bundle.num_classes, specs)


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

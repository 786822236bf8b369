"""The star: every member of a group meets the group's server copy at every step (SplitFed V1,
S²FL Alg. 1, MergeSFL's merged batch, the auxiliary-model family's uploads; FedAvg-style
whole-model tasks train on their devices alone); :mod:`splitfl.topologies.clusters` runs
its schedule where a member's device hosts the server copy (ParallelSFL)."""

from __future__ import annotations

import torch

from splitfl.core.plan import ClientUpdate, RoundPlan
from splitfl.core.topology import Star
from splitfl.roles.fleet import Fleet, GroupRun, SplitLoop
from splitfl.roles.sides import ServerRole
from splitfl.system.cost import round_times
from splitfl.topologies.base import register
from splitfl.topologies.lockstep import lockstep_finish, member_phases
from splitfl.topologies.split import SplitFamily


class StarFamily(SplitFamily):
    payload = Star
    summary = "star: every member meets its group's server copy at every step"

    def schedule(
        self, fleet: Fleet, server: ServerRole | None, run: GroupRun, plan: RoundPlan
    ) -> list[ClientUpdate]:
        loop = SplitLoop.of(fleet, server, run, plan)
        fleet.begin(run.tasks, run.parts, run.aux)
        for step in range(max(t.steps for t in run.tasks)):
            loop.iteration([t for t in run.tasks if step < t.steps], step)
        return loop.updates(
            fleet.finish([t.client for t in run.tasks if t.client not in fleet.dropped])
        )

    def round_time(self, view, plan, r, priced, samples, times):
        """The slowest participant's time (Eq. 1), or with ``Star.barrier`` each group's
        lock-step finish (:func:`~splitfl.topologies.lockstep.lockstep_finish`, S²FL Alg. 2);
        a member's waiting is the round time minus its own busy time."""
        round_time, _ = round_times(times)
        if getattr(plan.topology, "barrier", False):
            for members in plan.groups().values():
                phases = {
                    t.client: member_phases(
                        t,
                        priced[t.client],
                        samples[t.client],
                        int(view.data_sizes[t.client]),
                        times[t.client],
                        view.config.train.drop_last,
                    )
                    for t in members
                    if t.client in priced and t.client in times
                }
                if len(phases) > 1:
                    round_time = max(round_time, *lockstep_finish(phases).values())
        return round_time, {c: round_time - t for c, t in times.items()}

    def batched(self, plan: RoundPlan, model: torch.nn.Module) -> bool:
        """``executor: vectorized`` batches star rounds whose devices step on the server's
        gradient and whose server trains on no mixup (its twin:
        :mod:`splitfl.executors.split_step`)."""
        del model
        return plan.device_update is None and not plan.topology.server.mixup


STAR = register(StarFamily())

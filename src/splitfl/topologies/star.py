"""The star: every member of a group meets the group's server copy at every step (SplitFed V1,
S²FL Alg. 1, MergeSFL's merged batch, the auxiliary-model family's uploads; FedAvg-style
whole-model tasks train on their devices alone) — and :class:`~splitfl.core.topology.Clusters`,
star groups whose server copy a member's device hosts (ParallelSFL): the arithmetic is the
star's wherever the server copy runs; the networked runtime places it."""

from __future__ import annotations

import torch

from splitfl.core.plan import ClientUpdate, RoundPlan
from splitfl.core.topology import Clusters, Star
from splitfl.roles.fleet import Fleet, GroupRun, SplitLoop
from splitfl.roles.sides import ServerRole
from splitfl.topologies.base import register
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

    def batched(self, plan: RoundPlan, model: torch.nn.Module) -> bool:
        """``executor: vectorized`` batches star rounds whose devices step on the server's
        gradient and whose server trains on no mixup (its twin:
        :mod:`splitfl.executors.split_step`)."""
        del model
        return plan.device_update is None and not plan.topology.server.mixup


class ClustersFamily(StarFamily):
    payload = Clusters
    summary = "clusters: star groups whose server copy a member's device hosts (D2D)"


STAR = register(StarFamily())
CLUSTERS = register(ClustersFamily())

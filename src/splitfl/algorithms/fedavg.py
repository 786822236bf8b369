"""FedAvg (McMahan et al., AISTATS 2017): every device trains the whole model.

A baseline of S²FL (§5), RingSFL (§4, "FL") and MergeSFL (§V); not of ParallelSFL (its §5
baselines are AdaSFL, AdaSampling, LocFedMix-SL and IFCA). Each selected client runs its
local steps on the full model (cut = number of blocks, so nothing crosses to the server but
the model itself), and the server averages the models weighted by data size |D_i|. Round
time follows the shared cost model with the full model (S²FL Eq. 1 with ``|Wc| = |W|``,
``q = 0`` and ``F_s = 0``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.algorithms.base import Algorithm
from splitfl.core.plan import RoundPlan


@dataclass(frozen=True)
class FedAvgOptions:
    """FedAvg has no options of its own (batch size, lr, local epochs live in ``train``)."""


class FedAvg(Algorithm):
    name = "fedavg"
    paper = "McMahan et al. 2017; baseline in S²FL §5, RingSFL §4, MergeSFL §V"
    splits_model = False  # every client trains the whole model
    Options = FedAvgOptions

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        full = self.ctx.num_blocks
        return RoundPlan(
            tasks=[self.make_task(c, full, i, round_idx) for i, c in enumerate(clients)]
        )

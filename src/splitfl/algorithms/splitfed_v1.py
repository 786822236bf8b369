"""SplitFed V1 (Thapa et al., AAAI 2022): one server-side copy per client, then averaged.

Each selected client trains the device part (blocks before ``cut``) and sends activations to the
main server, which keeps a separate copy of the server part per client, trained only on that
client's activations; after the round the fed server averages the device parts and the main
server averages its copies (both weighted by |D_i|; S²FL Algorithm 1 with groups of one).

S²FL's "SFL" baseline (§5, Table 2) is this algorithm with every device on the largest device
part ``Wc3``, i.e. the model's last candidate cut point — the default here (``cut: null``) for
S²FL's models; a model from another paper defaults to that paper's split
(``BlockModel.default_cut``, e.g. MergeSFL's CNN-H at cut 2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.core.plan import RoundPlan
from splitfl.core.topology import Star


@dataclass(frozen=True)
class SplitFedOptions(SplitOptions):
    """``cut``: block index where the model is split; null = the model's default cut (its
    paper's split, else its last candidate)."""

    cut: int | None = None


class SplitFedV1(Algorithm):
    name = "splitfed_v1"
    paper = "Thapa et al. 2022 (SplitFed, SFLV1); S²FL §5 'SFL' baseline"
    Options = SplitFedOptions

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        cut = self.options.cut
        tasks = [self.make_task(c, cut, i, round_idx) for i, c in enumerate(clients)]
        return RoundPlan(tasks, topology=Star())

"""SplitFed as RingSFL's authors ran it: the "SplitFed" baseline of RingSFL §4 (Table 3).

One shared server model, kept from round to round, takes one SGD step per iteration on the
mean of the clients' mean losses (``group_loss: member_mean``, the per-client gradients scaled
1/N); each client steps its device part on its own mean loss's gradient; device parts are
averaged at the round's end. Default cut 2, as the authors' code. Neither SplitFed V1 nor V2.

How the authors' code is read, and how it differs from the other SplitFeds:
``docs/explanation/readings/splitfed_ringsfl.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.core.plan import RoundPlan
from splitfl.core.topology import ServerSpec, Star


@dataclass(frozen=True)
class SplitFedRingOptions(SplitOptions):
    """``cut``: block index where the model is split (default 2, the authors' ``cut_point``);
    null = the model's last candidate cut."""

    cut: int | None = 2


class SplitFedRingSFL(Algorithm):
    name = "splitfed_ringsfl"
    paper = (
        "RingSFL §4 'SplitFed' baseline as the authors' code runs it: one shared server model, "
        "one step per iteration on the clients' gradients scaled 1/N (not SFLV1/V2)"
    )
    Options = SplitFedRingOptions
    coupled_round = "one server copy for all clients"

    def __init__(self, options: SplitFedRingOptions, ctx) -> None:
        super().__init__(options, ctx)
        self.cut = self.options.cut

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        """All clients in group 0 (one server model), trained every iteration together."""
        tasks = [self.make_task(c, self.cut, 0, round_idx) for c in clients]
        server = ServerSpec(group_loss="member_mean", device_grad="own", forward="separate")
        return RoundPlan(tasks, topology=Star(server=server))

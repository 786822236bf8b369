"""An algorithm written outside splitfl: Power-of-Choice client selection on SplitFed.

Cho, Wang and Joshi, "Towards Understanding Biased Client Selection in Federated Learning"
(AISTATS 2022), the computation-free variant ``rpow-d``: each round the server

1. draws ``d`` candidate clients without replacement with probability ∝ their data size p_k
   (Algorithm 1, line 3),
2. keeps the ``m`` candidates with the highest local loss, using each client's most recently
   observed training loss (``rpow-d``: no extra evaluation; a client never seen yet counts as
   the highest, so every client is tried once early),
3. averages the selected clients' models with equal weights (the paper's update
   ``w ← w − η (1/m) Σ_k g_k``: the data-size bias is already in the draw).

Training is SplitFed V1's (one server-side copy per client, cut at ``cut``). The interface it
uses (see README "Your own algorithm"):

* ``Options``: a frozen dataclass; ``options.power_of_choice.*`` in the config fills it, and a
  bad value raises ``ConfigError(field, message)`` — one line, exit 2 before the run starts;
  subclassing ``SplitOptions`` gives it the shared ``cut`` option, resolved when the algorithm
  is built (null: the model's default cut), so ``self.options.cut`` is a checked block index;
* ``select_clients`` / ``plan_round`` / ``observe`` / ``aggregate``: the round's hooks;
* ``self.ctx``: what the algorithm reads of the run (``FederationView``: ``config``,
  ``num_clients``, ``data_sizes``, …); ``self.make_task`` builds a client's task with the
  run's batch size, learning rate and local steps;
* ``state_dict`` / ``load_state_dict``: what a checkpoint keeps (numbers, strings, lists,
  dicts, tensors), so ``splitfl run --resume`` continues exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

import splitfl
from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.config import ConfigError
from splitfl.core.plan import RoundPlan, RoundReport, RoundResult
from splitfl.core.topology import Star


@dataclass(frozen=True)
class PowerOfChoiceOptions(SplitOptions):
    """``d``: candidates drawn per round (null: twice ``train.clients_per_round``, the
    paper's d = 2m); ``cut`` (from ``SplitOptions``): where the model is split (null: the
    model's default cut)."""

    d: int | None = None

    def __post_init__(self):
        if self.d is not None and (not isinstance(self.d, int) or self.d < 1):
            raise ConfigError(
                "options.power_of_choice.d", f"must be an integer >= 1 (got {self.d!r})"
            )


@splitfl.register_algorithm
class PowerOfChoice(Algorithm):
    name = "power_of_choice"
    paper = "Cho et al., Power-of-Choice (AISTATS 2022), rpow-d on SplitFed V1"
    Options = PowerOfChoiceOptions
    #: declared, so ``executor: timing`` (which trains nothing) refuses it in one line
    training_signals = "selects clients by their last observed training loss"

    def __init__(self, options: PowerOfChoiceOptions, ctx):
        super().__init__(options, ctx)
        self.m = ctx.config.train.clients_per_round
        self.d = min(options.d or 2 * self.m, ctx.num_clients)
        if self.d < self.m:
            raise ConfigError(
                "options.power_of_choice.d", f"must be >= clients_per_round ({self.m})"
            )
        self.last_loss: dict[int, float] = {}  # client → its latest mean training loss

    def select_clients(self, round_idx: int, rng: np.random.Generator) -> list[int]:
        """Algorithm 1: ``d`` candidates ∝ p_k, then the ``m`` with the highest loss."""
        p = self.ctx.data_sizes / self.ctx.data_sizes.sum()
        candidates = rng.choice(self.ctx.num_clients, size=self.d, replace=False, p=p)
        by_loss = sorted(candidates, key=lambda c: -self.last_loss.get(int(c), math.inf))
        return sorted(int(c) for c in by_loss[: self.m])

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        """SplitFed V1: every client its own group (its own server-side copy)."""
        cut = self.options.cut  # resolved when the algorithm was built
        tasks = [self.make_task(c, cut, group, round_idx) for group, c in enumerate(clients)]
        return RoundPlan(tasks, topology=Star())

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        """Remember each participant's mean training loss of this round."""
        self.last_loss.update({int(c): float(v) for c, v in report.losses.items()})

    def aggregate(
        self, global_state: dict[str, torch.Tensor], plan: RoundPlan, result: RoundResult
    ) -> dict[str, torch.Tensor]:
        """Equal weights over the selected clients (device and server copies alike)."""
        weights = {u.client: 1.0 for u in result.updates}
        return layerwise_aggregate(
            global_state, result.updates, result.server_states, weights, self.aggregation
        )

    def state_dict(self) -> dict:
        return {"last_loss": {str(c): v for c, v in self.last_loss.items()}}

    def load_state_dict(self, state: dict) -> None:
        self.last_loss = {int(c): float(v) for c, v in state["last_loss"].items()}

"""PyramidFL (Li et al., MobiCom 2022): fine-grained client selection for FL — baseline of
MergeSFL §V. The whole model trains on each device (as FedAvg).

PyramidFL extends Oort's utility-based selection. splitfl implements:

* **Selection** (Oort, which PyramidFL builds on): a client's statistical utility is
  ``|D_i| · L_i`` with ``L_i`` its mean training loss when last selected (Oort uses
  ``|B_i|·sqrt(mean loss²)``; the executor reports the mean loss), plus the staleness bonus
  ``sqrt(0.1·ln(h) / h_i)`` (h_i = round of last selection); its system utility multiplies by
  ``(T / t_i)^alpha`` when its expected round time t_i exceeds the preferred duration T
  (the ``pacer_percentile`` of the expected times of explored clients). A fraction ε of the
  slots (``explore`` decaying by ``explore_decay`` per round, floor ``explore_min``) goes to
  never-selected clients at random; the rest to the highest utilities.
* **Fine-grained local work:** PyramidFL lets each selected client use its own resources —
  faster clients run more local iterations and slower ones less (PyramidFL also drops parts of
  the model for slow clients; splitfl adapts iterations only — stated simplification):
  ``steps_i = clip(round(steps · T_h / t_i), steps·min_factor, steps·max_factor)`` with
  ``T_h`` the median expected time of the round's selected clients.
* Aggregation: FedAvg, |D_i|-weighted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from splitfl.algorithms.base import Algorithm, RoundPlan, RoundReport
from splitfl.algorithms.mergesfl_control import moving_average


@dataclass(frozen=True)
class PyramidFLOptions:
    alpha: float = 2.0
    pacer_percentile: float = 80.0
    explore: float = 0.9
    explore_decay: float = 0.98
    explore_min: float = 0.2
    min_factor: float = 0.25
    max_factor: float = 3.0
    ema: float = 0.8

    def __post_init__(self) -> None:
        from splitfl.config import ConfigError

        if not 0 <= self.explore_min <= self.explore <= 1:
            raise ConfigError("options.pyramidfl.explore", "need 0 <= explore_min <= explore <= 1")
        if not 0 < self.min_factor <= 1 <= self.max_factor:
            raise ConfigError(
                "options.pyramidfl.min_factor", "need 0 < min_factor <= 1 <= max_factor"
            )
        if self.max_factor > 100:
            raise ConfigError("options.pyramidfl.max_factor", "must be <= 100")
        if not 0 < self.pacer_percentile <= 100:
            raise ConfigError("options.pyramidfl.pacer_percentile", "must be in (0, 100]")
        if not 0 <= self.alpha <= 100:  # Oort's straggler penalty exponent
            raise ConfigError("options.pyramidfl.alpha", f"must be in [0, 100] (got {self.alpha})")
        if not 0 < self.explore_decay <= 1:
            raise ConfigError("options.pyramidfl.explore_decay", "must be in (0, 1]")
        if not 0 <= self.ema < 1:
            raise ConfigError("options.pyramidfl.ema", f"must be in [0, 1) (got {self.ema})")


def oort_utility(
    stat: float, last_round: int, round_idx: int, time: float, preferred: float, alpha: float
) -> float:
    """Oort's utility: statistical utility + staleness bonus, penalised when slower than T."""
    bonus = math.sqrt(0.1 * math.log(max(round_idx, 1)) / max(last_round, 1))
    utility = stat + bonus
    if time > preferred:
        utility *= (preferred / time) ** alpha
    return utility


class PyramidFL(Algorithm):
    name = "pyramidfl"
    paper = "Li et al., PyramidFL (MobiCom 2022); baseline in MergeSFL §V"
    Options = PyramidFLOptions

    def __init__(self, options: PyramidFLOptions, ctx) -> None:
        super().__init__(options, ctx)
        n = ctx.num_clients
        self.stat: list[float | None] = [None] * n
        self.time_per_step: list[float | None] = [None] * n
        self.last_round = [0] * n

    def expected_time(self, client: int, steps: int, round_idx: int) -> float:
        per_step = self.time_per_step[client]
        if per_step is None:  # never measured: its advertised profile (Eq. 1, whole model)
            return self.ctx.nominal_time(client, self.ctx.num_blocks, round_idx)
        return per_step * steps

    def select_clients(self, round_idx: int, rng: np.random.Generator) -> list[int]:
        k = self.ctx.config.train.clients_per_round
        o = self.options
        eps = max(o.explore_min, o.explore * o.explore_decay**round_idx)
        explored = [c for c in range(self.ctx.num_clients) if self.stat[c] is not None]
        unexplored = [c for c in range(self.ctx.num_clients) if self.stat[c] is None]
        n_explore = min(len(unexplored), max(k - len(explored), int(round(eps * k))))
        chosen = (
            [int(c) for c in rng.choice(unexplored, size=n_explore, replace=False)]
            if n_explore
            else []
        )
        if explored and k > n_explore:
            times = {c: self.expected_time(c, self.ctx.local_steps(c), round_idx) for c in explored}
            preferred = float(np.percentile(list(times.values()), o.pacer_percentile))
            score = {
                c: oort_utility(
                    self.stat[c], self.last_round[c], round_idx, times[c], preferred, o.alpha
                )
                for c in explored
            }
            chosen += sorted(explored, key=lambda c: (-score[c], c))[: k - n_explore]
        return sorted(chosen)

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        full = self.ctx.num_blocks
        tasks = [self.make_task(c, full, i, round_idx) for i, c in enumerate(clients)]
        times = [self.expected_time(t.client, t.steps, round_idx) for t in tasks]
        deadline = float(np.median(times))
        o = self.options
        for task, t in zip(tasks, times, strict=True):
            factor = min(max(deadline / t, o.min_factor), o.max_factor)
            task.steps = max(1, int(round(task.steps * factor)))
        return RoundPlan(
            tasks, info={"local_steps": [t.steps for t in tasks], "deadline": deadline}
        )

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        for task in plan.tasks:
            c = task.client
            per_step = report.times[c] / task.steps
            self.time_per_step[c] = moving_average(
                self.time_per_step[c], per_step, self.options.ema
            )
            self.stat[c] = float(self.ctx.data_sizes[c]) * report.losses[c]
            self.last_round[c] = round_idx + 1

    def state_dict(self) -> dict:
        return {
            "stat": list(self.stat),
            "time_per_step": list(self.time_per_step),
            "last_round": list(self.last_round),
        }

    def load_state_dict(self, state: dict) -> None:
        self.stat = list(state["stat"])
        self.time_per_step = list(state["time_per_step"])
        self.last_round = list(state["last_round"])

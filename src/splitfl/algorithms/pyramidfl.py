"""PyramidFL (Li et al., MobiCom 2022): fine-grained client selection for FL — baseline of
MergeSFL §V. The whole model trains on each device (as FedAvg).

The paper's text is not in this repository; splitfl follows its released code
(``liecn/PyramidFL``) and MergeSFL §V's description: Oort's selection
(:func:`oort_utility`, :func:`normalise_stats`), local steps per client so that each finishes
by the round's median expected time, partial-model dropout by rank (:func:`dropout_ratios`),
FedAvg with |D_i| weights.

How each part of the code is read, and the stated simplifications:
``docs/explanation/readings/pyramidfl.md``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from splitfl.aggregation.layerwise import robust_average
from splitfl.algorithms.base import Algorithm
from splitfl.algorithms.estimates import fill_value, update_table
from splitfl.config import ConfigError
from splitfl.core.plan import Charge, ClientTask, RoundPlan, RoundReport, RoundResult
from splitfl.models.profile import BYTES_PER_ELEMENT


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
    clip_bound: float = 0.98
    dropout: bool = True
    dropout_low: float = 0.1
    dropout_high: float = 0.6

    def __post_init__(self) -> None:
        if not 0 <= self.dropout_low <= self.dropout_high <= 1:
            raise ConfigError(
                "options.pyramidfl.dropout_low", "need 0 <= dropout_low <= dropout_high <= 1"
            )
        if not 0 < self.clip_bound <= 1:
            raise ConfigError("options.pyramidfl.clip_bound", "must be in (0, 1]")

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


def normalise_stats(stats: dict[int, float], clip_bound: float) -> dict[int, float]:
    """Oort's reward normalisation (``oort.py get_norm``): clip at the ``clip_bound`` quantile
    of the sorted rewards, then (r − 0.999·min) / max(max − 0.999·min, 1e-4) with the
    unclipped max, as the released code."""
    values = sorted(stats.values())
    clip = values[min(int(len(values) * clip_bound), len(values) - 1)]
    low = values[0] * 0.999
    span = max(values[-1] - low, 1e-4)
    return {c: (min(v, clip) - low) / span for c, v in stats.items()}


def dropout_ratios(stats: list[float | None], low: float, high: float) -> list[float]:
    """Per selected client: ``low + rank·(high − low)/K``, rank 0 = highest statistical
    utility (unmeasured clients rank last, in order) — ``param_server.py``."""
    k = len(stats)
    order = sorted(range(k), key=lambda i: (stats[i] is None, -(stats[i] or 0.0), i))
    rank = {i: r for r, i in enumerate(order)}
    return [low + rank[i] * (high - low) / k for i in range(k)]


class PyramidFL(Algorithm):
    name = "pyramidfl"
    paper = "Li et al., PyramidFL (MobiCom 2022); baseline in MergeSFL §V"
    splits_model = False  # every client trains the whole model
    Options = PyramidFLOptions
    training_signals = "selects and ranks dropout by the statistical utility |D_i|·L_i (L_i: loss)"
    timing_stand_in = "every client's training loss is 1.0 (statistical utility |D_i|)"

    def __init__(self, options: PyramidFLOptions, ctx) -> None:
        super().__init__(options, ctx)
        n = ctx.num_clients
        self.stat: list[float | None] = [None] * n
        #: compute time per local step and model-transfer time per round (measured, averaged)
        self.time_per_step: list[float | None] = [None] * n
        self.transfer_time: list[float | None] = [None] * n
        self.last_round = [0] * n
        #: the medians of the measured step and transfer times (None: not computed since the
        #: tables last changed), what a never-measured client is estimated at
        self._fills: tuple[float, float] | None = None
        #: parameter tensors each client of the current round does not upload (dropout)
        self.dropped: dict[int, set[str]] = {}
        model = ctx.model
        self.param_bytes = {k: p.numel() * BYTES_PER_ELEMENT for k, p in model.named_parameters()}

    def step_and_transfer(self, client: int) -> tuple[float, float]:
        """(compute time per step ``c_i``, model-transfer time per round ``m_i``) as measured;
        never measured: the medians of the measured ones (1.0 and 0.0 before any
        measurement) — no device profile is read."""
        per_step, transfer = self.time_per_step[client], self.transfer_time[client]
        if per_step is None or transfer is None:
            if self._fills is None:  # the medians, once per observed round (not per client)
                self._fills = (fill_value(self.time_per_step), fill_value(self.transfer_time, 0.0))
            per_step = self._fills[0] if per_step is None else per_step
            transfer = self._fills[1] if transfer is None else transfer
        return float(per_step), float(transfer)

    def expected_time(self, client: int, steps: int, round_idx: int) -> float:
        """``t_i = m_i + c_i · steps`` (:meth:`step_and_transfer`)."""
        del round_idx
        per_step, transfer = self.step_and_transfer(client)
        return transfer + per_step * steps

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
            stat = normalise_stats({c: self.stat[c] for c in explored}, o.clip_bound)
            score = {
                c: oort_utility(
                    stat[c], self.last_round[c], round_idx, times[c], preferred, o.alpha
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
        for task in tasks:
            per_step, transfer = self.step_and_transfer(task.client)
            wanted = (deadline - transfer) / per_step if per_step > 0 else math.inf
            low, high = task.steps * o.min_factor, task.steps * o.max_factor
            task.steps = max(1, int(round(min(max(wanted, low), high))))
        ratios = self.draw_dropout(tasks, rng)
        for task in tasks:  # the dropped tensors' upload bytes and time are not spent
            saved = sum(self.param_bytes[k] for k in self.dropped.get(task.client, ()))
            if saved:
                task.charge = Charge(extra_up=-saved)
        info = {"local_steps": [t.steps for t in tasks], "deadline": deadline}
        if o.dropout:
            info["dropout_ratio"] = ratios
        return RoundPlan(tasks, info=info)

    def draw_dropout(self, tasks: list[ClientTask], rng: np.random.Generator) -> list[float]:
        """Each client's dropout ratio and the parameter tensors it drops (seeded)."""
        self.dropped = {}
        o = self.options
        if not o.dropout:
            return [0.0] * len(tasks)
        ratios = dropout_ratios([self.stat[t.client] for t in tasks], o.dropout_low, o.dropout_high)
        keys = list(self.param_bytes)
        for task, ratio in zip(tasks, ratios, strict=True):
            draws = rng.random(len(keys))
            self.dropped[task.client] = {k for k, u in zip(keys, draws, strict=True) if u < ratio}
        return ratios

    def aggregate(self, global_state, plan: RoundPlan, result: RoundResult) -> dict:
        """FedAvg; a dropped tensor is averaged over the clients that uploaded it."""
        new = super().aggregate(global_state, plan, result)
        for key in sorted(set().union(*self.dropped.values()) if self.dropped else ()):
            kept = [u for u in result.updates if key not in self.dropped.get(u.client, ())]
            if not kept:
                new[key] = global_state[key].clone()
                continue
            w = [float(self.ctx.data_sizes[u.client]) for u in kept]
            states = [{key: u.state[key]} for u in kept]
            new[key] = robust_average(states, w, self.aggregation, global_state)[key]
        return new

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        self._fills = None  # the tables change
        for task in plan.tasks:
            c = task.client
            # the whole model trains on the device: its communication is the model transfers
            transfer = report.costs[c].comm_time * report.jitter[c]
            per_step = (report.times[c] - transfer) / task.steps
            update_table(self.time_per_step, c, per_step, self.options.ema)
            update_table(self.transfer_time, c, transfer, self.options.ema)
            self.stat[c] = float(self.ctx.data_sizes[c]) * report.losses[c]
            self.last_round[c] = round_idx + 1

    def state_dict(self) -> dict:
        return {
            "stat": list(self.stat),
            "time_per_step": list(self.time_per_step),
            "transfer_time": list(self.transfer_time),
            "last_round": list(self.last_round),
        }

    def load_state_dict(self, state: dict) -> None:
        self._fills = None
        self.stat = list(state["stat"])
        self.time_per_step = list(state["time_per_step"])
        self.transfer_time = list(state["transfer_time"])
        self.last_round = list(state["last_round"])

"""AdaSampling (Luo et al., "Tackling System and Statistical Heterogeneity for Federated
Learning with Adaptive Client Sampling", INFOCOM 2022) — baseline of ParallelSFL §5.

Clients are sampled with replacement from probabilities q that minimise the expected
wall-clock time to convergence. With rounds-to-converge ∝ Σ_i p_i² G_i² / q_i (the variance
of the unbiased aggregate) and expected round time ∝ Σ_i q_i t_i, Cauchy–Schwarz gives the
minimiser of their product

    q_i ∝ p_i · G_i / sqrt(t_i)

(p_i = |D_i|/Σ|D|, G_i a bound on client i's gradient norm, t_i its round time) — the
structure of the paper's solution; splitfl estimates G_i by a moving average of
‖w_i − w‖ / (η·steps) of the client's last update (mean of known values for unseen clients)
and t_i by its measured round time (until measured: the median of the measured clients'
times, 1.0 before any — no device profile is read). Aggregation is
the unbiased estimator w ← w + Σ_k p_{i_k} / (K·q_{i_k}) · (w_{i_k} − w). Full model on the
devices (FL), as in the paper.

Marked **proxy** (``splitfl.proxies``): the paper's text is not here, so the sampling
rule cannot be checked against its exact formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from splitfl.aggregation.robust import clip_scales
from splitfl.algorithms.base import Algorithm
from splitfl.algorithms.estimates import fill_unmeasured, update_table
from splitfl.config import ConfigError
from splitfl.core.plan import RoundPlan, RoundReport, RoundResult


@dataclass(frozen=True)
class AdaSamplingOptions:
    ema: float = 0.8
    min_probability: float = 1e-4

    def __post_init__(self) -> None:
        if not 0 <= self.ema < 1:
            raise ConfigError("options.adasampling.ema", "must be in [0, 1)")
        if not 0 <= self.min_probability < 1:
            raise ConfigError("options.adasampling.min_probability", "must be in [0, 1)")


def sampling_probabilities(p: np.ndarray, g: np.ndarray, t: np.ndarray, floor: float) -> np.ndarray:
    """q_i ∝ p_i·G_i/√t_i, floored at ``floor`` and renormalised (sums to 1). Every G_i = 0
    (no update moved the model: ``executor: timing`` trains nothing) carries no information
    about the clients: then G_i = 1 for all, q_i ∝ p_i/√t_i."""
    if not np.any(g > 0):
        g = np.ones_like(g)
    q = p * g / np.sqrt(t)
    q = q / q.sum()
    q = np.maximum(q, floor)
    return q / q.sum()


@dataclass(frozen=True)
class Draws:
    """How often each participant was drawn this round (the unbiased aggregation's K_i)."""

    counts: dict[int, int]


class AdaSampling(Algorithm):
    name = "adasampling"
    paper = "Luo et al., AdaSampling (INFOCOM 2022); baseline in ParallelSFL §5"
    splits_model = False  # every client trains the whole model
    Options = AdaSamplingOptions
    training_signals = "samples clients by the gradient norms G_i of their model updates"
    timing_stand_in = "G_i = 1 for every client (no update moves): q_i ∝ p_i/√t_i"
    # an unbiased importance-weighted sum of updates: clipping each keeps it a sum, a
    # coordinate-wise median or trimmed mean would not
    aggregations = ("mean", "clip_mean")

    def __init__(self, options: AdaSamplingOptions, ctx) -> None:
        super().__init__(options, ctx)
        n = ctx.num_clients
        self.grad_norm: list[float | None] = [None] * n
        self.time: list[float | None] = [None] * n
        self.q = np.full(n, 1.0 / n)

    def probabilities(self, round_idx: int) -> np.ndarray:
        p = self.ctx.data_sizes / self.ctx.data_sizes.sum()
        g = fill_unmeasured(self.grad_norm, summary=np.mean)  # unseen: mean of the known
        t = fill_unmeasured(self.time)  # never measured: median measured time, no profile
        return sampling_probabilities(p, g, t, self.options.min_probability)

    def select_clients(self, round_idx: int, rng: np.random.Generator) -> list[int]:
        """K draws with replacement from q; duplicates train once and weigh more."""
        self.q = self.probabilities(round_idx)
        k = self.ctx.config.train.clients_per_round
        self.draws = [int(c) for c in rng.choice(self.ctx.num_clients, size=k, p=self.q)]
        return sorted(set(self.draws))

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        full = self.ctx.num_blocks
        tasks = [self.make_task(c, full, i, round_idx) for i, c in enumerate(clients)]
        counts = {c: self.draws.count(c) for c in clients}
        info = {"draws": counts, "q": {c: float(self.q[c]) for c in clients}}
        return RoundPlan(tasks, info=info, control=Draws(counts))

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        for task in plan.tasks:
            update_table(self.time, task.client, report.times[task.client], self.options.ema)

    def aggregate(self, global_state, plan: RoundPlan, result: RoundResult) -> dict:
        """Unbiased: w + Σ_k p_i/(K q_i) (w_i − w), k over the K draws."""
        k = len(self.draws)
        p = self.ctx.data_sizes / self.ctx.data_sizes.sum()
        out = {n: t.to(torch.float64).clone() for n, t in global_state.items()}
        scales = [1.0] * len(result.updates)
        if self.aggregation.name == "clip_mean":  # each Δ_i clipped (splitfl.aggregation.robust)
            states = [u.state for u in result.updates]
            scales = clip_scales(global_state, states, self.aggregation)
        for u, scale in zip(result.updates, scales, strict=True):
            coef = plan.control.counts[u.client] * p[u.client] / (k * self.q[u.client])
            sq = 0.0
            for n, t in global_state.items():
                if u.state[n] is t:  # untouched (executor: timing): adds nothing
                    continue
                delta = u.state[n].to(torch.float64) - t.to(torch.float64)
                if t.is_floating_point():
                    delta = scale * delta
                out[n] += coef * delta
                if t.is_floating_point():
                    sq += float((delta**2).sum())
            lr_steps = max(plan.tasks[0].lr * u.steps, 1e-12)
            norm = sq**0.5 / lr_steps
            update_table(self.grad_norm, u.client, norm, self.options.ema)
        return {
            n: (v.to(t.dtype) if t.is_floating_point() else torch.round(v).to(t.dtype))
            for (n, v), t in zip(out.items(), global_state.values(), strict=True)
        }

    def state_dict(self) -> dict:
        return {"grad_norm": list(self.grad_norm), "time": list(self.time)}

    def load_state_dict(self, state: dict) -> None:
        self.grad_norm, self.time = list(state["grad_norm"]), list(state["time"])

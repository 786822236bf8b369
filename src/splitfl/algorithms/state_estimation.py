"""Worker state estimation shared by MergeSFL (§IV-A, Eq. 5–6), AdaSFL and ParallelSFL (§4.2).

Per worker, moving averages (weight ``alpha`` on the history, 0.8 in the papers) of

* μ — computing time per sample of the worker's bottom model, and
* β — transmission time per sample (activation up, gradient down, label up),

fed by what participants measured on the simulated clock (jitter included). Workers that did
not train in the previous round report a probe of their current state (their profile in the
previous round), as the papers have the parameter server collect the latest state from every
worker at the start of a round.
"""

from __future__ import annotations

import numpy as np

from splitfl.algorithms.base import RoundPlan, RoundReport
from splitfl.algorithms.mergesfl_control import moving_average


class WorkerStateEstimator:
    """Moving-average μ/β per worker for a model split at ``cut``."""

    def __init__(self, ctx, cut: int, alpha: float = 0.8):
        self.ctx, self.cut, self.alpha = ctx, cut, alpha
        n = ctx.num_clients
        self.mu: list[float | None] = [None] * n
        self.beta: list[float | None] = [None] * n
        self.measured_last: set[int] = set()

    def bytes_per_sample(self) -> float:
        """Activation (+ label) bytes one sample sends up at the cut (``c`` of MergeSFL Eq. 10)."""
        q = self.ctx.profile.activation_bytes(self.cut)
        return float(q + self.ctx.config.devices.label_bytes)

    def _per_sample(self, client: int, round_idx: int) -> tuple[float, float]:
        dev = self.ctx.population.at(client, round_idx)
        q = self.ctx.profile.activation_bytes(self.cut)
        mu = self.ctx.profile.device_flops(self.cut) / dev.flops
        beta = (q + self.ctx.config.devices.label_bytes) / dev.uplink + q / dev.downlink
        return mu, beta

    def probe(self, client: int, round_idx: int) -> tuple[float, float]:
        """The state a worker reports before round ``round_idx`` (its previous-round profile)."""
        return self._per_sample(client, max(round_idx - 1, 0))

    def estimates(self, round_idx: int) -> tuple[np.ndarray, np.ndarray]:
        """Eq. (5)–(6) for all workers; non-participants of the last round report a probe."""
        for c in range(self.ctx.num_clients):
            if c not in self.measured_last:
                mu_hat, beta_hat = self.probe(c, round_idx)
                self.mu[c] = moving_average(self.mu[c], mu_hat, self.alpha)
                self.beta[c] = moving_average(self.beta[c], beta_hat, self.alpha)
        return np.asarray(self.mu, dtype=float), np.asarray(self.beta, dtype=float)

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        """Participants' measured per-sample times (μ̂ from device time, β̂ from the activation,
        gradient and label transfers, both with the round's jitter) enter the averages."""
        self.measured_last = {t.client for t in plan.tasks}
        for task in plan.tasks:
            c = task.client
            mu_hat, beta_hat = self._per_sample(c, round_idx)
            jit = report.jitter[c]
            self.mu[c] = moving_average(self.mu[c], mu_hat * jit, self.alpha)
            self.beta[c] = moving_average(self.beta[c], beta_hat * jit, self.alpha)

    def state_dict(self) -> dict:
        return {
            "mu": list(self.mu),
            "beta": list(self.beta),
            "measured_last": sorted(self.measured_last),
        }

    def load_state_dict(self, state: dict) -> None:
        self.mu, self.beta = list(state["mu"]), list(state["beta"])
        self.measured_last = set(state["measured_last"])

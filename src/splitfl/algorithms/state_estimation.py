"""Worker state estimation shared by MergeSFL (§IV-A, Eq. 5–6) and AdaSFL.

Per worker, moving averages (weight ``alpha`` on the history, 0.8 in the papers) of

* μ — computing time per sample of the worker's bottom model, and
* β — transmission time per sample (activation up, gradient down, label up),

fed only by what the simulated clock reported for the worker's own rounds
(``RoundReport.costs`` with the round's jitter; see :func:`measured_per_sample`) — never by the
device profile, so with time-varying devices the estimates lag the truth as the papers' do.
A worker that did not train keeps its last estimate (it has recorded nothing new; MergeSFL's
"latest" state). A worker never measured gets the median of the measured workers' estimates
(the PS's best guess without information), or 1.0 before anyone has been measured (all
workers equal; only ratios matter for Eq. 9) — stated choice.
"""

from __future__ import annotations

import numpy as np

from splitfl.algorithms.estimates import fill_unmeasured, update_table
from splitfl.core.plan import RoundPlan, RoundReport
from splitfl.system.cost import ClientCost, server_bytes

#: Traffic links that carry per-sample features (their time is β); the rest is model transfer.
FEATURE_LINKS = (
    "activations_up",
    "gradients_down",
    "labels_up",
    "d2d_activations",
    "d2d_gradients",
)


def server_link_wait(cost: ClientCost) -> float:
    """The part of ``cost.comm_time`` the shared PS link added: ``Σ b·(1/shared − 1/own)`` over
    the two directions (:func:`~splitfl.system.cost.share_server_link`; 0 where the round's
    report gives no shared rate, e.g. a measured networked round)."""
    if cost.server_link is None:
        return 0.0
    shared = (cost.extra.get("server_in_rate"), cost.extra.get("server_out_rate"))
    wait = 0.0
    for b, rate, own in zip(server_bytes(cost.traffic), shared, cost.server_link, strict=True):
        if b > 0 and rate and own and rate < own:
            wait += b * (1.0 / rate - 1.0 / own)
    return wait


def measured_per_sample(
    cost: ClientCost, jitter: float, samples: int, own_link: bool = False
) -> tuple[float, float]:
    """μ̂, β̂ of one worker from what the clock reported for its round (Eq. 5–6 inputs).

    μ̂ = measured device compute time / samples; β̂ = the share of the measured transfer time
    that moved per-sample features (activations, gradients, labels), split from the model
    transfers in proportion to bytes (exact when up- and downlink rates are equal, as in every
    preset), / samples. With ``own_link`` β̂ leaves out the time the shared PS link added
    (:func:`server_link_wait`): the worker's transmission time over its own link, which it
    knows (the testbeds measure each device's bandwidth with iperf3, MergeSFL §V-A).
    """
    total = cost.traffic.total
    feature = sum(getattr(cost.traffic, link) for link in FEATURE_LINKS)
    share = feature / total if total > 0 else 0.0
    n = max(samples, 1)
    comm = cost.comm_time - (server_link_wait(cost) if own_link else 0.0)
    return cost.device_time * jitter / n, comm * jitter * share / n


class WorkerStateEstimator:
    """Moving-average μ/β per worker for a model split at ``cut``."""

    def __init__(self, ctx, cut: int, alpha: float = 0.8):
        self.ctx, self.cut, self.alpha = ctx, cut, alpha
        n = ctx.num_clients
        self.mu: list[float | None] = [None] * n
        self.beta: list[float | None] = [None] * n
        #: β over the worker's own link, without the shared PS link's wait (MergeSFL's Eq. 10)
        self.beta_own: list[float | None] = [None] * n

    def bytes_per_sample(self) -> float:
        """Activation (+ label) bytes one sample sends up at the cut (``c`` of MergeSFL Eq. 10)."""
        q = self.ctx.profile.activation_bytes(self.cut)
        return float(q + self.ctx.config.devices.label_bytes)

    @property
    def any_measured(self) -> bool:
        return any(v is not None for v in self.mu)

    def estimates(self, round_idx: int) -> tuple[np.ndarray, np.ndarray]:
        """Eq. (5)–(6) estimates for all workers before round ``round_idx`` (never-measured
        workers: median of the measured ones, see the module docstring)."""
        del round_idx  # estimates change only with measurements
        return fill_unmeasured(self.mu), fill_unmeasured(self.beta)

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        """Participants' measured per-sample times (:func:`measured_per_sample`) enter the
        moving averages (Eq. 5–6); nobody else's estimate moves."""
        del round_idx
        for task in plan.tasks:
            c = task.client
            mu_hat, beta_hat = measured_per_sample(
                report.costs[c], report.jitter[c], report.samples[c]
            )
            update_table(self.mu, c, mu_hat, self.alpha)
            update_table(self.beta, c, beta_hat, self.alpha)
            _, own_hat = measured_per_sample(
                report.costs[c], report.jitter[c], report.samples[c], own_link=True
            )
            update_table(self.beta_own, c, own_hat, self.alpha)

    def own_link_beta(self) -> np.ndarray:
        """β over each worker's own link (Eq. 6 without the PS link's sharing), filled as
        :meth:`estimates`."""
        return fill_unmeasured(self.beta_own)

    def state_dict(self) -> dict:
        return {"mu": list(self.mu), "beta": list(self.beta), "beta_own": list(self.beta_own)}

    def load_state_dict(self, state: dict) -> None:
        self.mu, self.beta = list(state["mu"]), list(state["beta"])
        self.beta_own = list(state.get("beta_own", self.beta))

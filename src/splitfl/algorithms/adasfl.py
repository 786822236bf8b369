"""AdaSFL (Liao et al., adaptive control of batch size and local updating frequency in split
federated learning) — baseline of ParallelSFL (§5 "AdaSFL assigns adaptive local
updating frequency and diverse batch sizes for heterogeneous workers ... without addressing
statistical heterogeneity").

No paper text is in this repository and the released code does not run (public facts), so
splitfl implements the mechanisms the citing papers name, with MergeSFL's shared pieces:

* workers selected uniformly at random (``train.clients_per_round``) — no statistical handling;
* worker state: the shared moving-average estimator (μ, β per sample);
* batch sizes ∝ speed: the fastest selected worker gets D = ``train.batch_size``, the others
  ``max(1, ⌊D·(μ_l+β_l)/(μ_i+β_i)⌋)`` (the same regulation as MergeSFL Eq. 9);
* local updating frequency: τ_i = clip(round(τ·D·(μ_l+β_l) / (d_i·(μ_i+β_i))), τ_min, τ_max),
  i.e. every worker fills the fastest worker's τ-iteration round; workers too slow even at
  batch 1 do fewer iterations, workers whose batch was rounded down do more;
* learning rate ∝ batch size; the PS trains the top model on each worker's features
  separately (one top-model copy per worker, as SplitFed V1 — no feature merging);
* aggregation weighted by samples processed, d_i·τ_i.

Marked **proxy** (``splitfl.proxies``): τ_i is the heuristic above, not the paper's
control (its text is not here and the released code does not run).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.algorithms.mergesfl.batch_sizes import regulate_batch_sizes
from splitfl.algorithms.state_estimation import WorkerStateEstimator
from splitfl.config import ConfigError
from splitfl.core.plan import ClientTask, RoundPlan, RoundReport
from splitfl.core.topology import ServerSpec, Star


@dataclass(frozen=True)
class AdaSFLOptions(SplitOptions):
    cut: int | None = None
    tau: int = 30
    tau_min: int = 1
    tau_max: int = 60
    ema: float = 0.8
    lr_scaling: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.tau_min <= self.tau <= self.tau_max:
            raise ConfigError("options.adasfl.tau", "need 1 <= tau_min <= tau <= tau_max")
        if not 0 <= self.ema < 1:
            raise ConfigError("options.adasfl.ema", f"must be in [0, 1) (got {self.ema})")


def local_frequencies(
    batch: np.ndarray, mu: np.ndarray, beta: np.ndarray, tau: int, tau_min: int, tau_max: int
) -> np.ndarray:
    """τ_i filling the fastest worker's round τ·D·(μ_l+β_l) at each worker's own batch size."""
    per_sample = mu + beta
    fastest = int(np.argmin(per_sample))
    round_time = tau * batch.max() * per_sample[fastest]
    return np.clip(np.rint(round_time / (batch * per_sample)), tau_min, tau_max).astype(int)


class AdaSFL(Algorithm):
    name = "adasfl"
    paper = "Liao et al. (AdaSFL); baseline in ParallelSFL §5 (not in MergeSFL's, §V)"
    Options = AdaSFLOptions

    def __init__(self, options: AdaSFLOptions, ctx) -> None:
        super().__init__(options, ctx)
        self.state = WorkerStateEstimator(ctx, self.options.cut, options.ema)

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        mu, beta = self.state.estimates(round_idx)
        sel = np.asarray(clients)
        d_max = self.ctx.config.train.batch_size
        batch = regulate_batch_sizes(mu[sel], beta[sel], d_max)
        o = self.options
        taus = local_frequencies(batch, mu[sel], beta[sel], o.tau, o.tau_min, o.tau_max)
        lr = self.ctx.lr_at(round_idx)
        tasks = [
            ClientTask(
                int(c), self.state.cut, i, int(d), int(t), lr * (d / d_max if o.lr_scaling else 1)
            )
            for i, (c, d, t) in enumerate(zip(sel, batch, taus, strict=True))
        ]
        info = {"batch_sizes": batch.tolist(), "local_steps": taus.tolist()}
        return RoundPlan(
            tasks, topology=Star(server=ServerSpec(device_grad="own", lr=lr)), info=info
        )

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        self.state.observe(round_idx, plan, report)

    def aggregate(self, global_state, plan: RoundPlan, result) -> dict:
        """Weights ∝ samples processed (d_i·τ_i)."""
        weights = {u.client: float(u.samples) for u in result.updates}
        return layerwise_aggregate(
            global_state, result.updates, result.server_states, weights, self.aggregation
        )

    def state_dict(self) -> dict:
        return {"workers": self.state.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.state.load_state_dict(state["workers"])

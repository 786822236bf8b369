"""ParallelSFL (Liao et al., "ParallelSFL: A Novel Split Federated Learning Framework Tackling
Heterogeneity Issues"): spec ``papers/parallelsfl.md`` §3.3–4.5 (Alg. 1, Eq. 2–18).

Every worker takes part each round, in clusters: each cluster has one *top worker* holding the
top submodel (its own data do not train) and N_c bottom workers that exchange smashed data and
gradients with it every iteration over device-to-device links (Eq. 2–3: bottom workers step
on their own mean loss; the top model steps on the mean over its members — the executor's
merged group step with equal batch sizes). After τ_c iterations the top worker averages the
bottom submodels (Eq. 4) and sends bottom + top to the PS, which aggregates the spliced models
with weights N_c·τ_c (Eq. 18). With per-worker weights τ_c in
:func:`~splitfl.algorithms.aggregation.layerwise_aggregate`, the bottom blocks get exactly
Eq. (4) followed by Eq. (18) and each cluster's top copy gets weight N_c·τ_c.

* **State monitoring (§4.2, Eq. 6–7):** moving averages (``ema``) of each worker's bottom
  iteration time μ_b, top iteration time per bottom batch μ_p and pairwise transmission times
  β_ij (probes of the previous round's profiles; D2D rate = the slower radio).
  Ingress budget of worker i (Eq. 8): its download rate × a reference iteration time (the
  median over workers of μ_b + mean_j β_ij) × ``ingress_scale`` — bytes it can receive per
  iteration; b = D·(q + label bytes).
* **Clustering (Alg. 1) and τ_c (Eq. 15–17):** :mod:`splitfl.algorithms.parallelsfl_control`
  (K-means on label-distribution vectors with K = ``k`` or N/5, greedy top/bottom assignment
  under Eq. 8/10, swap fine-tuning of Σ U_c with ``lam``, per-cluster τ_c).
* **Cost:** :func:`~splitfl.system.cost.clustered_client_cost` — D2D traffic (bottom model,
  activations, gradients) separate from top↔PS model traffic.
* **Ablations (§5.4):** ``parallelsfl-WC`` (fixed τ for every cluster) and ``parallelsfl-R``
  (random clusters and top workers, fixed τ).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.algorithms.aggregation import layerwise_aggregate
from splitfl.algorithms.base import Algorithm, ClientTask, RoundPlan, RoundReport
from splitfl.algorithms.mergesfl_control import moving_average
from splitfl.algorithms.parallelsfl_control import plan_clusters
from splitfl.system.cost import clustered_client_cost, d2d_rate


@dataclass(frozen=True)
class ParallelSFLOptions:
    cut: int | None = None
    tau: int = 30
    lam: float = 0.5
    k: int | None = None
    ema: float = 0.8
    ingress_scale: float = 1.0
    random_clusters: bool = False
    adaptive_tau: bool = True
    max_passes: int = 20

    def __post_init__(self) -> None:
        from splitfl.config import ConfigError

        checks = {
            "tau": self.tau >= 1,
            "lam": 0 <= self.lam <= 1,
            "k": self.k is None or self.k >= 1,
            "ema": 0 <= self.ema < 1,
            "ingress_scale": 0 < self.ingress_scale <= 1e6,
            "max_passes": self.max_passes >= 0,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"options.parallelsfl.{name}", f"invalid {getattr(self, name)!r}")


class ParallelSFL(Algorithm):
    name = "parallelsfl"
    paper = "Liao et al., ParallelSFL §3.3-4.5 (Alg. 1, Eq. 2-18)"
    Options = ParallelSFLOptions

    def __init__(self, options: ParallelSFLOptions, ctx) -> None:
        super().__init__(options, ctx)
        self.cut = ctx.resolve_cut(options.cut, self.name)
        self.mu_b: np.ndarray | None = None
        self.mu_p: np.ndarray | None = None
        self.beta: np.ndarray | None = None
        self.tops: dict[int, int] = {}
        self.members: dict[int, int] = {}

    # -- state monitoring (Eq. 6-7) ------------------------------------------------------------
    def bytes_per_iteration(self) -> float:
        d = self.ctx.config.train.batch_size
        return d * (
            self.ctx.profile.activation_bytes(self.cut) + self.ctx.config.devices.label_bytes
        )

    def probe(self, round_idx: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        devices = [
            self.ctx.population.at(c, max(round_idx - 1, 0)) for c in range(self.ctx.num_clients)
        ]
        d = self.ctx.config.train.batch_size
        prof = self.ctx.profile
        flops = np.array([dev.flops for dev in devices])
        mu_b = d * prof.device_flops(self.cut) / flops
        mu_p = d * prof.server_flops(self.cut) / flops
        per_iter = self.bytes_per_iteration() + d * prof.activation_bytes(self.cut)
        n = len(devices)
        beta = np.zeros((n, n))
        for i in range(n):
            for j in range(i + 1, n):
                beta[i, j] = beta[j, i] = per_iter / d2d_rate(devices[i], devices[j])
        return mu_b, mu_p, beta

    def estimates(self, round_idx: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        mu_b, mu_p, beta = self.probe(round_idx)
        a = self.options.ema
        self.mu_b = moving_average(self.mu_b, mu_b, a)
        self.mu_p = moving_average(self.mu_p, mu_p, a)
        self.beta = moving_average(self.beta, beta, a)
        return self.mu_b, self.mu_p, self.beta

    def ingress(self, round_idx: int, mu_b: np.ndarray, beta: np.ndarray) -> np.ndarray:
        """Eq. (8) budget per worker in bytes per iteration (see module docstring)."""
        n = len(mu_b)
        mean_beta = beta.sum(1) / max(n - 1, 1)
        t_ref = float(np.median(mu_b + mean_beta))
        down = np.array([self.ctx.population.at(c, round_idx).downlink for c in range(n)])
        return down * t_ref * self.options.ingress_scale

    # -- hooks ---------------------------------------------------------------------------------
    def select_clients(self, round_idx: int, rng: np.random.Generator) -> list[int]:
        """Every worker takes part (as a top or a bottom worker)."""
        return list(range(self.ctx.num_clients))

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        mu_b, mu_p, beta = self.estimates(round_idx)
        dists = self.ctx.label_hist / np.maximum(self.ctx.label_hist.sum(1, keepdims=True), 1)
        full = self.ctx.profile.total_bytes
        beta_ps = np.array(
            [
                2 * full / self.ctx.population.at(c, max(round_idx - 1, 0)).uplink
                for c in range(self.ctx.num_clients)
            ]
        )
        o = self.options
        clusters, taus, info = plan_clusters(
            dists,
            mu_b,
            mu_p,
            beta,
            self.ingress(round_idx, mu_b, beta),
            self.bytes_per_iteration(),
            rng,
            tau=o.tau,
            k=o.k,
            lam=o.lam,
            beta_ps=beta_ps,
            max_passes=o.max_passes,
            random_assignment=o.random_clusters,
            adaptive_tau=o.adaptive_tau,
        )
        lr = self.ctx.lr_at(round_idx)
        d = self.ctx.config.train.batch_size
        tasks, self.tops, self.members = [], {}, {}
        for g, ((top, members), tau_c) in enumerate(zip(clusters, taus.tolist(), strict=True)):
            if not members or tau_c < 1:
                continue
            self.tops[g], self.members[g] = int(top), len(members)
            tasks += [ClientTask(int(c), self.cut, g, d, int(tau_c), lr) for c in members]
        summary = {k: v for k, v in info.items() if not isinstance(v, list | np.ndarray)}
        summary["tops"] = sorted(self.tops.values())
        summary["taus"] = [int(t) for t in taus if t > 0]
        return RoundPlan(tasks, "per_step", "mean", "own", server_lr=lr, info=summary)

    def client_cost(self, task: ClientTask, samples: int, round_idx: int, plan: RoundPlan):
        pop = self.ctx.population
        return clustered_client_cost(
            self.ctx.profile,
            task.cut,
            samples,
            task.steps,
            pop.at(task.client, round_idx),
            pop.at(self.tops[task.group], round_idx),
            self.members[task.group],
            self.ctx.config.devices.label_bytes,
        )

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        """Measured per-iteration bottom compute times (with jitter) refine μ_b."""
        for task in plan.tasks:
            cost = report.costs[task.client]
            measured = cost.device_time * report.jitter[task.client] / max(task.steps, 1)
            self.mu_b[task.client] = moving_average(
                self.mu_b[task.client], measured, self.options.ema
            )

    def aggregate(self, global_state, plan: RoundPlan, result) -> dict:
        """Eq. (4) + Eq. (18): per-worker weight τ_c (cluster weight N_c·τ_c)."""
        weights = {t.client: float(t.steps) for t in plan.tasks}
        return layerwise_aggregate(global_state, result.updates, result.server_states, weights)

    def state_dict(self) -> dict:
        return {"mu_b": self.mu_b, "mu_p": self.mu_p, "beta": self.beta}

    def load_state_dict(self, state: dict) -> None:
        self.mu_b, self.mu_p, self.beta = state["mu_b"], state["mu_p"], state["beta"]

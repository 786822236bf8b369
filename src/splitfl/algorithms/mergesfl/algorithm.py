"""MergeSFL (Liao et al., "MergeSFL: Split Federated Learning with Feature Merging and Batch
Size Regulation"): spec ``papers/mergesfl.md`` §IV (Alg. 1, Eq. 5–17).

* State estimation (§IV-A, Eq. 5–6):
  :class:`~splitfl.algorithms.state_estimation.WorkerStateEstimator`.
* PS ingress budget B^h (§IV-A, Eq. 10): :mod:`~splitfl.algorithms.mergesfl.ingress`;
  ``budget_time``, ``budget`` choose how it is turned into bytes.
* Worker arrangement (Alg. 1, Eq. 9, 13, 14): :mod:`splitfl.algorithms.mergesfl.arrangement`.
* Training (§IV-B): η_i = η·d_i/D (Eq. 15), feature merging (Eq. 16, ``merge``), bottom
  models aggregated ∝ d_i (Eq. 17).
* Ablations (§V-D): ``mergesfl-w/o-FM``, ``mergesfl-w/o-BR``.

How each sentence of the paper is read, and why: ``docs/explanation/readings/mergesfl.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.algorithms.mergesfl.arrangement import arrange_workers
from splitfl.algorithms.mergesfl.finetune import load_solver
from splitfl.algorithms.mergesfl.ingress import update_ingress
from splitfl.algorithms.state_estimation import WorkerStateEstimator
from splitfl.config import ConfigError
from splitfl.core.plan import ClientTask, RoundPlan, RoundReport
from splitfl.core.topology import GROUP_FORWARDS, ServerSpec, Star

#: Where B^h comes from (see the module docstring).
BUDGETS = ("measured", "clients_per_round")
#: The iteration time that turns B^h into bytes per iteration (see the module docstring).
BUDGET_TIMES = ("own_link", "shared")


@dataclass(frozen=True)
class MergeSFLOptions(SplitOptions):
    cut: int | None = None
    tau: int = 30
    ema: float = 0.8
    epsilon: float = 0.01
    budget: str = "measured"
    budget_time: str = "own_link"
    fill_budget: bool = True
    feature_merging: bool = True
    batch_regulation: bool = True
    lr_scaling: bool = True
    ga_population: int = 20
    ga_generations: int = 40
    ga_mutation_rate: float = 0.05
    ga_crossover_rate: float = 0.9
    ga_elite: int = 2
    init_fraction: float = 0.5
    merge: str = "concat"

    def __post_init__(self) -> None:
        if self.merge not in GROUP_FORWARDS:
            raise ConfigError("options.mergesfl.merge", f"allowed: {', '.join(GROUP_FORWARDS)}")
        if self.budget not in BUDGETS:
            raise ConfigError("options.mergesfl.budget", f"allowed: {', '.join(BUDGETS)}")
        if self.budget_time not in BUDGET_TIMES:
            raise ConfigError("options.mergesfl.budget_time", f"allowed: {', '.join(BUDGET_TIMES)}")

        checks = {
            "tau": self.tau >= 1,
            "ema": 0 <= self.ema < 1,
            "epsilon": 0 <= self.epsilon <= 100,  # a KL bound; log(classes) is the most
            "ga_population": self.ga_population >= 2,
            "ga_generations": self.ga_generations >= 0,
            "ga_mutation_rate": 0 <= self.ga_mutation_rate <= 1,
            "ga_crossover_rate": 0 <= self.ga_crossover_rate <= 1,
            "ga_elite": 0 <= self.ga_elite < self.ga_population,
            "init_fraction": 0 < self.init_fraction <= 1,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(
                    f"options.mergesfl.{name}", f"invalid value {getattr(self, name)!r}"
                )


class MergeSFL(Algorithm):
    name = "mergesfl"
    needs_class_labels = "KL divergence of label distributions needs class labels"
    paper = "Liao et al., MergeSFL §IV (Alg. 1, Eq. 5-17)"
    Options = MergeSFLOptions
    coupled_round = "one merged batch per step (Eq. 16); units with feature_merging: false"

    def __init__(self, options: MergeSFLOptions, ctx) -> None:
        super().__init__(options, ctx)
        load_solver()  # before the run's thread limits (same numbers in every process)
        self.state = WorkerStateEstimator(ctx, self.cut, options.ema)
        self.participation = np.zeros(ctx.num_clients, dtype=np.int64)
        self.ingress_estimate: float | None = None

    @property
    def cut(self) -> int:
        return self.options.cut

    def budget(self, mu: np.ndarray, beta: np.ndarray) -> float:
        """Eq. (10)'s B^h in bytes per iteration (see the module docstring)."""
        d_max = self.ctx.config.train.batch_size
        c = self.state.bytes_per_sample()
        measured = self.ingress_estimate is not None and self.state.any_measured
        if self.options.budget == "clients_per_round" or not measured:
            return self.ctx.config.train.clients_per_round * d_max * c
        if self.options.budget_time == "own_link":
            beta = self.state.own_link_beta()
        return self.ingress_estimate * d_max * float(np.min(mu + beta))

    # -- hooks ---------------------------------------------------------------------------------
    def select_clients(self, round_idx: int, rng: np.random.Generator) -> list[int]:
        """Alg. 1 chooses the workers itself (in :meth:`plan_round`); offer all of them."""
        return list(range(self.ctx.num_clients))

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        mu, beta = self.state.estimates(round_idx)
        dists = self.ctx.label_hist / np.maximum(self.ctx.label_hist.sum(1, keepdims=True), 1)
        d_max = self.ctx.config.train.batch_size
        budget = self.budget(mu, beta)
        selected, batch, info = arrange_workers(
            dists,
            mu,
            beta,
            self.participation,
            self.state.bytes_per_sample(),
            budget,
            d_max,
            self.options.epsilon,
            rng,
            tau=self.options.tau,
            fill_budget=self.options.fill_budget,
            population=self.options.ga_population,
            generations=self.options.ga_generations,
            mutation_rate=self.options.ga_mutation_rate,
            crossover_rate=self.options.ga_crossover_rate,
            elite=self.options.ga_elite,
            init_fraction=self.options.init_fraction,
        )
        if not self.options.batch_regulation:
            batch = np.full_like(batch, max(1, int(round(batch.mean()))))
        lr = self.ctx.lr_at(round_idx)
        tasks = []
        for i, (c, d) in enumerate(zip(selected.tolist(), batch.tolist(), strict=True)):
            scale = d / d_max if self.options.lr_scaling else 1.0
            group = 0 if self.options.feature_merging else i
            tasks.append(ClientTask(c, self.cut, group, int(d), self.options.tau, lr * scale))
        info = {k: float(v) for k, v in info.items()}
        info["batch_sizes"] = [int(d) for d in batch]
        info["ingress_estimate"] = self.ingress_estimate
        info["budget"] = float(budget)
        server = ServerSpec(device_grad="own", lr=lr, forward=self.options.merge)
        return RoundPlan(tasks, topology=Star(server=server), info=info)

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        """Participants' measured μ̂, β̂ enter the moving averages; K_i and B^h are updated."""
        self.state.observe(round_idx, plan, report)
        for task in plan.tasks:
            self.participation[task.client] += 1
        self.ingress_estimate = update_ingress(self.ingress_estimate, report, self.options.ema)

    def aggregate(self, global_state, plan: RoundPlan, result) -> dict:
        """Eq. (17): bottom models weighted by batch size d_i (top model: the PS's copy)."""
        weights = {t.client: float(t.batch_size) for t in plan.tasks}
        return layerwise_aggregate(
            global_state, result.updates, result.server_states, weights, self.aggregation
        )

    def state_dict(self) -> dict:
        return {
            "workers": self.state.state_dict(),
            "participation": self.participation.tolist(),
            "ingress_estimate": self.ingress_estimate,
        }

    def load_state_dict(self, state: dict) -> None:
        self.state.load_state_dict(state["workers"])
        self.participation = np.asarray(state["participation"], dtype=np.int64)
        self.ingress_estimate = state["ingress_estimate"]

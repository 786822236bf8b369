"""IFCA (Ghosh et al., "An Efficient Framework for Clustered Federated Learning", NeurIPS
2020) — baseline of ParallelSFL §5: clustered FL where each client picks the cluster model
with the lowest loss on its own data.

Each round the selected clients download every cluster model, choose the one with the lowest
loss on their own samples (:meth:`IFCA.estimate_cluster`, Alg. 1's cluster identity
estimation) and train it; the server averages each cluster's returned models.

Marked **proxy** (``splitfl.proxies``): the central-test-set evaluation with the most
chosen cluster model is not IFCA's per-client evaluation. The choices, the cost and where the
identity is computed: ``docs/explanation/readings/ifca.md``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.algorithms.base import Algorithm
from splitfl.config import ConfigError
from splitfl.core.plan import Charge, RoundPlan, RoundResult
from splitfl.core.seeding import derive_seed
from splitfl.models.base import lowest_loss_state
from splitfl.system.cost import FORWARD_SHARE


@dataclass(frozen=True)
class IFCAOptions:
    num_clusters: int = 2
    estimate_samples: int = 64

    def __post_init__(self) -> None:
        if self.num_clusters < 1:
            raise ConfigError("options.ifca.num_clusters", "must be >= 1")
        if self.estimate_samples < 1:
            raise ConfigError("options.ifca.estimate_samples", "must be >= 1")


@dataclass(frozen=True)
class ClusterChoice:
    """The round's cluster identity of each participant (client → model index)."""

    of: dict[int, int]


class IFCA(Algorithm):
    name = "ifca"
    paper = "Ghosh et al., IFCA (NeurIPS 2020); baseline in ParallelSFL §5"
    splits_model = False  # every client trains the whole model
    Options = IFCAOptions
    training_signals = "each client picks the cluster model with the lowest loss on its data"
    timing_stand_in = (
        "the losses of the untrained cluster models (zero inputs with data.train_samples); "
        "time and traffic do not depend on the choice (all K models are downloaded)"
    )
    no_server_optimizer = (
        "holds K cluster models and serves each client its cluster's, while the round's "
        "aggregate is only the most chosen one (a server step would need state per cluster)"
    )

    def __init__(self, options: IFCAOptions, ctx) -> None:
        super().__init__(options, ctx)
        if options.num_clusters > ctx.num_clients:  # a cluster per client at most
            raise ConfigError(
                "options.ifca.num_clusters", f"must be <= data.num_clients ({ctx.num_clients})"
            )
        self.models: list[dict[str, torch.Tensor]] = []
        for k in range(options.num_clusters):
            model = copy.deepcopy(ctx.model)
            if k > 0:  # cluster 0 is the run's initial model; others re-initialised
                torch.manual_seed(derive_seed(ctx.config.seed, "ifca", k))
                for module in model.modules():
                    if hasattr(module, "reset_parameters") and module is not model:
                        module.reset_parameters()
            self.models.append({n: t.clone() for n, t in model.state_dict().items()})
        self.chosen_count = np.zeros(options.num_clusters, dtype=np.int64)

    def estimate_size(self, client: int) -> int:
        """Samples the identity is estimated on: ``min(|D_i|, estimate_samples)``."""
        return min(int(self.ctx.data_sizes[client]), self.options.estimate_samples)

    def estimate_positions(self, client: int, rng: np.random.Generator) -> np.ndarray:
        """Positions in the client's own samples of the :meth:`estimate_size` samples the
        identity is estimated on, drawn without replacement from ``rng`` (the round's plan
        stream)."""
        n = len(self.ctx.client_indices[client])
        return rng.choice(n, size=self.estimate_size(client), replace=False)

    def client_samples(
        self, client: int, rng: np.random.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The client's own samples at :meth:`estimate_positions`."""
        take = torch.as_tensor(
            self.ctx.client_indices[client][self.estimate_positions(client, rng)]
        )
        return self.ctx.bundle.train.x[take], self.ctx.bundle.train.y[take]

    def estimate_cluster(self, client: int, rng: np.random.Generator) -> int:
        """Cluster identity: argmin over the K cluster models of the loss on the client's own
        samples (:func:`~splitfl.models.base.lowest_loss_state`) — on the client's device
        when the devices hold the data (``ctx.client_compute``)."""
        remote = getattr(self.ctx, "client_compute", None)
        if remote is not None:
            return remote.lowest_loss(client, self.models, self.estimate_positions(client, rng))
        x, y = self.client_samples(client, rng)
        return lowest_loss_state(self.ctx.model, self.models, x, y, self.ctx.config.train.loss)

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        full = self.ctx.num_blocks
        clusters = [self.estimate_cluster(c, rng) for c in clients]
        tasks = [self.make_task(c, full, i, round_idx) for i, c in enumerate(clients)]
        for task, k in zip(tasks, clusters, strict=True):
            task.init_state = self.models[k]
            task.charge = self.identity_charge(task.client)
        chosen = ClusterChoice({c: int(k) for c, k in zip(clients, clusters, strict=True)})
        return RoundPlan(tasks, info={"clusters": clusters}, control=chosen)

    def identity_charge(self, client: int) -> Charge:
        """IFCA's identity estimate on the device, beyond the shared cost model: (K−1) extra
        full-model downloads (each one more exchange with ``devices.exchange_latency_s``) and
        K forward passes of the whole model over :meth:`estimate_size` samples."""
        k, prof = self.options.num_clusters, self.ctx.profile
        per_sample = FORWARD_SHARE * prof.total_flops
        return Charge(
            extra_down=(k - 1) * prof.total_bytes,
            extra_exchanges=k - 1,
            extra_device_flops=k * self.estimate_size(client) * per_sample,
        )

    def aggregate(self, global_state, plan: RoundPlan, result: RoundResult) -> dict:
        by_client = {u.client: u for u in result.updates}
        for k in range(self.options.num_clusters):
            members = [by_client[t.client] for t in plan.tasks if plan.control.of[t.client] == k]
            if members:
                weights = {u.client: float(self.ctx.data_sizes[u.client]) for u in members}
                self.models[k] = layerwise_aggregate(
                    self.models[k], members, {}, weights, self.aggregation
                )
                self.chosen_count[k] += len(members)
        return {n: t.clone() for n, t in self.models[int(np.argmax(self.chosen_count))].items()}

    def state_dict(self) -> dict:
        return {"models": self.models, "chosen_count": self.chosen_count.tolist()}

    def load_state_dict(self, state: dict) -> None:
        self.models = state["models"]
        self.chosen_count = np.asarray(state["chosen_count"], dtype=np.int64)

"""LocFedMix-SL (Oh et al., "LocFedMix-SL: Localize, Federate, and Mix for Improved
Scalability, Convergence, and Latency in Split Learning", WWW 2022) — baseline of MergeSFL
§V and ParallelSFL §5.

No official code exists; splitfl implements the three mechanisms the title and the citing
papers name: **Localize** (a local loss through an auxiliary head on the device), **Federate**
(device parts FedAvg-ed every ``aggregate_every`` rounds, MergeSFL §V), **Mix** (one server
top model trained on all smashed data plus mixup of client pairs, ``mixup_alpha``). Fixed
batch size and ``tau``; clients selected uniformly at random.

Marked **proxy** (``splitfl.proxies``): the local loss is a cross-entropy auxiliary model, not
the paper's InfoPro-style auxiliary network. Where each choice comes from:
``docs/explanation/readings/locfedmix_sl.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from splitfl.aggregation.layerwise import layerwise_aggregate, robust_average
from splitfl.algorithms.aux_model import AuxModel
from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.config import ConfigError
from splitfl.core.plan import Charge, ClientTask, IdleUpload, RoundPlan, RoundResult
from splitfl.core.topology import LocalLoss, ServerSpec, Star
from splitfl.models.base import block_index

#: ``options.locfedmix_sl.device_update``'s values (:class:`LocFedMixOptions`).
DEVICE_UPDATES = ("local", "local+server")


@dataclass(frozen=True)
class LocFedMixOptions(SplitOptions):
    cut: int | None = None
    tau: int = 30
    aggregate_every: int = 2
    mixup_alpha: float = 1.0
    aux_model: str = "linear"
    #: ``local``: the device steps on its auxiliary loss only, no gradient comes back (the
    #: title's "Localize"; splitfl's default); ``local+server``: the PS also
    #: sends each batch's activation gradient back and the device steps on both — MergeSFL
    #: §II-B: "the PS directly applies the features of each worker to complete the
    #: forward/backward propagation of the top model, and sends the corresponding gradients
    #: back to the workers in sequence"; ParallelSFL §2: it maintains "all the benefits of
    #: SplitFed and LocSplitFed" (issue 50 item 2).
    device_update: str = "local"

    def __post_init__(self) -> None:
        if self.tau < 1:
            raise ConfigError("options.locfedmix_sl.tau", f"must be >= 1 (got {self.tau})")
        if self.aggregate_every < 1:
            raise ConfigError("options.locfedmix_sl.aggregate_every", "must be >= 1")
        if not 0 < self.mixup_alpha <= 100:
            raise ConfigError("options.locfedmix_sl.mixup_alpha", "must be in (0, 100]")
        if self.device_update not in DEVICE_UPDATES:
            raise ConfigError(
                "options.locfedmix_sl.device_update",
                f"must be one of {', '.join(DEVICE_UPDATES)} "
                f"(got {str(self.device_update)[:40]!r})",
            )


@dataclass(frozen=True)
class AggregationRound:
    """Whether this round's device parts are uploaded and averaged (every ``aggregate_every``)."""

    aggregated: bool


class LocFedMixSL(Algorithm):
    name = "locfedmix_sl"
    paper = "Oh et al., LocFedMix-SL (WWW 2022); baseline in MergeSFL/ParallelSFL §V/§5"
    Options = LocFedMixOptions
    coupled_round = "one server copy for all clients (mixup pairs across them)"
    no_server_optimizer = (
        "keeps each client's device part and auxiliary head between its FedAvg rounds "
        "(aggregate_every), so a round's aggregate is not the model every client starts from"
    )

    def __init__(self, options: LocFedMixOptions, ctx) -> None:
        super().__init__(options, ctx)
        self.cut = self.options.cut
        self.local: dict[int, dict[str, torch.Tensor]] = {}  # device parts since last FedAvg
        self.local_aux: dict[int, dict[str, torch.Tensor]] = {}
        field = "options.locfedmix_sl.aux_model"
        self.aux_model = AuxModel.of(ctx, options.aux_model, self.cut, field)
        self.global_aux: dict[str, torch.Tensor] = self.aux_model.initial

    def is_aggregation_round(self, round_idx: int) -> bool:
        return (round_idx + 1) % self.options.aggregate_every == 0

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        lr = self.ctx.lr_at(round_idx)
        b = self.ctx.config.train.batch_size
        upload = self.is_aggregation_round(round_idx)
        tasks = [
            ClientTask(
                c,
                self.cut,
                0,
                b,
                self.options.tau,
                lr,
                init_state=self.local.get(c),
                aux_state=self.local_aux.get(c, self.global_aux),
                download_model=c not in self.local,
                upload_model=upload,
                # the auxiliary model's device FLOPs; it travels with the device part
                charge=Charge(
                    aux_flops=self.aux_model.flops,
                    aux_down=self.aux_model.bytes if c not in self.local else 0.0,
                    aux_up=self.aux_model.bytes if upload else 0.0,
                ),
            )
            for c in clients
        ]
        # at an aggregation round, every client of the local table that is not a participant
        # uploads its device part and auxiliary model (upload only)
        idle = {
            c: IdleUpload(self.cut, aux_up=self.aux_model.bytes)
            for c in sorted(self.local)
            if upload and c not in set(clients)
        }
        server = ServerSpec(lr=lr, mixup=self.options.mixup_alpha)
        return RoundPlan(
            tasks,
            topology=Star(server=server),
            device_update=LocalLoss(
                aux=self.aux_model.spec,
                server_gradient=self.options.device_update == "local+server",
            ),
            idle=idle,
            info={"aggregated": upload},
            control=AggregationRound(upload),
        )

    def aggregate(self, global_state, plan: RoundPlan, result: RoundResult) -> dict:
        """Top model: the server's copy. Device parts: kept per client; FedAvg-ed (with the
        auxiliary heads) every ``aggregate_every`` rounds over every client that trained."""
        for u in result.updates:
            self.local[u.client] = u.state
            self.local_aux[u.client] = u.aux_state
        weights = {u.client: float(self.ctx.data_sizes[u.client]) for u in result.updates}
        rule = self.aggregation
        new = layerwise_aggregate(global_state, result.updates, result.server_states, weights, rule)
        if not plan.control.aggregated:
            return {
                k: (global_state[k] if block_index(k) < self.cut else v) for k, v in new.items()
            }
        clients = sorted(self.local)
        w = [float(self.ctx.data_sizes[c]) for c in clients]
        device = robust_average([self.local[c] for c in clients], w, rule, global_state)
        aux = [self.local_aux[c] for c in clients]
        self.global_aux = robust_average(aux, w, rule, self.global_aux)
        self.local, self.local_aux = {}, {}
        return {**new, **device}

    def state_dict(self) -> dict:
        return {"local": self.local, "local_aux": self.local_aux, "global_aux": self.global_aux}

    def load_state_dict(self, state: dict) -> None:
        self.local, self.local_aux = state["local"], state["local_aux"]
        self.global_aux = state["global_aux"]

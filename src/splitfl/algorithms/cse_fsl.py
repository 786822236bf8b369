"""CSE-FSL (Mu & Shen, "Communication and Storage Efficient Federated Split Learning",
arXiv:2302.05599, 2023) as its authors' code runs it (HowDoIBlowUpTheMoon/ECSE-FL,
``src/cse_fsl_main.py``), with the schedule of FSL-SAGE's re-implementation
(srijith1996/FSL-SAGE, ``src/algos/cse_fsl.py``) as an option.

Each client trains its device part on a local loss through an auxiliary model
(``device_loss: local``), so no gradient is downloaded; smashed data go to the single server
model every ``upload_every`` (h) batches, in the turns ``schedule`` sets; after the round the
device parts and auxiliary models are averaged with data-size weights.

Where each choice comes from (option: source), and what is not reproduced:
``docs/explanation/readings/cse_fsl.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.aggregation.layerwise import robust_average
from splitfl.algorithms.aux_model import AuxModel
from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.config import ConfigError
from splitfl.core.plan import Charge, RoundPlan, RoundResult
from splitfl.core.topology import LocalLoss, Turns

SCHEDULES = ("interleaved", "sequential")


@dataclass(frozen=True)
class CSEFSLOptions(SplitOptions):
    cut: int | None = None
    upload_every: int = 5
    schedule: str = "interleaved"
    aux_model: str = "linear"

    def __post_init__(self) -> None:
        if self.upload_every < 1:
            raise ConfigError("options.cse_fsl.upload_every", "must be >= 1")
        if self.schedule not in SCHEDULES:
            raise ConfigError("options.cse_fsl.schedule", f"must be one of {', '.join(SCHEDULES)}")


class CSEFSL(Algorithm):
    name = "cse_fsl"
    paper = "Mu & Shen, CSE-FSL (arXiv:2302.05599); authors' code HowDoIBlowUpTheMoon/ECSE-FL"
    Options = CSEFSLOptions
    topology = Turns
    coupled_round = "one server model trained on every client's uploads"

    def __init__(self, options: CSEFSLOptions, ctx) -> None:
        super().__init__(options, ctx)
        self.cut = self.options.cut
        self.aux_model = AuxModel.of(ctx, options.aux_model, self.cut, "options.cse_fsl.aux_model")
        self.aux = self.aux_model.initial  # the averaged auxiliary model every client gets
        self.h, self.adapted = self.options.upload_every, ""
        self._fit_turn(ctx)
        for c in range(ctx.num_clients):  # refused before the run starts, not in its round
            self.steps(c)

    def _fit_turn(self, ctx) -> None:
        """The default turn of h = 5 batches where some client has fewer batches per round
        (the quickstart's small clients): the interleaved schedule's turns are whole
        (ECSE-FL), so h becomes the fewest batches any client has, said in a ``note:``
        line; an ``upload_every`` the config sets is kept (and refused in :meth:`steps`)."""
        given = {
            **ctx.config.options.get(self.name, {}),
            **ctx.config.options.get(ctx.config.algorithm, {}),
        }
        if self.options.schedule != "interleaved" or "upload_every" in given:
            return
        fewest = min((ctx.local_steps(c) for c in range(ctx.num_clients)), default=0)
        if 1 <= fewest < self.h:
            self.adapted = (
                f"options.cse_fsl.upload_every: {self.h} → {fewest}, the fewest batches a "
                "client has per round (a turn of the interleaved schedule is whole; set "
                f"upload_every to keep {self.h})"
            )
            self.h = fewest

    def notes(self) -> list[str]:
        """The turn length adapted to the clients' batches (:meth:`_fit_turn`), if it was."""
        return [self.adapted] if self.adapted else []

    def steps(self, client: int) -> int:
        """Batches per round: one epoch (``train.local_epochs``/``local_steps``); in the
        interleaved schedule only whole turns of h (ECSE-FL)."""
        steps, h = self.ctx.local_steps(client), self.h
        if self.options.schedule == "sequential":
            return steps
        if steps < h:
            raise ConfigError(
                "options.cse_fsl.upload_every",
                f"client {client} has {steps} batches per round, fewer than one turn of {h}",
            )
        return steps // h * h

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        tasks = []
        for c in clients:
            task = self.make_task(c, self.cut, 0, round_idx)
            task.steps, task.aux_state = self.steps(c), self.aux
            # the auxiliary model's device FLOPs; it travels down and up with the device part
            size = self.aux_model.bytes
            task.charge = Charge(aux_flops=self.aux_model.flops, aux_down=size, aux_up=size)
            tasks.append(task)
        h, interleaved = self.h, self.options.schedule == "interleaved"
        mode = "round_robin" if interleaved else "sequential"
        return RoundPlan(
            tasks,
            topology=Turns(order=tuple(sorted(clients)), mode=mode),
            device_update=LocalLoss(
                aux=self.aux_model.spec, upload_every=h, upload_phase=h - 1 if interleaved else 0
            ),
        )

    def aggregate(self, global_state, plan: RoundPlan, result: RoundResult) -> dict:
        """Device parts and the server model as every SFL round (data-size weights); the
        auxiliary models averaged with the same weights (ECSE-FL: ``aggregated_client_weights
        _auxiliary``)."""
        if result.updates:
            weights = [float(self.ctx.data_sizes[u.client]) for u in result.updates]
            aux = [u.aux_state for u in result.updates]
            self.aux = robust_average(aux, weights, self.aggregation, self.aux)
        return super().aggregate(global_state, plan, result)

    def state_dict(self) -> dict:
        return {"aux": self.aux}

    def load_state_dict(self, state: dict) -> None:
        self.aux = state["aux"]

"""CSE-FSL (Mu & Shen, "Communication and Storage Efficient Federated Split Learning",
arXiv:2302.05599, 2023) as its authors' code runs it (HowDoIBlowUpTheMoon/ECSE-FL,
``src/cse_fsl_main.py``), with the schedule of FSL-SAGE's re-implementation
(srijith1996/FSL-SAGE, ``src/algos/cse_fsl.py``) as an option.

Each client trains its device part with a *local* loss through an auxiliary model on its
smashed data (``device_loss: local``; ECSE-FL: ``local_output = auxiliary_model(local_smashed_
data)``, ``NLLLoss``, ``auxiliary_optimizer.step()``, ``splitting_output.backward(gradient)``),
so no gradient is ever downloaded. Smashed data go to the server only every ``upload_every``
(h) batches; the **single** server model takes one step on each upload (no server copies).
After the round the device parts and the auxiliary models are averaged with data-size
weights and sent back to every client (ECSE-FL: ``factor = dataset_size / total``; both codes
count ``2 × calculate_load`` for the client model and for the auxiliary model per client).

Choices the paper leaves open, as the code makes them (option: source):

* ``schedule: interleaved`` (default, ECSE-FL): clients take turns of h batches each (client 0
  batches 0..h−1, client 1 batches 0..h−1, …, client 0 batches h..2h−1, …); the upload is the
  turn's *last* batch (``cur_client_index == max_batch - 1``), so the server meets the clients'
  uploads in client order; batches beyond the last whole turn are not trained (``while
  max_batch <= batch_max_round``). ``sequential`` (FSL-SAGE's ``cse_fsl.py``): each client
  runs all its batches in turn, uploading at batches 0, h, 2h, … (``local_iter %
  server_update_interval == 0``).
* ``upload_every`` (h) default 5: FSL-SAGE's ``hydra_config/algorithm/cse_fsl.yaml``
  (``server_update_interval: 5``) and ECSE-FL's module comment (batches 0–4); ECSE-FL's
  argparse default ``-batch_round`` is 1.
* ``aux_model`` default ``linear``: ECSE-FL's CIFAR-10 auxiliary (``Auxiliary_model_cifar``:
  one linear layer on the flattened smashed data, ``log_softmax``); FSL-SAGE's CSE-FSL uses its
  ResNet auxiliary (``resnet_stage``) with ResNet models.
* Optimisers: ECSE-FL uses SGD with one learning rate for the client, auxiliary and server
  models; here the device part and the auxiliary model share one ``train.optimizer`` (a fresh
  one each round, as every splitfl algorithm), the server copy another.

Not reproduced: ECSE-FL's ``comm_load`` adds smashed-data bytes to model megabytes
(``calculate_load`` returns MB there); splitfl counts bytes throughout. ECSE-FL's
``init_all(normal(0, 0.05))`` initialisation of all three models: splitfl's models keep their
own initialisation.
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
        for c in range(ctx.num_clients):  # refused before the run starts, not in its round
            self.steps(c)

    def steps(self, client: int) -> int:
        """Batches per round: one epoch (``train.local_epochs``/``local_steps``); in the
        interleaved schedule only whole turns of h (ECSE-FL)."""
        steps, h = self.ctx.local_steps(client), self.options.upload_every
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
        h, interleaved = self.options.upload_every, self.options.schedule == "interleaved"
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

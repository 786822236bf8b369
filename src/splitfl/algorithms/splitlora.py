"""SplitLoRA (Lin et al., "SplitLoRA: A Split Parameter-Efficient Fine-Tuning Framework for Large
Language Models", 2024), as the authors' released code runs it (``FDU-INC/Split_LoRA``,
``SplitLoRA/examples/src/gpt2_ft_sfl.py``; the paper is not in ``../shared/papers``).

* **One shared server model, clients in turn per batch.** The clients take turns, one
  mini-batch each: client i's forward to the cut, the server's forward, loss and step on that
  batch, then client i's backward and step; the next client's batch meets the server model the
  previous batch just updated (``server_mode: round_robin``, in ``order``: the clients in id
  order, as the code's ``for i in range(num_clients)``).
* **Client-side LoRA averaged every** ``aggregate_step`` **training steps** (100 in the code,
  counted over all clients' steps): a round here is ``aggregate_step`` steps, each client
  taking ``aggregate_step // N`` turns (at least one), after which the device parts are
  averaged with equal weights (the code's ``fed_avg``: a plain mean). Only the LoRA tensors
  change under ``train.lora`` (the base is frozen), so the mean of the device parts is the
  code's mean of ``lora_A``/``lora_B``; the server model is the shared one.
* **Cut** after transformer block 3 (the code's ``block=3``): a Hugging Face model's default
  cut (:mod:`splitfl.models.hf`), or ``cut: 3``.

Differences from the code, stated: the code's optimisers (Adam, a linear schedule on the
server's) keep their state for the whole run, splitfl's for one round (``train.optimizer``);
the code collects each client's LoRA state at its *last forward* before the aggregation step,
i.e. before that step's update (an off-by-one of the snapshot), while this averages the
states after every client's last update; the code hard-codes 3 clients, here any
``train.clients_per_round``.

Time: each client's time is S²FL Eq. (1); the server's turn-taking is not added as queueing
delay (as SplitFed V2).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.config import ConfigError
from splitfl.core.plan import ClientTask, RoundPlan
from splitfl.core.topology import Turns


@dataclass(frozen=True)
class SplitLoRAOptions(SplitOptions):
    """``cut``: the device's blocks (null: the model's default cut, 3 for a Hugging Face
    model: embeddings + 3 transformer blocks, the code's); ``aggregate_step``: training steps
    over all clients between two averagings (the code's 100)."""

    cut: int | None = None
    aggregate_step: int = 100

    def __post_init__(self) -> None:
        if self.aggregate_step < 1:
            raise ConfigError(
                "options.splitlora.aggregate_step", f"must be >= 1 (got {self.aggregate_step})"
            )


class SplitLoRA(Algorithm):
    name = "splitlora"
    paper = "Lin et al. 2024, SplitLoRA (released code FDU-INC/Split_LoRA, gpt2_ft_sfl.py)"
    Options = SplitLoRAOptions
    topology = Turns
    coupled_round = "one server model serving the clients' batches in turn"

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        """Every selected client in one group, ``aggregate_step // N`` turns each, in id
        order."""
        cut = self.options.cut
        turns = max(1, self.options.aggregate_step // max(len(clients), 1))
        order = sorted(int(c) for c in clients)
        batch, lr = self.ctx.config.train.batch_size, self.ctx.lr_at(round_idx)
        tasks = [ClientTask(c, cut, 0, batch, turns, lr) for c in order]
        return RoundPlan(tasks, topology=Turns(order=tuple(order), mode="round_robin"))

    def aggregate(self, global_state, plan: RoundPlan, result) -> dict:
        """The code's ``fed_avg``: a plain mean of the device parts; the shared server model."""
        weights = {u.client: 1.0 for u in result.updates}
        return layerwise_aggregate(
            global_state, result.updates, result.server_states, weights, self.aggregation
        )

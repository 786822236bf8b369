"""SplitLoRA (Lin et al., "SplitLoRA: A Split Parameter-Efficient Fine-Tuning Framework for Large
Language Models", 2024), as the authors' released code runs it (``FDU-INC/Split_LoRA``,
``SplitLoRA/examples/src/gpt2_ft_sfl.py``; the paper is not in ``../shared/papers``).

One shared server model; the clients take turns, one mini-batch each; every
``aggregate_step`` training steps (a round) the device parts are averaged with equal weights;
cut after transformer block 3 (:mod:`splitfl.models.hf`). Time: each client's time is S²FL
Eq. (1), with no queueing delay for the turns (as SplitFed V2).

How the code is read, and the differences from it, stated:
``docs/explanation/readings/splitlora.md``.
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

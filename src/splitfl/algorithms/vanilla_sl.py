"""Vanilla split learning (Gupta & Raskar 2018; RingSFL §4.1.3 baseline): clients take turns
training one model split between client and server.

Each round the clients are served one after another (random order from the seed); each starts
from the device part the previous client trained and runs its local steps (``local_epochs`` ×
batches — RingSFL counts that as a round for comparison), with the single server part updated
at every step. The round is sequential, so its time is the *sum* of the clients' times and a
client waits for all the others. The global model after the round is the last client's device
part and the server part.

Round size (``round_steps``; RingSFL §4.1.3: "when vanilla SL updates local_epoch_num ×
batch_num steps, we treat it as a round"):

* ``per_client`` (default) — every client runs its own local steps, so a round is N × E·B
  updates (N× RingSFL's definition; kept as the default for the other papers' configs);
* ``shared`` — RingSFL's round: E·B updates in all (E·B = the mean of the participants' local
  steps, rounded), split among the clients in turn: ⌊E·B/N⌋ each, one more for the first
  E·B mod N in the round's order, and at least one per client (a round is max(E·B, N)
  updates). The authors' code (``StalRingSFL/alg/vanilla_sl.py``) hands the model to the next
  client after every batch; here each client runs its share as one block of consecutive steps
  (the executor's sequential chain) — the same number of updates per client and round.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.config import ConfigError
from splitfl.core.plan import ClientTask, RoundPlan
from splitfl.core.topology import Turns
from splitfl.models.base import block_index

#: ``round_steps`` values (see the module docstring).
ROUND_STEPS = ("per_client", "shared")


@dataclass(frozen=True)
class VanillaSLOptions(SplitOptions):
    """``cut``: block index of the split (null = the model's default cut: its paper's split,
    else its last candidate);
    ``round_steps``: ``per_client`` or ``shared`` (RingSFL §4.1.3)."""

    cut: int | None = None
    round_steps: str = "per_client"

    def __post_init__(self) -> None:
        if self.round_steps not in ROUND_STEPS:
            raise ConfigError(
                "options.vanilla_sl.round_steps",
                f"allowed: {', '.join(ROUND_STEPS)} (got {self.round_steps!r})",
            )


def shared_steps(total: int, order: list[int]) -> dict[int, int]:
    """RingSFL §4.1.3 round of ``total`` updates split over ``order``: ⌊total/N⌋ each, one
    more for the first ``total mod N`` clients, at least one per client."""
    base, extra = divmod(total, len(order))
    return {c: max(1, base + (i < extra)) for i, c in enumerate(order)}


class VanillaSL(Algorithm):
    name = "vanilla_sl"
    paper = "Gupta & Raskar 2018; RingSFL §4.1.3 baseline"
    Options = VanillaSLOptions
    topology = Turns
    aggregations = ("mean",)  # nothing is averaged: the model is the chain's last client's
    coupled_round = "one chain: each device starts from the previous one's part"

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        cut = self.options.cut
        tasks = [self.make_task(c, cut, 0, round_idx) for c in clients]
        order = [int(c) for c in rng.permutation(clients)]
        if self.options.round_steps == "shared":
            self._share_steps(tasks, order)
        info = {"local_steps": [t.steps for t in tasks]}
        topology = Turns(order=tuple(order), mode="sequential", chain=True)
        return RoundPlan(tasks, topology=topology, info=info)

    @staticmethod
    def _share_steps(tasks: list[ClientTask], order: list[int]) -> None:
        """``round_steps: shared``: E·B updates per round across the chain (in place)."""
        total = int(round(sum(t.steps for t in tasks) / len(tasks)))
        steps = shared_steps(total, order)
        for task in tasks:
            task.steps = steps[task.client]

    def aggregate(self, global_state, plan: RoundPlan, result) -> dict:
        last = next(u for u in result.updates if u.client == plan.topology.order[-1])
        server = result.server_states[0]
        return {
            k: (last.state[k] if block_index(k) < last.cut else server[k]).clone()
            for k in global_state
        }

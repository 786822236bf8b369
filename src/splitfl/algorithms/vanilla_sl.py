"""Vanilla split learning (Gupta & Raskar 2018; RingSFL §4.1.3 baseline): clients take turns
training one model split between client and server.

Each round the clients are served one after another (random order from the seed); each starts
from the device part the previous client trained and runs its local steps (``local_epochs`` ×
batches — RingSFL counts that as a round for comparison), with the single server part updated
at every step. The round is sequential, so its time is the *sum* of the clients' times and a
client waits for all the others. The global model after the round is the last client's device
part and the server part.
"""

from __future__ import annotations

import numpy as np

from splitfl.algorithms.base import Algorithm, RoundPlan
from splitfl.algorithms.splitfed_v1 import SplitFedOptions
from splitfl.models.base import block_index


class VanillaSL(Algorithm):
    name = "vanilla_sl"
    paper = "Gupta & Raskar 2018; RingSFL §4.1.3 baseline"
    Options = SplitFedOptions

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        cut = self.ctx.resolve_cut(self.options.cut, self.name)
        tasks = [self.make_task(c, cut, 0, round_idx) for c in clients]
        order = [int(c) for c in rng.permutation(clients)]
        return RoundPlan(tasks, server_mode="sequential", order=order, chain_devices=True)

    def round_time(self, times: dict[int, float]) -> tuple[float, dict[int, float]]:
        """Sequential clients: the round lasts the sum; each waits for all the others."""
        total = sum(times.values())
        return total, {c: total - t for c, t in times.items()}

    def aggregate(self, global_state, plan: RoundPlan, result) -> dict:
        last = next(u for u in result.updates if u.client == plan.order[-1])
        server = result.server_states[0]
        return {
            k: (last.state[k] if block_index(k) < last.cut else server[k]).clone()
            for k in global_state
        }

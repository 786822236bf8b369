"""SplitFed V2 (Thapa et al., AAAI 2022): one server-side model, clients served in turn.

The main server keeps a single server part. Each round the clients are served one after
another in a random order (drawn from the run's seed); each client runs all its local steps
against the current server part, which is updated after every step. Device parts start from
the global device part and are averaged (|D_i|-weighted) at the end of the round, as in the
official code's SFLV2.

Time: each client's time is S²FL Eq. (1); the server's sequential service is not added as
queueing delay (as in S²FL's cost model, which treats the server as uncontended).
"""

from __future__ import annotations

import numpy as np

from splitfl.algorithms.base import Algorithm
from splitfl.algorithms.splitfed_v1 import SplitFedOptions
from splitfl.core.plan import RoundPlan
from splitfl.core.topology import Turns


class SplitFedV2(Algorithm):
    name = "splitfed_v2"
    paper = "Thapa et al. 2022 (SplitFed, SFLV2)"
    Options = SplitFedOptions
    topology = Turns
    coupled_round = "one server copy serving the clients in turn"

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        cut = self.options.cut
        tasks = [self.make_task(c, cut, 0, round_idx) for c in clients]
        order = [int(c) for c in rng.permutation(clients)]
        return RoundPlan(tasks, topology=Turns(order=tuple(order), mode="sequential"))

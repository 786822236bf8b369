"""A training pattern written outside splitfl: *shuffled turns*.

Members of a group take turns with the group's one server copy, one step each, as SplitLoRA's
round robin does, but in a fresh random order every step (seeded: the plan carries the seed,
so every runtime draws the same orders). The three pieces a new pattern needs
(``docs/how-to/add-a-topology.md``):

1. the **payload** — a frozen, keyword-only dataclass subclassing
   :class:`splitfl.core.topology.Topology`, checked on construction;
2. the **family** — how a group's members meet the server copy (its ``schedule`` over
   :class:`splitfl.roles.fleet.SplitLoop`, the one split iteration every split pattern
   shares); registered with :func:`splitfl.topologies.register`, which also lets the plan
   travel to parallel workers;
3. an **algorithm** whose plans use the payload (here SplitFed V2's, in shuffled turns).

The family inherits everything else from :class:`splitfl.topologies.split.SplitFamily`:
units (one per group), the untrained round (``executor: timing``), the price (S²FL Eq. 1's
shared cost model), a server copy per group.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

import splitfl
from splitfl.algorithms.splitfed_v2 import SplitFedV2
from splitfl.core.plan import RoundPlan
from splitfl.core.topology import ServerSpec, Topology
from splitfl.roles.fleet import SplitLoop
from splitfl.topologies import register
from splitfl.topologies.split import SplitFamily


@dataclass(frozen=True, kw_only=True)
class ShuffledTurns(Topology):
    """One step per member in turn, in the order ``rng(seed + step).permutation``."""

    seed: int
    server: ServerSpec = field(default_factory=ServerSpec)

    def __post_init__(self) -> None:
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"ShuffledTurns.seed must be in [0, 2**63) (got {self.seed})")


class ShuffledTurnsFamily(SplitFamily):
    payload = ShuffledTurns
    summary = "shuffled turns: one step per member, a fresh seeded order every step"

    def schedule(self, fleet, server, run, plan):
        loop = SplitLoop.of(fleet, server, run, plan)
        fleet.begin(run.tasks, run.parts, run.aux)
        for step in range(max(t.steps for t in run.tasks)):
            active = [t for t in run.tasks if step < t.steps]
            order = np.random.default_rng(plan.topology.seed + step).permutation(len(active))
            for i in order:
                loop.iteration([active[i]], step)
        alive = [t.client for t in run.tasks if t.client not in fleet.dropped]
        return loop.updates(fleet.finish(alive))


register(ShuffledTurnsFamily())


@splitfl.register_algorithm
class ShuffledSplitFed(SplitFedV2):
    name = "shuffled_splitfed"
    paper = "SplitFed V2's shared server copy, members in shuffled turns (example)"
    topology = ShuffledTurns

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator):
        plan = super().plan_round(round_idx, clients, rng)
        seed = int(rng.integers(2**62))
        return RoundPlan(plan.tasks, topology=ShuffledTurns(seed=seed), info=plan.info)

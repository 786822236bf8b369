"""RingSFL's ring (Alg. 1–2) as a topology family: every client's batch goes around the ring
of devices, each running its propagation length of blocks on its own full local model
(:mod:`.member`: the numerics a member runs, in-process and on a networked device); no server
copy. A round is one coupled unit (never dealt to workers)."""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from splitfl.core.plan import ClientUpdate, RoundPlan, RoundResult
from splitfl.core.topology import Ring
from splitfl.models import BlockModel, ModelPart
from splitfl.roles.common import check_finite, detached
from splitfl.roles.sides import DeviceRole
from splitfl.topologies.base import STAND_IN_LOSS, Family, State, UnitEnv, register
from splitfl.topologies.ring.clock import member_costs, ring_round_time
from splitfl.topologies.ring.member import ring_batch_update
from splitfl.topologies.split import blocks


@dataclass
class RingUnit:
    """The whole ring round (its one unit)."""

    plan: RoundPlan
    group: None = None


class RingFamily(Family):
    payload = Ring
    summary = "ring: every batch around a ring of devices (RingSFL), no server copy"
    #: The ring trains under the round's random stream (no per-unit stream: one unit).
    own_stream = False

    def dealable(self, plan: RoundPlan) -> str:
        return "a ring"

    def batched(self, plan: RoundPlan, model: torch.nn.Module) -> bool:
        return True  # :mod:`splitfl.executors.batched_ring`

    def units(self, model, plan: RoundPlan) -> list[RingUnit]:
        return [RingUnit(plan)]

    def run_unit(self, unit: RingUnit, env: UnitEnv) -> tuple[list[ClientUpdate], State | None]:
        """RingSFL (Alg. 1–2): full local models, every client's batch around the ring."""
        plan, model = env.plan, env.model
        ring, n = plan.topology.spec, model.num_blocks
        roles: dict[int, DeviceRole] = {}
        for t in plan.tasks:
            part = copy.deepcopy(ModelPart(model, 0, t.cut))
            if t.init_state is not None:
                part.load_state_dict(t.init_state)
            roles[t.client] = DeviceRole(
                t, part, None, env.train, env.data_of(t.client), env.round_seed, env.runtime
            )
        # each client's local full model: its role's (copied) blocks, no second copy
        models = {
            c: BlockModel([role.part.blocks[str(i)] for i in range(n)], model.cut_points)
            for c, role in roles.items()
        }
        tally = {c: [0, 0.0] for c in roles}
        for step in range(max(t.steps for t in plan.tasks)):
            active = [c for c, role in roles.items() if step < role.task.steps]
            batches = {c: roles[c].batch(step) for c in active}
            losses = ring_batch_update(
                models,
                ring.order,
                ring.lengths,
                batches,
                ring.weights,
                plan.tasks[0].lr,
                ring.dynamic_lr,
                env.train.loss,
            )
            for c, loss in losses.items():
                check_finite(torch.tensor(loss), c)
                size = len(batches[c][1])
                tally[c][0] += size
                tally[c][1] += loss * size
        updates = [
            ClientUpdate(
                c, n, i, tally[c][0], role.task.steps, detached(models[c].state_dict()), tally[c][1]
            )
            for i, (c, role) in enumerate(roles.items())
        ]
        return updates, None

    def price(self, view, plan, samples, r):
        """Each completed member's segments over the round (:mod:`.clock`)."""
        costs = member_costs(view, plan, r)
        return {c: costs[c] for c in samples}

    def round_time(self, view, plan, r, priced, samples, times):
        return ring_round_time(view, plan, r, times)

    def untrained(self, plan, global_state, num_blocks, samples_of) -> RoundResult:
        updates = []
        for t in plan.tasks:
            start = t.init_state if t.init_state is not None else global_state
            samples = samples_of(t)
            updates.append(
                ClientUpdate(
                    t.client,
                    t.cut,
                    t.group,
                    samples,
                    t.steps,
                    blocks(start, 0, t.cut),
                    STAND_IN_LOSS * samples,
                )
            )
        return RoundResult(updates=updates, server_states={})


RING = register(RingFamily())

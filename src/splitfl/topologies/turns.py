"""Turns: the members of a group take turns with its one server copy, in ``Turns.order`` —
``sequential``: each for all its steps (SplitFed V2; vanilla split learning with ``chain``,
each member starting from the device part the previous one trained); ``round_robin``: one
step each in turn (SplitLoRA's released code)."""

from __future__ import annotations

from splitfl.core.plan import ClientUpdate, RoundPlan
from splitfl.core.topology import Turns
from splitfl.roles.fleet import Fleet, GroupRun, SplitLoop, State
from splitfl.roles.sides import ServerRole
from splitfl.topologies.base import register
from splitfl.topologies.split import SplitFamily


class TurnsFamily(SplitFamily):
    payload = Turns
    summary = "turns: members take turns with one server copy (sequential or round robin)"

    def schedule(
        self, fleet: Fleet, server: ServerRole | None, run: GroupRun, plan: RoundPlan
    ) -> list[ClientUpdate]:
        turns: Turns = plan.topology
        loop = SplitLoop.of(fleet, server, run, plan)
        rank = {c: i for i, c in enumerate(turns.order)}
        ordered = sorted(run.tasks, key=lambda t: rank.get(t.client, 0))
        if turns.mode == "round_robin":
            fleet.begin(run.tasks, run.parts, run.aux)
            for step in range(max(t.steps for t in run.tasks)):
                for t in [t for t in ordered if step < t.steps]:
                    loop.iteration([t], step)
            return loop.updates(
                fleet.finish([t.client for t in run.tasks if t.client not in fleet.dropped])
            )
        previous: tuple[State, State | None] | None = None
        done: dict[int, tuple[State, State | None]] = {}
        for t in ordered:
            part = previous[0] if turns.chain and previous else run.parts[t.client]
            fleet.begin([t], {t.client: part}, run.aux)
            for step in range(t.steps):
                loop.iteration([t], step)
            done.update(fleet.finish([t.client]) if t.client not in fleet.dropped else {})
            previous = done.get(t.client, previous)
        return loop.updates(done)

    def concurrent(self, plan: RoundPlan) -> bool:
        """A chain's transfers (vanilla SL) never overlap."""
        return not plan.topology.chain

    def round_time(self, view, plan, r, priced, samples, times):
        """A chain (vanilla SL) is sequential: the round lasts the sum of its members' times,
        each waiting for all the others; other turns run their devices in parallel (max)."""
        if not plan.topology.chain:
            return super().round_time(view, plan, r, priced, samples, times)
        total = sum(times.values())
        return total, {c: total - t for c, t in times.items()}


TURNS = register(TurnsFamily())

"""What the split families share (star, turns, clusters): a group's units, its server copy,
its devices in-process, and the untrained round of ``executor: timing``.

A split family differs from another only in its *schedule*: the order in which a group's
members meet the group's server copy (:class:`~splitfl.roles.fleet.SplitLoop` is one
iteration). :class:`SplitFamily` runs a unit with the family's :meth:`SplitFamily.schedule`
over a :class:`~splitfl.roles.fleet.LocalFleet`; the networked server and a ParallelSFL top
worker call the same schedule over their remote fleets.
"""

from __future__ import annotations

from splitfl.core.plan import ClientTask, ClientUpdate, RoundPlan, RoundResult
from splitfl.models import block_index
from splitfl.roles.fleet import Fleet, GroupRun, LocalFleet, device_maker, group_runs, server_role
from splitfl.roles.sides import ServerRole
from splitfl.topologies.base import STAND_IN_LOSS, Family, State, UnitEnv


class SplitFamily(Family):
    """A pattern of groups, each with one server copy its members train against."""

    def schedule(
        self, fleet: Fleet, server: ServerRole | None, run: GroupRun, plan: RoundPlan
    ) -> list[ClientUpdate]:
        """One group's iterations over ``fleet`` and ``server``: its members' updates."""
        raise NotImplementedError(f"{type(self).__name__} defines no schedule")

    def dealable(self, plan: RoundPlan) -> str:
        server = plan.topology.server
        if server is not None and server.mixup:
            return "mixup pairs drawn from one stream across groups"
        if plan.aux is not None:
            return (
                "auxiliary models (any nn.Module, and FSL-SAGE's memory) are not dealt to workers"
            )
        if len(plan.groups()) < 2:
            return "one group"
        return ""

    def units(self, model, plan: RoundPlan) -> list[GroupRun]:
        return list(group_runs(None, model, plan))

    def run_unit(self, unit: GroupRun, env: UnitEnv) -> tuple[list[ClientUpdate], State | None]:
        """The group over local devices (parts from ``env.pool`` if given: they go back to it
        and the returned states are clones)."""
        make = device_maker(
            env.model,
            env.train,
            env.data_of,
            env.round_seed,
            env.runtime,
            env.pool,
            env.plan.aux,
            env.batches,
        )
        server = server_role(
            env.model, unit.tasks, env.plan, env.train, env.runtime, env.gen, env.pool
        )
        updates = self.schedule(LocalFleet(make, env.pool), server, unit, env.plan)
        if server is None:
            return updates, None
        if env.pool is None:
            return updates, server.state()
        state = env.pool.read(server.part)
        env.pool.release(server.part)
        return updates, state

    def untrained(self, plan, global_state, num_blocks, samples_of) -> RoundResult:
        updates, servers = [], {}
        for group, tasks in plan.groups().items():  # the reference executor's order of updates
            updates += [_untrained(plan, global_state, t, num_blocks, samples_of) for t in tasks]
            cuts = [t.cut for t in tasks if t.cut < num_blocks]
            if cuts:
                servers[group] = blocks(global_state, min(cuts), num_blocks)
        return RoundResult(updates=updates, server_states=servers)


def blocks(state: State, lo: int, hi: int) -> State:
    """The entries of ``state`` (full-model keys) in blocks ``[lo, hi)``, not copied."""
    return {k: v for k, v in state.items() if lo <= block_index(k) < hi}


def _untrained(plan, global_state: State, task: ClientTask, n: int, samples_of) -> ClientUpdate:
    """The task's untrained update: its starting device part and (auxiliary plans) its
    auxiliary model, the samples its ``steps`` mini-batches hold, the stand-in loss."""
    start = task.init_state if task.init_state is not None else global_state
    aux = task.aux_state if plan.aux is not None and task.cut < n else None
    samples = samples_of(task)
    return ClientUpdate(
        client=task.client,
        cut=task.cut,
        group=task.group,
        samples=samples,
        steps=task.steps,
        state=blocks(start, 0, task.cut),
        loss_sum=STAND_IN_LOSS * samples,
        aux_state=aux,
    )

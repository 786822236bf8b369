"""What the split families share (star, turns, clusters): a group's units, its server copy,
its devices in-process, and the untrained round of ``executor: timing``.

A split family differs from another only in its *schedule*: the order in which a group's
members meet the group's server copy (:class:`~splitfl.roles.fleet.SplitLoop` is one
iteration). :class:`SplitFamily` runs a unit with the family's :meth:`SplitFamily.schedule`
over a :class:`~splitfl.roles.fleet.LocalFleet`; the networked server and a ParallelSFL top
worker call the same schedule over their remote fleets.
"""

from __future__ import annotations

from abc import abstractmethod

from splitfl.core.plan import Charge, ClientTask, ClientUpdate, RoundPlan, RoundResult
from splitfl.data.partition import batch_sizes
from splitfl.models import block_index
from splitfl.roles.fleet import Fleet, GroupRun, LocalFleet, device_maker, group_runs, server_role
from splitfl.roles.sides import ServerRole
from splitfl.system.cost import AuxCharge, ClientCost
from splitfl.topologies.base import STAND_IN_LOSS, Family, State, UnitEnv

#: A task without costs beyond its split round.
NO_CHARGE = Charge()


class SplitFamily(Family):
    """A pattern of groups, each with one server copy its members train against."""

    @abstractmethod
    def schedule(
        self, fleet: Fleet, server: ServerRole | None, run: GroupRun, plan: RoundPlan
    ) -> list[ClientUpdate]:
        """One group's iterations over ``fleet`` and ``server``: its members' updates."""

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
        fleet = LocalFleet(make, env.pool, env.tap)
        updates = self.schedule(fleet, server, unit, env.plan)
        if server is None:
            return updates, None
        if env.pool is None:
            return updates, server.state()
        state = env.pool.read(server.part)
        env.pool.release(server.part)
        return updates, state

    def price(self, view, plan: RoundPlan, samples: dict[int, int], r: int) -> dict:
        """Each completed task's split round (S²FL Eq. 1, :func:`split_task_cost`)."""
        tasks = {t.client: t for t in plan.tasks}
        return {c: split_task_cost(view, tasks[c], n, r, plan) for c, n in samples.items()}

    def idle(self, view, plan: RoundPlan, r: int) -> dict:
        """The plan's non-participant uploads (:class:`~splitfl.core.plan.IdleUpload`):
        upload only, no compute, download or activations."""
        return {
            c: view.client_cost(
                c,
                up.cut,
                0,
                r,
                model_down=False,
                model_up=True,
                gradients=False,
                aux=AuxCharge(bytes_up=up.aux_up),
            )
            for c, up in plan.idle.items()
        }

    def untrained(self, plan, global_state, num_blocks, samples_of) -> RoundResult:
        updates, servers = [], {}
        for group, tasks in plan.groups().items():  # the reference executor's order of updates
            updates += [_untrained(plan, global_state, t, num_blocks, samples_of) for t in tasks]
            cuts = [t.cut for t in tasks if t.cut < num_blocks]
            if cuts:
                servers[group] = blocks(global_state, min(cuts), num_blocks)
        return RoundResult(updates=updates, server_states=servers)


def split_task_cost(view, task: ClientTask, samples: int, r: int, plan: RoundPlan) -> ClientCost:
    """A task's split round on the shared cost model (``view.task_cost``: S²FL Eq. 1 on the
    client's round profile): with the server's gradient, or — with an auxiliary update rule —
    with the auxiliary model's work (:class:`~splitfl.core.plan.Charge`'s ``aux_*`` and
    ``server_flops``), the smashed data of the upload steps only and no gradient back; then
    the charge's extras after Eq. (1) (:func:`with_extras`)."""
    charge = task.charge or NO_CHARGE
    if plan.device_update is None:
        cost = view.task_cost(task, samples, r, "server")
    else:
        aux = AuxCharge(charge.aux_flops, charge.aux_down, charge.aux_up, charge.server_flops)
        uploaded = uploaded_samples(view, task, plan)
        loss = plan.device_loss  # local+server: the gradients of the uploaded steps come back
        cost = view.task_cost(task, samples, r, loss, uploaded=uploaded, aux=aux)
    return with_extras(cost, charge, view.population.at(task.client, r), view)


def uploaded_samples(view, task: ClientTask, plan: RoundPlan) -> int:
    """Samples of ``task``'s mini-batches at upload steps (``plan.uploads``)."""
    n, drop = int(view.data_sizes[task.client]), view.config.train.drop_last
    sizes = batch_sizes(n, task.batch_size, task.steps, drop)
    return sum(b for step, b in enumerate(sizes) if plan.uploads(step))


def with_extras(cost: ClientCost, charge: Charge, device, view) -> ClientCost:
    """``cost`` with the charge's after-Eq. (1) extras, in order (in place): bytes down and
    up on the client's own link, exchanges at ``devices.exchange_latency_s`` each, device
    FLOPs at its speed."""
    if charge.extra_down:
        cost.traffic.model_down += charge.extra_down
        cost.comm_time += charge.extra_down / device.downlink
    if charge.extra_up:
        cost.traffic.model_up += charge.extra_up
        cost.comm_time += charge.extra_up / device.uplink
    if charge.extra_exchanges:
        cost.comm_time += charge.extra_exchanges * view.config.devices.exchange_latency_s
    if charge.extra_device_flops:
        cost.device_flops += charge.extra_device_flops
        cost.device_time += charge.extra_device_flops / device.flops
    return cost


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

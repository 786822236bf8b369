"""U-shaped split learning (Vepakomma et al., "Split learning for health", 2018, U-shaped
configuration), as a topology family: the device keeps the front, the head, the loss and the
labels; the server trains the middle (:mod:`.roles`, :mod:`.schedule`, :mod:`.price`).

This package is the whole family: the payload is :class:`~splitfl.core.topology.UShaped`, the
networked runtime's two sides are ``net/server/ushaped.py`` and ``net/device/ushaped.py``, the
algorithm is ``algorithms/ushaped_sl.py``.
"""

from __future__ import annotations

import math

from splitfl.core.plan import ClientUpdate, RoundPlan, RoundResult
from splitfl.core.topology import UShaped
from splitfl.models import block_index
from splitfl.roles.defences import is_active
from splitfl.roles.fleet import GroupRun, StartParts
from splitfl.roles.sides import DeviceRole
from splitfl.topologies.base import STAND_IN_LOSS, Family, PriceView, UnitEnv, register
from splitfl.topologies.ushaped.price import ushaped_client_cost
from splitfl.topologies.ushaped.roles import Middle, UDevice
from splitfl.topologies.ushaped.schedule import (
    LocalUFleet,
    UFleet,
    check_cuts,
    device_keys,
    device_maker,
    middle_of,
    run_group,
    tail_of,
)


class UShapedFamily(Family):
    payload = UShaped
    summary = "U-shaped: device front -> server middle -> device head and loss (labels stay)"

    def dealable(self, plan: RoundPlan) -> str:
        return "" if len(plan.groups()) > 1 else "one group (one shared middle)"

    def start_of(self, starts, task, plan):
        """The front's and head's blocks of the task's ``init_state``, else of the global
        model (its own tensors, not copies)."""
        tail = tail_of(plan, task)
        start = task.init_state or starts.full
        return {k: v for k, v in start.items() if device_keys(k, task.cut, tail)}

    def server_blocks(self, tasks, plan, num_blocks):
        """The middle: ``[cut, tail)`` of the group's (one) cut and tail."""
        return (tasks[0].cut, tail_of(plan, tasks[0])) if tasks else None

    def units(self, model, plan):
        check_cuts(plan, model.num_blocks)
        starts = StartParts(model)
        return [
            GroupRun(group, tasks, {t.client: self.start_of(starts, t, plan) for t in tasks}, {})
            for group, tasks in plan.groups().items()
        ]

    def run_unit(self, unit, env: UnitEnv):
        def role_of(task, front):
            return DeviceRole(
                task,
                front,
                None,
                env.train,
                env.data_of(task.client),
                env.round_seed,
                env.runtime,
                env.batches_of(task.client),
            )

        fleet = LocalUFleet(device_maker(env.model, env.plan, env.train, role_of), env.tap)
        middle = middle_of(env.model, unit, env.plan, env.train, env.runtime)
        return run_group(fleet, middle, unit), middle.state()

    def untrained(self, plan, global_state, num_blocks, samples_of) -> RoundResult:
        check_cuts(plan, num_blocks)
        updates, servers = [], {}
        for group, tasks in plan.groups().items():
            for t in tasks:
                start, tail = t.init_state or global_state, tail_of(plan, t)
                state = {k: v for k, v in start.items() if device_keys(k, t.cut, tail)}
                samples = samples_of(t)
                loss_sum = STAND_IN_LOSS * samples
                updates.append(
                    ClientUpdate(t.client, t.cut, group, samples, t.steps, state, loss_sum)
                )
            lo, hi = tasks[0].cut, tail_of(plan, tasks[0])
            servers[group] = {k: v for k, v in global_state.items() if lo <= block_index(k) < hi}
        return RoundResult(updates=updates, server_states=servers)

    def price(self, view: PriceView, plan, samples, r):
        """Each completed client's U-shaped Eq. (1) cost (:mod:`.price`)."""
        tasks = {t.client: t for t in plan.tasks}
        return {c: self._cost(view, tasks[c], n, r, plan) for c, n in samples.items()}

    @staticmethod
    def _cost(view, task, samples, r, plan):
        latency = view.config.devices.exchange_latency_s
        batches = math.ceil(samples / task.batch_size) if latency else 0
        exchanges = 2 * batches + int(task.download_model) + int(task.upload_model)
        device = view.population.at(task.client, r)
        cost = ushaped_client_cost(
            view.profile,
            task.cut,
            tail_of(plan, task),
            samples,
            device,
            view.population.server,
            model_down=task.download_model,
            model_up=task.upload_model,
            exchanges=exchanges if latency else 0,
            exchange_latency=latency,
        )
        if is_active(view.config.train.defence):  # the front's smashed data are defended
            view.charge_defence(
                cost, task.cut, samples, task.batch_size, device, tail_of(plan, task)
            )
        return cost


FAMILY = register(UShapedFamily())

__all__ = ["FAMILY", "LocalUFleet", "Middle", "UDevice", "UFleet", "UShapedFamily", "run_group"]

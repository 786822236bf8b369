"""The reference executor: a :class:`~splitfl.core.plan.RoundPlan` run client by client.

:class:`SequentialExecutor` is the reference: clients one after another, the way the papers'
own code runs. Other executors (GPU-vectorised, networked) must return the same
:class:`~splitfl.core.plan.RoundResult` for the same plan.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator

import numpy as np
import torch

from splitfl.config import TrainConfig
from splitfl.core.plan import ClientTask, ClientUpdate, RoundPlan, RoundResult
from splitfl.core.seeding import derive_seed
from splitfl.core.topology import AuxSpec, Ring
from splitfl.executors.auxiliary import device_aux
from splitfl.executors.common import check_finite, detached, round_batches
from splitfl.executors.fleet import GroupRun, LocalFleet, State, group_runs, run_group, server_role
from splitfl.executors.pool import PartPool, load_state
from splitfl.executors.ring import ring_batch_update
from splitfl.executors.roles import DeviceRole, Runtime
from splitfl.models import BlockModel, ModelPart


class SequentialExecutor:
    """Reference executor on one torch device (CPU by default)."""

    def __init__(self, device: str = "cpu", precision: str = "fp32", channels_last: bool = False):
        self.device = torch.device(device)
        self.precision = precision
        self.channels_last = channels_last
        self.pool = PartPool()
        self._model_of: BlockModel | None = None
        self._model: BlockModel | None = None

    def run_round(
        self, ctx, global_state: dict[str, torch.Tensor], plan: RoundPlan, round_seed: int
    ) -> RoundResult:
        model = self._working_model(ctx)
        load_state(model, global_state)
        model.train()
        runtime = Runtime(self.device, self.precision, self.channels_last, ctx.augment)
        if isinstance(plan.topology, Ring):
            return self._run_ring(ctx, model, plan, round_seed, runtime)
        gen = np.random.default_rng(derive_seed(round_seed, "mix"))
        train, data = ctx.config.train, (ctx.bundle.train.x, ctx.bundle.train.y)
        data_of = lambda c: (*data, ctx.client_indices[c])  # noqa: E731
        batches = round_batches(plan.tasks, ctx.client_indices, round_seed)
        make = device_maker(
            model, train, data_of, round_seed, runtime, self.pool, plan.aux, batches
        )
        updates: list[ClientUpdate] = []
        server_states: dict[int, dict[str, torch.Tensor]] = {}
        for run in group_runs(ctx, model, plan):
            done, server_state = run_unit(
                model, run, plan, train, runtime, gen, make, round_seed, self.pool
            )
            updates += done
            if server_state is not None:
                server_states[run.group] = server_state
        return RoundResult(updates=updates, server_states=server_states)

    def _working_model(self, ctx) -> BlockModel:
        """This executor's copy of the run's model (made once; a round loads its weights)."""
        if self._model_of is not ctx.model:
            self._model_of = ctx.model
            self._model = working_model(ctx.model, self.device, self.channels_last)
        return self._model

    def _run_ring(self, ctx, model: BlockModel, plan: RoundPlan, round_seed: int, runtime):
        """RingSFL (Alg. 1–2): full local models, every client's batch around the ring."""
        ring, n = plan.topology.spec, model.num_blocks
        x, y = ctx.bundle.train.x, ctx.bundle.train.y
        roles: dict[int, DeviceRole] = {}
        for t in plan.tasks:
            part = copy.deepcopy(ModelPart(model, 0, t.cut))
            if t.init_state is not None:
                part.load_state_dict(t.init_state)
            data = (x, y, ctx.client_indices[t.client])
            roles[t.client] = DeviceRole(t, part, None, ctx.config.train, data, round_seed, runtime)
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
                ctx.config.train.loss,
            )
            for c, loss in losses.items():
                check_finite(torch.tensor(loss), c)
                size = len(batches[c][1])
                tally[c][0] += size
                tally[c][1] += loss * size
        updates = [
            ClientUpdate(
                c,
                n,
                i,
                tally[c][0],
                role.task.steps,
                detached(models[c].state_dict()),
                tally[c][1],
            )
            for i, (c, role) in enumerate(roles.items())
        ]
        return RoundResult(updates=updates, server_states={})


def working_model(template: BlockModel, device: torch.device, channels_last: bool) -> BlockModel:
    """A copy of ``template`` on ``device`` (channels-last if asked), made once: each round
    loads the global state into it, and every device part and server copy of the round is
    copied from it."""
    model: BlockModel = copy.deepcopy(template).to(device)
    return model.to(memory_format=torch.channels_last) if channels_last else model


Data = tuple[torch.Tensor, torch.Tensor, np.ndarray]


def device_maker(
    model: BlockModel,
    train: TrainConfig,
    data_of: Callable[[int], Data],
    round_seed: int,
    runtime: Runtime,
    pool: PartPool | None = None,
    aux: AuxSpec | None = None,
    batches: dict[int, list[torch.Tensor]] | None = None,
) -> Callable[[ClientTask, State, State | None], DeviceRole]:
    """What builds a client's :class:`DeviceRole` for a :class:`LocalFleet`: its device part
    (a copy of ``model``'s blocks ``[0, cut)`` holding the part state; from ``pool`` if given),
    auxiliary model (``aux`` holding the given state), samples (``data_of(client)``:
    ``(x, y, indices)``) and mini-batches (``batches``, from
    :func:`~splitfl.executors.common.round_batches`; else the role draws them)."""

    def make(task: ClientTask, part_state: State, aux_state: State | None) -> DeviceRole:
        if pool is None:
            part = copy.deepcopy(ModelPart(model, 0, task.cut))
            part.load_state_dict(part_state)
        else:
            part = pool.take(model, 0, task.cut, part_state)
        module = None
        if aux_state is not None:
            module = device_aux(aux, aux_state)
        drawn = None if batches is None else batches.get(task.client)
        reused = None  # the pool's optimiser for this part (none with an auxiliary model)
        if pool is not None and module is None:
            reused = pool.optimizer(part, task.lr, train)
        data = data_of(task.client)
        return DeviceRole(task, part, module, train, data, round_seed, runtime, drawn, reused)

    return make


def run_unit(
    model: BlockModel,
    run: GroupRun,
    plan: RoundPlan,
    train: TrainConfig,
    runtime: Runtime,
    gen: np.random.Generator,
    make: Callable[[ClientTask, State, State | None], DeviceRole],
    round_seed: int,
    pool: PartPool | None = None,
) -> tuple[list[ClientUpdate], State | None]:
    """One group of a round, the unit ``executor: parallel`` deals to its workers: its
    members' updates and its server copy's state (None: nothing split). The group trains
    under its own torch random stream (dropout masks), ``derive_seed(round_seed, "unit",
    group)``, so what it computes does not depend on which groups ran before it. With
    ``pool`` (the one ``make`` takes parts from), the parts go back to it and the returned
    states are clones."""
    with unit_stream(derive_seed(round_seed, "unit", run.group), runtime.device):
        server = server_role(model, run.tasks, plan, train, runtime, gen, pool)
        updates = run_group(LocalFleet(make, pool), server, run, plan)
        if server is None:
            return updates, None
        if pool is None:
            return updates, server.state()
        state = pool.read(server.part)
        pool.release(server.part)
        return updates, state


@contextlib.contextmanager
def unit_stream(seed: int, device: torch.device) -> Iterator[None]:
    """torch's global random stream (and ``device``'s, on a GPU) seeded with ``seed`` inside,
    restored afterwards: the caller's stream advances as if the block never ran."""
    if device.type != "cuda":  # what fork_rng(devices=[]) does, without its device look-ups
        state = torch.get_rng_state()
        torch.default_generator.manual_seed(seed)
        try:
            yield
        finally:
            torch.set_rng_state(state)
        return
    with torch.random.fork_rng(devices=[device]):
        torch.default_generator.manual_seed(seed)
        with torch.cuda.device(device):
            torch.cuda.manual_seed(seed)
        yield

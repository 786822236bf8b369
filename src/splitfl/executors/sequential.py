"""The reference executor: a :class:`~splitfl.core.plan.RoundPlan` run client by client.

:class:`SequentialExecutor` is the reference: clients one after another, the way the papers'
own code runs. Other executors (GPU-vectorised, networked) must return the same
:class:`~splitfl.core.plan.RoundResult` for the same plan.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator

import numpy as np
import torch

from splitfl.core.plan import ClientUpdate, RoundPlan, RoundResult
from splitfl.core.seeding import derive_seed
from splitfl.models import BlockModel
from splitfl.roles.common import round_batches
from splitfl.roles.cut_record import tap_of
from splitfl.roles.parts import PartPool, load_state
from splitfl.roles.sides import Runtime
from splitfl.topologies import Family, UnitEnv, family_of


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
        """The plan's units, one after another, each run by its topology's family."""
        model = self._working_model(ctx)
        load_state(model, global_state)
        model.train()
        self.pool.reference = global_state  # nothing writes it in place (PartPool.read)
        runtime = Runtime(self.device, self.precision, self.channels_last, ctx.augment)
        data = (ctx.bundle.train.x, ctx.bundle.train.y)
        env = UnitEnv(
            model=model,
            plan=plan,
            train=ctx.config.train,
            runtime=runtime,
            gen=np.random.default_rng(derive_seed(round_seed, "mix")),
            round_seed=round_seed,
            data_of=lambda c: (*data, ctx.client_indices[c]),
            pool=self.pool,
            batches=round_batches(
                plan.tasks, ctx.client_indices, round_seed, ctx.config.train.drop_last
            ),
            tap=tap_of(ctx, plan),
        )
        return run_units(family_of(plan), env)

    def _working_model(self, ctx) -> BlockModel:
        """This executor's copy of the run's model (made once; a round loads its weights)."""
        if self._model_of is not ctx.model:
            self._model_of = ctx.model
            self._model = working_model(ctx.model, self.device, self.channels_last)
        return self._model


def run_units(family: Family, env: UnitEnv) -> RoundResult:
    """Every unit of ``env.plan`` (:meth:`Family.units`) in order, each :func:`run_unit`."""
    updates: list[ClientUpdate] = []
    server_states: dict[int, dict[str, torch.Tensor]] = {}
    for unit in family.units(env.model, env.plan):
        done, server_state = run_unit(family, unit, env)
        updates += done
        if server_state is not None:
            server_states[unit.group] = server_state
    return RoundResult(updates=updates, server_states=server_states)


def working_model(template: BlockModel, device: torch.device, channels_last: bool) -> BlockModel:
    """A copy of ``template`` on ``device`` (channels-last if asked), made once: each round
    loads the global state into it, and every device part and server copy of the round is
    copied from it."""
    model: BlockModel = copy.deepcopy(template).to(device)
    return model.to(memory_format=torch.channels_last) if channels_last else model


def run_unit(family: Family, unit, env: UnitEnv):
    """One unit of a round, the unit ``executor: parallel`` deals to its workers: its
    members' updates and its server copy's state (None: nothing split). A unit trains under
    its own torch random stream (dropout masks), ``derive_seed(round_seed, "unit", group)``,
    so what it computes does not depend on which units ran before it (a family with one
    coupled unit, ``own_stream = False``, trains under the round's stream)."""
    if not family.own_stream:
        return family.run_unit(unit, env)
    with unit_stream(derive_seed(env.round_seed, "unit", unit.group), env.runtime.device):
        return family.run_unit(unit, env)


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

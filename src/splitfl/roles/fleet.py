"""The server's view of its devices (a *fleet*) and the per-group split loop that drives it.

:class:`SplitLoop` is the split-learning exchange of one group of a
:class:`~splitfl.core.plan.RoundPlan`, written once: every iteration the active members' devices
forward (:meth:`Fleet.forward`), the group's :class:`~splitfl.roles.sides.ServerRole`
steps on their smashed data, and the gradients go back (:meth:`Fleet.backward`). A fleet
answers calls for several devices at once, so a networked fleet can ask them in parallel;
:class:`LocalFleet` holds :class:`~splitfl.roles.sides.DeviceRole` objects in-process.

A fleet may lose devices (a networked one: a process died or stalled): the calls return
results only for the devices that answered and list the others in ``dropped``; the loop goes
on with the rest and the lost clients have no :class:`~splitfl.core.plan.ClientUpdate`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from splitfl.config import TrainConfig
from splitfl.core.plan import LOCAL_AND_SERVER, ClientTask, ClientUpdate, RoundPlan
from splitfl.core.topology import AuxSpec
from splitfl.models import BlockModel, ModelPart, block_index
from splitfl.roles.aux_numerics import device_aux, remember
from splitfl.roles.cut_record import Tap
from splitfl.roles.parts import PartPool
from splitfl.roles.sides import DeviceRole, Runtime, ServerRole, Smashed

State = dict[str, torch.Tensor]


class Fleet(Protocol):
    """Calls on the devices of a group; each takes and returns per-client dicts. ``tap``:
    where the server records what it receives (``privacy.record``; None: nothing)."""

    dropped: set[int]
    tap: Tap | None

    def begin(self, tasks: list[ClientTask], parts: dict[int, State], aux: dict[int, State]):
        """Send each task and the device part (and auxiliary model) it starts from."""

    def forward(self, steps: dict[int, int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Smashed data and labels of each client's mini-batch ``steps[client]``."""

    def backward(self, grads: dict[int, torch.Tensor]) -> None:
        """Each client's activation gradient (the device steps)."""

    def head_update(self, clients: list[int]) -> None:
        """``device_loss: local``: each client steps on its auxiliary model's loss."""

    def local_server_update(self, grads: dict[int, torch.Tensor]) -> None:
        """``device_loss: local+server``: each client steps on its auxiliary model's loss plus
        its activation gradient ``grads[client]``."""

    def estimate_update(self, clients: list[int]) -> None:
        """``device_loss: estimate``: each client steps with its auxiliary model's gradient
        estimate."""

    def load_aux(self, states: dict[int, State]) -> None:
        """Each client's aligned auxiliary model (downloaded)."""

    def aux_step(self, steps: dict[int, int], device_loss: str) -> dict[int, int]:
        """Auxiliary plans off the upload period: each client forwards mini-batch
        ``steps[client]`` and updates from its auxiliary model, its smashed data staying on the
        device; the samples each trained."""

    def local_step(self, steps: dict[int, int]) -> dict[int, tuple[float, int]]:
        """Whole-model steps on the devices: (loss sum, samples) per client."""

    def finish(self, clients: list[int]) -> dict[int, tuple[State, State | None]]:
        """The trained device parts (and auxiliary models), uploaded."""


class LocalFleet:
    """Devices in this process: ``make(task, part_state, aux_state)`` builds a client's role;
    ``pool``, if given, is the :class:`PartPool` its parts came from: a finished role's
    trained part is read out of it (cloned) and the part goes back for reuse."""

    def __init__(
        self,
        make: Callable[[ClientTask, State, State | None], DeviceRole],
        pool: PartPool | None = None,
        tap: Tap | None = None,
    ):
        self.make, self.pool, self.tap = make, pool, tap
        self.roles: dict[int, DeviceRole] = {}
        self.dropped: set[int] = set()

    def begin(self, tasks, parts, aux):
        for t in tasks:
            self.roles[t.client] = self.make(t, parts[t.client], aux.get(t.client))

    def forward(self, steps):
        return {c: self.roles[c].forward(step) for c, step in steps.items()}

    def backward(self, grads):
        for c, grad in grads.items():
            self.roles[c].backward(grad)

    def head_update(self, clients):
        for c in clients:
            self.roles[c].head_update()

    def local_server_update(self, grads):
        for c, grad in grads.items():
            self.roles[c].local_server_update(grad)

    def estimate_update(self, clients):
        for c in clients:
            self.roles[c].estimate_update()

    def load_aux(self, states):
        for c, state in states.items():
            self.roles[c].load_aux(state)

    def aux_step(self, steps, device_loss):
        return {c: self.roles[c].aux_step(step, device_loss) for c, step in steps.items()}

    def local_step(self, steps):
        return {c: self.roles[c].local_step(step) for c, step in steps.items()}

    def finish(self, clients):
        out = {}
        for c in clients:
            role = self.roles.pop(c)
            if self.pool is None:
                out[c] = role.states()
                continue
            out[c] = (self.pool.read(role.part), role.aux_state())
            self.pool.release(role.part)
        return out


@dataclass
class _Tally:
    samples: int = 0
    loss_sum: float = 0.0
    uploaded: int = 0


@dataclass
class GroupRun:
    """One group's tasks with where each device part starts (``parts``, ``aux``)."""

    group: int
    tasks: list[ClientTask]
    parts: dict[int, State]
    aux: dict[int, State]


def group_runs(ctx, model: BlockModel, plan: RoundPlan) -> Iterator[GroupRun]:
    """Each group of ``plan`` with its members' starting device parts (the global model's
    blocks ``[0, cut)`` or the task's ``init_state``) and, for auxiliary plans
    (``plan.aux``), auxiliary models (the task's ``aux_state``, which the algorithm always
    gives: the executors draw no initialisation), on the model's device and dtype."""
    del ctx
    n = model.num_blocks
    like = next(model.parameters())
    starts = StartParts(model)
    for group, tasks in plan.groups().items():
        parts, aux = {}, {}
        for t in tasks:
            parts[t.client] = starts.of(t)
            if plan.aux is not None and t.cut < n:
                if t.aux_state is None:
                    raise ValueError(f"client {t.client}: an auxiliary plan without aux_state")
                aux[t.client] = {
                    k: v.to(like.device, like.dtype if v.is_floating_point() else v.dtype)
                    for k, v in t.aux_state.items()
                }
        yield GroupRun(group, tasks, parts, aux)


class StartParts:
    """Where tasks' device parts start: a task's ``init_state``, else the round's model's
    blocks ``[0, cut)`` (``model``'s own tensors, not copies; one view per cut point)."""

    def __init__(self, model: BlockModel):
        self.full: State = model.state_dict()
        self.by_cut: dict[int, State] = {}

    def of(self, task: ClientTask) -> State:
        if task.init_state:
            return task.init_state
        if task.cut not in self.by_cut:
            self.by_cut[task.cut] = {
                k: v for k, v in self.full.items() if block_index(k) < task.cut
            }
        return self.by_cut[task.cut]


def server_role(
    model: BlockModel,
    tasks: list[ClientTask],
    plan: RoundPlan,
    train: TrainConfig,
    runtime: Runtime,
    gen: np.random.Generator,
    pool: PartPool | None = None,
) -> ServerRole | None:
    """A group's server copy (blocks ``[min cut, n)`` of ``model``; from ``pool`` if given),
    or None when every member trains the whole model on its device."""
    cuts = [t.cut for t in tasks if t.cut < model.num_blocks]
    if not cuts:
        return None
    start, n = min(cuts), model.num_blocks
    if pool is None:
        part = copy.deepcopy(ModelPart(model, start, n))
    else:
        part = pool.take(model, start, n, ModelPart(model, start, n).state_dict())
    spec = plan.topology.server
    lr = spec.lr if spec.lr is not None else tasks[0].lr
    return ServerRole(part, lr, train, plan, runtime, gen)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def _update(t: ClientTask, group: int, tally: _Tally, done, memory, plan: RoundPlan):
    """A member's :class:`ClientUpdate` (auxiliary plans: the samples uploaded, the memory)."""
    aux_plan = plan.device_update is not None
    return ClientUpdate(
        client=t.client,
        cut=t.cut,
        group=group,
        samples=tally.samples,
        steps=t.steps,
        state=done[0],
        loss_sum=tally.loss_sum,
        aux_state=done[1],
        uploaded=tally.uploaded if aux_plan else None,
        aux_memory=memory[t.client] if aux_plan and plan.device_update.align else None,
    )


@dataclass
class SplitLoop:
    """One group's split iterations, the step every split family's schedule is made of
    (:mod:`splitfl.topologies.star`, :mod:`splitfl.topologies.turns`): the fleet, the server
    copy, the tallies and (FSL-SAGE) the server's memory of each member's uploads."""

    fleet: Fleet
    server: ServerRole | None
    plan: RoundPlan
    tally: dict[int, _Tally]
    memory: dict[int, tuple[torch.Tensor, torch.Tensor] | None]
    run: GroupRun

    @classmethod
    def of(cls, fleet: Fleet, server: ServerRole | None, run: GroupRun, plan: RoundPlan):
        tally = {t.client: _Tally() for t in run.tasks}
        return cls(fleet, server, plan, tally, {t.client: t.aux_memory for t in run.tasks}, run)

    def updates(self, done: dict[int, tuple[State, State | None]]) -> list[ClientUpdate]:
        """The members' updates from what ``finish`` returned (lost devices left out)."""
        run = self.run
        return [
            _update(t, run.group, self.tally[t.client], done[t.client], self.memory, self.plan)
            for t in run.tasks
            if t.client in done
        ]

    def iteration(self, tasks: list[ClientTask], step: int) -> None:
        """One iteration of a group: whole-model members step locally; split members forward,
        the server steps on the combined loss (S²FL Eq. 3–4, MergeSFL Eq. 16), and the devices
        update from the returned gradients — or, in auxiliary plans, from their auxiliary
        models (:meth:`aux_iteration`)."""
        fleet, server, tally = self.fleet, self.server, self.tally
        tasks = [t for t in tasks if t.client not in fleet.dropped]
        local = [t for t in tasks if server is None or t.cut >= server.stop]
        for c, (loss_sum, size) in fleet.local_step({t.client: step for t in local}).items():
            tally[c].samples += size
            tally[c].loss_sum += loss_sum
        split = [t for t in tasks if t not in local]
        if not split:
            return
        if self.plan.device_update is not None:
            self.aux_iteration(split, step)
            return
        sent = self._forward(split, step)
        if not sent:
            return
        answers = server.step(sent)
        for s, (_, loss_sum) in zip(sent, answers, strict=True):
            tally[s.client].samples += len(s.labels)
            tally[s.client].loss_sum += loss_sum
        fleet.backward({s.client: grad for s, (grad, _) in zip(sent, answers, strict=True)})

    def _forward(self, tasks: list[ClientTask], step: int) -> list[Smashed]:
        """The members' smashed data of mini-batch ``step`` (the devices that answered),
        recorded as received where the fleet has a tap (``privacy.record``)."""
        received = self.fleet.forward({t.client: step for t in tasks})
        tap = self.fleet.tap
        if tap is not None:
            for c, (features, _) in received.items():
                tap.smashed(c, step, features)
        return [
            Smashed(t.client, t.cut, *received[t.client]) for t in tasks if t.client in received
        ]

    def aux_iteration(self, tasks: list[ClientTask], step: int) -> None:
        """An auxiliary plan's iteration. At upload steps (``plan.uploads``) the devices send
        their smashed data and the server steps on them (no gradient goes back) and, with
        alignment, keeps them (:meth:`_upload`); off the period the smashed data stay on the
        device (:meth:`Fleet.aux_step`). A task with ``align`` has its auxiliary model aligned
        at its first step, after that step's server update (FSL-SAGE repo,
        ``src/algos/fsl_sage.py::client_step``: server update, then ``add_datapoint``, then
        ``refresh_data``/``align`` when ``t % align_interval == 0 and local_iter == 0``), and
        downloaded; then every device steps on its auxiliary model."""
        plan, fleet = self.plan, self.fleet
        uploading, grads = plan.uploads(step), {}
        if uploading:
            grads = self._upload(tasks, step)
            clients = list(grads)
        else:
            clients = [t.client for t in tasks]
        aligning = [
            t
            for t in tasks
            if t.align and step == 0 and t.client in clients and self.memory[t.client]
        ]
        if aligning:
            fleet.load_aux({t.client: self._aligned(t) for t in aligning})
        clients = [c for c in clients if c not in fleet.dropped]
        if uploading and plan.device_loss == LOCAL_AND_SERVER:
            fleet.local_server_update({c: grads[c] for c in clients})
        elif uploading:
            update = fleet.head_update if plan.device_loss == "local" else fleet.estimate_update
            update(clients)
        if uploading:
            return
        for c, samples in fleet.aux_step({c: step for c in clients}, plan.device_loss).items():
            self.tally[c].samples += samples

    def _upload(self, tasks: list[ClientTask], step: int) -> dict[int, torch.Tensor]:
        """An upload step: the members' smashed data (those that answered), the server's step
        on them, and (alignment) the server's memory of them; the activation gradient of each
        member that answered (only ``local+server`` sends it back)."""
        sent = self._forward(tasks, step)
        if not sent:
            return {}
        grads = {}
        for s, (grad, loss_sum) in zip(sent, self.server.step(sent), strict=True):
            grads[s.client] = grad
            tally = self.tally[s.client]
            tally.samples += len(s.labels)
            tally.uploaded += len(s.labels)
            tally.loss_sum += loss_sum
            align = self.plan.device_update.align
            if align is not None:
                self.memory[s.client] = remember(
                    self.memory[s.client], s.features, s.labels, align.memory
                )
        return grads

    def _aligned(self, task: ClientTask) -> State:
        """The task's auxiliary model aligned by the server on the client's memory."""
        return self.server.align(task, self.run.aux[task.client], self.memory[task.client])


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
    :func:`~splitfl.roles.common.round_batches`; else the role draws them)."""

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

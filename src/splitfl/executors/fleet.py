"""The server's view of its devices (a *fleet*) and the per-group split loop that drives it.

:func:`run_group` is the split-learning exchange of one group of a
:class:`~splitfl.plan.RoundPlan`, written once: every iteration the active members' devices
forward (:meth:`Fleet.forward`), the group's :class:`~splitfl.executors.roles.ServerRole`
steps on their smashed data, and the gradients go back (:meth:`Fleet.backward`). A fleet
answers calls for several devices at once, so a networked fleet can ask them in parallel;
:class:`LocalFleet` holds :class:`~splitfl.executors.roles.DeviceRole` objects in-process.

A fleet may lose devices (a networked one: a process died or stalled): the calls return
results only for the devices that answered and list the others in ``dropped``; the loop goes
on with the rest and the lost clients have no :class:`~splitfl.plan.ClientUpdate`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from splitfl.config import TrainConfig
from splitfl.executors.common import aux_head
from splitfl.executors.pool import PartPool, cloned
from splitfl.executors.roles import DeviceRole, Runtime, ServerRole, Smashed
from splitfl.models import BlockModel, ModelPart, block_index
from splitfl.plan import ClientTask, ClientUpdate, RoundPlan

State = dict[str, torch.Tensor]


class Fleet(Protocol):
    """Calls on the devices of a group; each takes and returns per-client dicts."""

    dropped: set[int]

    def begin(self, tasks: list[ClientTask], parts: dict[int, State], aux: dict[int, State]):
        """Send each task and the device part (and aux head) it starts from."""

    def forward(self, steps: dict[int, int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Smashed data and labels of each client's mini-batch ``steps[client]``."""

    def backward(self, grads: dict[int, torch.Tensor]) -> None:
        """Each client's activation gradient (the device steps)."""

    def head_update(self, clients: list[int]) -> None:
        """``device_loss: local``: each client steps on its aux head's loss."""

    def local_step(self, steps: dict[int, int]) -> dict[int, tuple[float, int]]:
        """Whole-model steps on the devices: (loss sum, samples) per client."""

    def finish(self, clients: list[int]) -> dict[int, tuple[State, State | None]]:
        """The trained device parts (and aux heads), uploaded."""


class LocalFleet:
    """Devices in this process: ``make(task, part_state, aux_state)`` builds a client's role;
    ``release(role)``, if given, takes back a finished role's part for reuse (its trained
    states are cloned first)."""

    def __init__(
        self,
        make: Callable[[ClientTask, State, State | None], DeviceRole],
        release: Callable[[DeviceRole], None] | None = None,
    ):
        self.make, self.release = make, release
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

    def local_step(self, steps):
        return {c: self.roles[c].local_step(step) for c, step in steps.items()}

    def finish(self, clients):
        out = {}
        for c in clients:
            role = self.roles.pop(c)
            part, aux = role.states()
            if self.release is not None:
                part = cloned(part)
                self.release(role)
            out[c] = (part, aux)
        return out


@dataclass
class _Tally:
    samples: int = 0
    loss_sum: float = 0.0


@dataclass
class GroupRun:
    """One group's tasks with where each device part starts (``parts``, ``aux``)."""

    group: int
    tasks: list[ClientTask]
    parts: dict[int, State]
    aux: dict[int, State]


def group_runs(ctx, model: BlockModel, plan: RoundPlan) -> Iterator[GroupRun]:
    """Each group of ``plan`` with its members' starting device parts (the global model's
    blocks ``[0, cut)`` or the task's ``init_state``) and, for ``device_loss: local``, aux
    heads (``aux_state`` or a fresh one). Fresh heads are drawn from the round's torch RNG in
    group and task order (groups train under streams of their own: ``sequential.run_unit``)."""
    n = model.num_blocks
    dtype = next(model.parameters()).dtype
    starts = StartParts(model)
    for group, tasks in plan.groups().items():
        parts, aux = {}, {}
        for t in tasks:
            parts[t.client] = starts.of(t)
            if plan.device_loss == "local" and t.cut < n:
                elems = ctx.profile.blocks[t.cut - 1].out_elements
                head = aux_head(elems, ctx.bundle.num_classes).to(model_device(model), dtype)
                if t.aux_state is not None:
                    head.load_state_dict(t.aux_state)
                aux[t.client] = head.state_dict()
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
    lr = plan.server_lr if plan.server_lr is not None else tasks[0].lr
    return ServerRole(part, lr, train, plan, runtime, gen)


def model_device(model: torch.nn.Module) -> torch.device:
    return next(model.parameters()).device


def run_group(
    fleet: Fleet, server: ServerRole | None, run: GroupRun, plan: RoundPlan
) -> list[ClientUpdate]:
    """The split loop of one group (``per_step``: all members every iteration, S²FL Alg. 1;
    ``sequential``: one member after another, SplitFed V2 / vanilla SL with
    ``chain_devices``; ``round_robin``: one step of each member in turn, SplitLoRA); the
    members' updates, lost devices left out."""
    tally = {t.client: _Tally() for t in run.tasks}
    rank = {c: i for i, c in enumerate(plan.order)}
    if plan.server_mode == "sequential":
        previous: tuple[State, State | None] | None = None
        done: dict[int, tuple[State, State | None]] = {}
        for t in sorted(run.tasks, key=lambda t: rank.get(t.client, 0)):
            part = previous[0] if plan.chain_devices and previous else run.parts[t.client]
            fleet.begin([t], {t.client: part}, run.aux)
            for step in range(t.steps):
                _iteration(fleet, server, [t], step, plan, tally)
            done.update(fleet.finish([t.client]) if t.client not in fleet.dropped else {})
            previous = done.get(t.client, previous)
    else:
        fleet.begin(run.tasks, run.parts, run.aux)
        turns = sorted(run.tasks, key=lambda t: rank.get(t.client, 0))
        for step in range(max(t.steps for t in run.tasks)):
            active = [t for t in turns if step < t.steps]
            if plan.server_mode == "round_robin":
                for t in active:
                    _iteration(fleet, server, [t], step, plan, tally)
            else:
                _iteration(fleet, server, active, step, plan, tally)
        done = fleet.finish([t.client for t in run.tasks if t.client not in fleet.dropped])
    return [
        ClientUpdate(
            client=t.client,
            cut=t.cut,
            group=run.group,
            samples=tally[t.client].samples,
            steps=t.steps,
            state=done[t.client][0],
            loss_sum=tally[t.client].loss_sum,
            aux_state=done[t.client][1],
        )
        for t in run.tasks
        if t.client in done
    ]


def _iteration(fleet, server, tasks, step, plan, tally) -> None:
    """One iteration of a group: whole-model members step locally; split members forward,
    the server steps on the combined loss (S²FL Eq. 3–4, MergeSFL Eq. 16), and the devices
    update from the returned gradients (or their aux heads' losses)."""
    tasks = [t for t in tasks if t.client not in fleet.dropped]
    local = [t for t in tasks if server is None or t.cut >= server.stop]
    for c, (loss_sum, size) in fleet.local_step({t.client: step for t in local}).items():
        tally[c].samples += size
        tally[c].loss_sum += loss_sum
    split = [t for t in tasks if t not in local]
    if not split:
        return
    received = fleet.forward({t.client: step for t in split})
    sent = [Smashed(t.client, t.cut, *received[t.client]) for t in split if t.client in received]
    if not sent:
        return
    answers = server.step(sent)
    for s, (_, loss_sum) in zip(sent, answers, strict=True):
        tally[s.client].samples += len(s.labels)
        tally[s.client].loss_sum += loss_sum
    if plan.device_loss == "local":
        fleet.head_update([s.client for s in sent])
    else:
        fleet.backward({s.client: grad for s, (grad, _) in zip(sent, answers, strict=True)})

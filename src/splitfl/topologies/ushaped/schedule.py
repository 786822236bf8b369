"""U-shaped split learning's round: the schedule over a fleet of :class:`UDevice` and a
group's :class:`Middle`, written once for every runtime (in-process, a parallel worker, and
the networked server, whose fleet puts the wire between the two sides).

Every iteration, all active members of a group (S²FL Alg. 1's per-step group; a group of one
is Vepakomma et al.'s U-shaped configuration): the fronts forward (:meth:`UFleet.forward`,
smashed data only), the middle forwards, the heads compute the loss on the devices' own labels
and step (:meth:`UFleet.head`, the middle outputs' gradients back), the middle steps, and the
fronts step on the gradients of their smashed data (:meth:`UFleet.backward`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Protocol

import torch

from splitfl.config import TrainConfig
from splitfl.core.activations import Activation, Gradient, leaves
from splitfl.core.plan import ClientTask, ClientUpdate, RoundPlan
from splitfl.models import BlockModel, ModelPart, block_index
from splitfl.roles.cut_record import Tap
from splitfl.roles.fleet import GroupRun
from splitfl.roles.sides import Runtime
from splitfl.topologies.ushaped.roles import Middle, Sent, UDevice

State = dict[str, torch.Tensor]


class UFleet(Protocol):
    """Calls on the devices of a U-shaped group; each takes and returns per-client dicts.
    ``tap``: where the server records what it receives (``privacy.record``; None: nothing)."""

    dropped: set[int]
    tap: Tap | None

    def begin(self, tasks: list[ClientTask], parts: dict[int, State]) -> None:
        """Send each task and the device state (front and head) it starts from."""

    def forward(self, steps: dict[int, int]) -> dict[int, Activation]:
        """Each client's smashed data of mini-batch ``steps[client]`` (no labels)."""

    def head(self, outs: dict[int, Activation]) -> dict[int, tuple[Gradient, float, int]]:
        """Each client's head on the middle's output: (∂loss/∂out, loss sum, samples)."""

    def backward(self, grads: dict[int, Gradient]) -> None:
        """Each client's gradient of its smashed data (the front steps)."""

    def finish(self, clients: list[int]) -> dict[int, State]:
        """The trained fronts and heads, uploaded."""


class LocalUFleet:
    """U-shaped devices in this process: ``make(task, state)`` builds a client's device."""

    def __init__(self, make: Callable[[ClientTask, State], UDevice], tap: Tap | None = None):
        self.make, self.tap = make, tap
        self.devices: dict[int, UDevice] = {}
        self.dropped: set[int] = set()

    def begin(self, tasks, parts):
        for t in tasks:
            self.devices[t.client] = self.make(t, parts[t.client])

    def forward(self, steps):
        return {c: self.devices[c].forward(step) for c, step in steps.items()}

    def head(self, outs):
        return {c: self.devices[c].head_step(out) for c, out in outs.items()}

    def backward(self, grads):
        for c, grad in grads.items():
            self.devices[c].backward(grad)

    def finish(self, clients):
        return {c: self.devices.pop(c).states()[0] for c in clients}


def tail_of(plan: RoundPlan, task: ClientTask) -> int:
    """The first block of ``task``'s head (``UShaped.tails``; one line if it is not there)."""
    tails = plan.topology.tails
    if task.client not in tails:
        raise ValueError(f"UShaped.tails names no tail for client {task.client}")
    return tails[task.client]


def check_cuts(plan: RoundPlan, num_blocks: int) -> None:
    """Every task has 1 <= cut < tail < num_blocks, one (cut, tail) per group."""
    seen: dict[int, tuple[int, int]] = {}
    for t in plan.tasks:
        pair = (t.cut, tail_of(plan, t))
        if not 1 <= pair[0] < pair[1] < num_blocks:
            raise ValueError(
                f"client {t.client}: a U-shaped task needs 1 <= cut < tail < {num_blocks} "
                f"(got cut {pair[0]}, tail {pair[1]})"
            )
        if seen.setdefault(t.group, pair) != pair:
            raise ValueError(f"group {t.group}: members of a U-shaped group share cut and tail")


def device_keys(key: str, cut: int, tail: int) -> bool:
    """Whether a full-model key is on the device: the front ``[0, cut)`` or the head."""
    k = block_index(key)
    return k < cut or k >= tail


def device_maker(
    model: BlockModel, plan: RoundPlan, train: TrainConfig, role_of
) -> Callable[[ClientTask, State], UDevice]:
    """What builds a client's :class:`UDevice` from its task and state: copies of the model's
    front and head holding the state; ``role_of(task, front)`` makes the front's
    :class:`~splitfl.roles.sides.DeviceRole` (the runtime's data, batches and optimiser)."""

    def make(task: ClientTask, state: State) -> UDevice:
        tail, n = tail_of(plan, task), model.num_blocks
        front = copy.deepcopy(ModelPart(model, 0, task.cut))
        head = copy.deepcopy(ModelPart(model, tail, n))
        front.load_state_dict({k: v for k, v in state.items() if block_index(k) < task.cut})
        head.load_state_dict({k: v for k, v in state.items() if block_index(k) >= tail})
        return UDevice(role_of(task, front), head, tail, train)

    return make


def middle_of(
    model: BlockModel, run: GroupRun, plan: RoundPlan, train: TrainConfig, runtime: Runtime
) -> Middle:
    """The group's middle (a copy of blocks ``[cut, tail)`` of the round's model), stepped at
    ``UShaped.lr`` (None: the first member's learning rate)."""
    first = run.tasks[0]
    lr = plan.topology.lr
    part = copy.deepcopy(ModelPart(model, first.cut, tail_of(plan, first)))
    return Middle(part, lr if lr is not None else first.lr, train, runtime)


def run_group(fleet: UFleet, middle: Middle, run: GroupRun) -> list[ClientUpdate]:
    """The U-shaped loop of one group (module docstring); the members' updates, lost devices
    left out."""
    tally = {t.client: [0, 0.0] for t in run.tasks}
    fleet.begin(run.tasks, run.parts)
    for step in range(max(t.steps for t in run.tasks)):
        active = [t for t in run.tasks if step < t.steps and t.client not in fleet.dropped]
        fxs = fleet.forward({t.client: step for t in active})
        sent = [
            Sent(t.client, t.cut, fxs[t.client], _rows(fxs[t.client]))
            for t in active
            if t.client in fxs
        ]
        if not sent:
            continue
        outs = middle.forward(sent)
        answers = fleet.head({s.client: out for s, out in zip(sent, outs, strict=True)})
        _record(fleet.tap, step, sent, answers)
        back = middle.backward({c: grad for c, (grad, _, _) in answers.items()})
        for c, (_, loss_sum, samples) in answers.items():
            tally[c][0] += samples
            tally[c][1] += loss_sum
        fleet.backward(back)
    done = fleet.finish([t.client for t in run.tasks if t.client not in fleet.dropped])
    return [
        ClientUpdate(
            t.client,
            t.cut,
            run.group,
            tally[t.client][0],
            t.steps,
            done[t.client],
            tally[t.client][1],
        )
        for t in run.tasks
        if t.client in done
    ]


def _record(tap: Tap | None, step: int, sent: list[Sent], answers: dict) -> None:
    """What the server received this step (``privacy.record``): each member's smashed data
    and the cut-layer gradient its head sent back (Li et al.'s label-leak signal)."""
    if tap is None:
        return
    for s in sent:
        tap.smashed(s.client, step, s.features)
    for c, (grad, _, _) in answers.items():
        tap.gradient(c, step, grad)


def _rows(x: Activation) -> int:
    return int(leaves(x)[0].shape[0])

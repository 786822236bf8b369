"""The two sides of a U-shaped split iteration: a device with the front *and* the head, and
a server with the middle.

Vepakomma et al., "Split learning for health" (2018), U-shaped configuration: "the network
is wrapped around at the end layers of the server's network and the outputs are sent back to
the client entity", so that neither the labels nor the layers that see them leave the device.
One iteration (forward left to right, backward right to left):

    device front [0, cut) ──fx──▶ server middle [cut, tail) ──out──▶ device head [tail, n) + loss
    device front ◀──∂L/∂fx── server middle ◀──∂L/∂out── device head

:class:`UDevice` keeps the labels on the device (its :meth:`UDevice.forward` returns the
smashed data only) and, with ``train.defence.label_noise``, perturbs the head's gradient
before it sends it (:mod:`splitfl.roles.label_defences`); :class:`Middle` steps on the
members' head gradients.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from splitfl.config import TrainConfig
from splitfl.core.activations import Activation, Gradient, as_server_input, input_grad, leaves
from splitfl.core.plan import ClientTask
from splitfl.core.seeding import derive_seed
from splitfl.roles.common import check_finite, detached, local_optimizer
from splitfl.roles.label_defences import protect_labels
from splitfl.roles.sides import DeviceRole, Runtime
from splitfl.training import loss_fn


class UDevice:
    """One client's device in a U-shaped round: the front (a :class:`DeviceRole` over blocks
    ``[0, cut)``, its batches and optimiser) and the head (blocks ``[tail, n)``, with its own
    optimiser over its own parameters: one step of each per iteration, as one optimiser over
    both would take, since no parameter is in both)."""

    def __init__(self, front: DeviceRole, head: nn.Module, tail: int, train: TrainConfig):
        self.front, self.head, self.tail = front, head, tail
        self.task: ClientTask = front.task
        self.optimizer = local_optimizer(head, front.task.lr, train)
        self.loss = loss_fn(train.loss)
        self.defence = train.defence
        self._y: torch.Tensor | None = None
        self._heads = 0  # head steps so far (seeds the label defence's noise)

    def forward(self, step: int) -> Activation:
        """The front's smashed data of mini-batch ``step``; the labels stay here."""
        fx, self._y = self.front.forward(step)
        return fx

    def head_step(self, out: Activation) -> tuple[Gradient, float, int]:
        """The head on the middle's output: the loss (``train.loss``, mean over the batch) on
        the device's own labels, one step of the head; (∂loss/∂out, loss sum, samples). Once
        per forward (a second call is refused)."""
        if self._y is None:
            raise ValueError("no forward awaits the head")
        y, self._y = self._y, None
        received = as_server_input(out)
        logits = self.front.runtime.forward(self.head, received, start=self.tail)
        loss = self.loss(logits, y)
        check_finite(loss, self.task.client)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        size = len(y)
        return self._protected(input_grad(received), y), loss.item() * size, size

    def _protected(self, grad: Gradient, y: torch.Tensor) -> Gradient:
        """``train.defence.label_noise`` on the gradient before it leaves the device
        (:mod:`splitfl.roles.label_defences`; seeded per client and head step)."""
        step, self._heads = self._heads, self._heads + 1
        if self.defence.label_noise == "none" or not isinstance(grad, torch.Tensor):
            return grad
        seed = derive_seed(self.front.round_seed, "label-noise", self.task.client, step)
        return protect_labels(self.defence, grad, y, seed)

    def backward(self, grad: Gradient) -> None:
        """The front's step on the middle's gradient of its input (``∂L/∂fx``)."""
        self._y = None
        self.front.backward(grad)

    def states(self) -> tuple[dict[str, torch.Tensor], None]:
        """The trained front and head (one state, full-model keys), no auxiliary model."""
        return {**detached(self.front.part.state_dict()), **detached(self.head.state_dict())}, None


@dataclass
class Sent:
    """What a member sent the middle this iteration."""

    client: int
    cut: int
    features: Activation
    samples: int


class Middle:
    """A group's server copy of the middle blocks ``[cut, tail)`` and its optimiser. The
    group loss is the mean over the union of its members' samples (S²FL Eq. 3's ``mean``): a
    member's head gradient (of its own mean loss) weighs ``n_i / N``; each member receives
    the gradient of its own mean loss w.r.t. its smashed data (``device_grad: own``), so a
    group of one is plain U-shaped split learning."""

    def __init__(self, part: nn.Module, lr: float, train: TrainConfig, runtime: Runtime):
        self.part, self.runtime = part, runtime
        self.optimizer = local_optimizer(part, lr, train)
        self._pending: list[tuple[Sent, Activation, Activation]] = []

    def forward(self, sent: list[Sent]) -> list[Activation]:
        """The middle's output for each member (detached; the graphs are kept)."""
        self._pending = []
        outs = []
        for s in sent:
            received = as_server_input(s.features)
            out = self.runtime.forward(self.part, received, start=s.cut)
            self._pending.append((s, received, out))
            outs.append(tuple(t.detach() for t in out) if isinstance(out, tuple) else out.detach())
        return outs

    def backward(self, grads: dict[int, Gradient]) -> dict[int, Gradient]:
        """One step on the members' head gradients (those that answered); each one's
        gradient of its own mean loss w.r.t. what it sent."""
        pending = [p for p in self._pending if p[0].client in grads]
        total = sum(s.samples for s, _, _ in pending)
        outs, weighted = [], []
        for s, _, out in pending:
            share = s.samples / total
            for t, g in zip(leaves(out), leaves(grads[s.client]), strict=True):
                if g is not None and t.requires_grad:
                    outs.append(t)
                    weighted.append(g if share == 1.0 else g * share)
        self.optimizer.zero_grad()
        if outs:
            torch.autograd.backward(outs, weighted)
        self.optimizer.step()
        back = {}
        for s, received, _ in pending:
            grad = input_grad(received)
            share = s.samples / total
            back[s.client] = grad if share == 1.0 else _scaled(grad, 1.0 / share)
        self._pending = []
        return back

    def state(self) -> dict[str, torch.Tensor]:
        return detached(self.part.state_dict())


def _scaled(grad: Gradient, factor: float) -> Gradient:
    if isinstance(grad, tuple):
        return tuple(None if g is None else g * factor for g in grad)
    return grad * factor

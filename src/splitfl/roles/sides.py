"""The two roles of a split round: a client's **device** part and a group's **server** copy.

A split-learning iteration is an exchange between them (S²FL Alg. 1, MergeSFL Alg. 1):

* :class:`DeviceRole` — one client's device part (blocks ``[0, cut)``), its optimiser, its
  mini-batches and (``device_loss: local``/``estimate``) its auxiliary model. ``forward``
  sends smashed data and labels, ``backward`` applies the activation gradient that comes back;
  ``head_update`` steps on the auxiliary model's loss, ``estimate_update`` with its gradient
  estimate (:mod:`splitfl.roles.aux_numerics`).
* :class:`ServerRole` — one group's server-side copy: the group loss over its members' smashed
  data (S²FL Eq. 3; MergeSFL Eq. 16's merged batch), one optimiser step, each member's
  activation gradient (S²FL Eq. 4).

Both are plain torch and know nothing of where the other runs: the sequential executor wires
them in-process (:mod:`splitfl.roles.fleet`), the networked executor
(:mod:`splitfl.net`) puts gRPC between them. The arithmetic is the same code in both.

Over 400 lines as one concept: the two ends of one exchange, each step next to the step of
the other side it answers (a device's ``backward`` reads what ``ServerRole.step`` returns);
apart, a change to the exchange would be made in two files.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from splitfl.config import ConfigError, TrainConfig
from splitfl.core.activations import (
    Activation,
    Gradient,
    as_server_input,
    aux_input,
    backward,
    cat,
    head,
    input_grad,
    map_grad,
    mix,
    tree_map,
)
from splitfl.core.plan import ClientTask, RoundPlan
from splitfl.core.seeding import derive_seed
from splitfl.data.transforms import Transforms, augment_batch, batch_seed
from splitfl.roles.aux_numerics import (
    Memory,
    align_aux,
    aux_module,
    estimate_gradient,
    true_gradients,
)
from splitfl.roles.common import (
    at_least_fp32,
    check_finite,
    detached,
    finite_value,
    local_optimizer,
    precision_context,
    task_batches,
    to_memory_format,
)
from splitfl.roles.defences import device_defence
from splitfl.roles.dp_sgd import device_dp, dp_active
from splitfl.training import loss_fn


@dataclass(frozen=True)
class Runtime:
    """Where and how tensors are computed: torch device, precision, image memory layout, and
    the training batches' augmentation (``data.transforms``)."""

    device: torch.device
    precision: str = "fp32"
    channels_last: bool = False
    augment: Transforms | None = None

    def forward(self, module: nn.Module, x: torch.Tensor, **kwargs) -> torch.Tensor:
        """``module(x)`` under the configured precision; logits/features back in fp32."""
        if self.precision == "fp32":  # no autocast to enter (a context per step costs)
            return at_least_fp32(module(x, **kwargs))
        with precision_context(self.device, self.precision):
            return at_least_fp32(module(x, **kwargs))

    def batch(
        self, x_all, y_all, idx: torch.Tensor, seed: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Samples ``idx`` on the device; a training batch (``seed``: its
        :func:`~splitfl.data.transforms.batch_seed`) augmented per ``data.transforms``."""
        x = x_all[idx].to(self.device)
        if seed is not None:
            x = augment_batch(self.augment, x, seed)
        return (to_memory_format(x) if self.channels_last else x), y_all[idx].to(self.device)


class DeviceRole:
    """One client's side of a split round (its part, optimiser, batches, optional auxiliary model).

    ``x_all``/``y_all`` are the samples the device holds, indexed by the client's
    ``indices``; the mini-batches are drawn from ``derive_seed(round_seed, client)`` so every
    executor feeds the same samples in the same order.
    """

    def __init__(
        self,
        task: ClientTask,
        part: nn.Module,
        aux: nn.Module | None,
        train: TrainConfig,
        data: tuple[torch.Tensor, torch.Tensor, np.ndarray],
        round_seed: int,
        runtime: Runtime,
        batches: list[torch.Tensor] | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ):
        self.task, self.part, self.aux, self.runtime = task, part, aux, runtime
        self.x_all, self.y_all, indices = data
        if batches is None:  # else drawn already (:func:`~splitfl.roles.common.round_batches`)
            batches = task_batches(indices, task, round_seed, train.drop_last)
        self.batches = batches
        self.round_seed = round_seed
        trainable = part if aux is None else nn.ModuleList([part, aux])
        if optimizer is None:  # else the pool's for this part (``PartPool.optimizer``)
            optimizer = local_optimizer(trainable, task.lr, train)
        self.dp = None
        if dp_active(train.defence):  # DP-SGD of the part (Opacus's per-sample clipping)
            if aux is not None:
                raise ConfigError(
                    "train.defence.dp_noise",
                    "DP-SGD covers a device part stepped on the server's gradient; this "
                    "algorithm also trains an auxiliary model on the device",
                )
            seed = derive_seed(round_seed, "dp-sgd", task.client)
            self.dp = device_dp(train.defence, part, optimizer, task.batch_size, seed)
            optimizer = optimizer if self.dp is None else self.dp.optimizer
        self.optimizer = optimizer
        self.loss, self.loss_name = loss_fn(train.loss), train.loss
        self.defence = device_defence(train.defence, task.client, round_seed)
        self._fx: torch.Tensor | None = None
        self._y: torch.Tensor | None = None

    def batch(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Training batch ``step`` (augmented per ``data.transforms``, seeded by
        :func:`~splitfl.data.transforms.batch_seed`)."""
        aug = self.runtime.augment
        seed = batch_seed(self.round_seed, self.task.client, step) if aug and aug.augment else None
        return self.runtime.batch(self.x_all, self.y_all, self.batches[step], seed)

    def forward(self, step: int) -> tuple[Activation, torch.Tensor]:
        """Smashed data of mini-batch ``step`` (detached; the graph is kept) and its labels:
        one tensor, or a tuple where several cross the cut; with ``train.defence``, what the
        defences let leave the device (:mod:`splitfl.roles.defences`)."""
        x, y = self.batch(step)
        if self.dp is not None:
            self.dp.capture()
        fx = self.runtime.forward(self.part, x)
        if self.defence is not None:
            fx = self.defence.protect(x, fx, step)
        self._fx, self._y = fx, y
        return tree_map(torch.Tensor.detach, self._fx), y

    def _penalty(self) -> torch.Tensor | None:
        """A defence's loss term for the last forward (NoPeek), None without one."""
        return None if self.defence is None else self.defence.penalty()

    def pending_output(self) -> Activation:
        """The smashed data of the last ``forward`` awaiting its gradient (ValueError if
        there is none: a ``backward`` or ``head_update`` out of order)."""
        if self._fx is None:
            raise ValueError("no forward awaits a gradient")
        return self._fx

    def backward(self, grad: Gradient) -> None:
        """Back-propagate the returned activation gradient and step (S²FL Eq. 4's device side)."""
        self.optimizer.zero_grad()
        backward(self._fx, grad, self._penalty())
        self._optimizer_step()
        self._fx = None

    def _optimizer_step(self) -> None:
        """The optimiser's step; under DP-SGD Opacus's (clip, noise, average) and the
        per-sample gradient hooks removed."""
        self.optimizer.step()
        if self.dp is not None:
            self.dp.release()

    def head_update(self) -> None:
        """``device_loss: local``: one step of the part and the auxiliary model on the
        auxiliary model's loss on the last smashed data (CSE-FSL, LocFedMix-SL)."""
        loss = self.loss(self.runtime.forward(self.aux, aux_input(self._fx)), self._y)
        penalty = self._penalty()
        self._step(loss if penalty is None else loss + penalty)
        self._fx = None

    def local_server_update(self, grad: Gradient) -> None:
        """``device_loss: local+server``: one step of the part and the auxiliary model on the
        auxiliary model's loss plus the server's activation gradient on the same smashed data
        (the gradients add: ∂ℓ_aux/∂θ + (∂fx/∂θ)ᵀ g). LocFedMix-SL "maintain[s] all the
        benefits of SplitFed and LocSplitFed" (ParallelSFL §2), whose PS "sends the
        corresponding gradients back to the workers in sequence" (MergeSFL §II-B)."""
        loss = self.loss(self.runtime.forward(self.aux, aux_input(self._fx)), self._y)
        check_finite(loss, self.task.client)
        self.optimizer.zero_grad()
        loss.backward(retain_graph=True)
        backward(self._fx, grad)
        self._optimizer_step()
        self._fx = None

    def estimate_update(self) -> None:
        """``device_loss: estimate``: back-propagate the auxiliary model's estimate of the
        server's cut-layer gradient (FSL-SAGE repo, ``src/algos/fsl_sage.py``:
        ``splitting_output.backward(auxiliary_model(local_smashed_data, y))``) and step the
        part; the auxiliary model is not stepped (only alignment changes its weights)."""
        grad = estimate_gradient(self.aux, self._fx, self._y, self.loss_name, self.runtime.forward)
        self.optimizer.zero_grad()
        backward(self._fx, grad, self._penalty())
        self._optimizer_step()
        self._fx = None

    def aux_update(self, device_loss: str) -> None:
        """The auxiliary plan's device update on the last smashed data: :meth:`head_update`
        (``device_loss: local``; ``local+server`` off the upload period, where no gradient
        comes back) or :meth:`estimate_update` (``estimate``)."""
        if device_loss in ("local", "local+server"):
            self.head_update()
        elif device_loss == "estimate":
            self.estimate_update()
        else:
            raise ValueError(f"device_loss {str(device_loss)[:40]!r} has no auxiliary update")

    def aux_step(self, step: int, device_loss: str) -> int:
        """A batch whose smashed data stay on the device (an auxiliary plan's step off the
        upload period, CSE-FSL/FSL-SAGE's ``h``): :meth:`forward` then :meth:`aux_update`,
        the same calls as at an upload step; the samples trained."""
        _, y = self.forward(step)
        self.aux_update(device_loss)
        return len(y)

    def load_aux(self, state: dict[str, torch.Tensor]) -> None:
        """The server's aligned auxiliary model replaces this device's (FSL-SAGE: "the aligned
        auxiliary model is sent back to client i")."""
        self.aux.load_state_dict(state)

    def local_step(self, step: int) -> tuple[float, int]:
        """A whole-model step on the device (cut = all blocks, FedAvg): (loss sum, samples).
        The last step's gradients are dropped before the forward pass, as a training loop
        writes it: their memory then serves the forward pass (dropped after it, ~30 µs more
        per step on a small CNN)."""
        self.optimizer.zero_grad()
        x, y = self.batch(step)
        if self.dp is not None:
            self.dp.capture()
        loss = self.loss(self.runtime.forward(self.part, x), y)
        value = finite_value(loss, self.task.client)
        loss.backward()
        self._optimizer_step()
        return value * len(y), len(y)

    def _step(self, loss: torch.Tensor) -> None:
        check_finite(loss, self.task.client)
        self.optimizer.zero_grad()
        loss.backward()
        self._optimizer_step()

    def states(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor] | None]:
        """The trained device part and auxiliary model (detached clones)."""
        return detached(self.part.state_dict()), self.aux_state()

    def aux_state(self) -> dict[str, torch.Tensor] | None:
        """The trained auxiliary model (detached), None without one."""
        return None if self.aux is None else detached(self.aux.state_dict())


@dataclass
class Smashed:
    """What a member sent the server in one iteration."""

    client: int
    cut: int
    features: Activation
    labels: torch.Tensor


class ServerRole:
    """A group's server-side copy (blocks ``[min cut, n)``) and its optimiser.

    ``gen`` draws LocFedMix-SL's mixup pairs and λ (seeded per round by the executor).
    """

    def __init__(
        self,
        part: nn.Module,
        lr: float,
        train: TrainConfig,
        plan: RoundPlan,
        runtime: Runtime,
        gen: np.random.Generator,
    ):
        self.part, self.plan, self.runtime, self.gen = part, plan, runtime, gen
        self.spec = plan.topology.server
        self.optimizer = local_optimizer(part, lr, train)
        self.loss, self.loss_name = loss_fn(train.loss), train.loss

    @property
    def stop(self) -> int:
        return self.part.stop

    def align(self, task: ClientTask, aux_state: dict[str, torch.Tensor], memory: Memory) -> dict:
        """FSL-SAGE's alignment of ``task``'s client's auxiliary model (FSL-SAGE repo,
        ``src/algos/fsl_sage.py``: ``refresh_data()`` then ``align()`` at the client's first
        iteration of an alignment round): the cut-layer gradients of this server part's mean
        loss over ``memory`` (:func:`~splitfl.roles.aux_numerics.true_gradients`), then the
        fit (:func:`~splitfl.roles.aux_numerics.align_aux`); the aligned state (detached)."""
        plan, like = self.plan, next(self.part.parameters())
        x = tree_map(lambda t: _like(t, like), memory[0])
        y = memory[1].to(like.device)
        forward = lambda v: self._forward(v, task.cut)  # noqa: E731
        grads = true_gradients(forward, x, y, self.loss_name)
        aux = aux_module(plan.aux, aux_state, like)
        seed = int(self.gen.integers(2**31))
        align_aux(aux, (x, y), grads, plan.device_update.align, self.loss_name, seed)
        return detached(aux.state_dict())

    def step(self, sent: list[Smashed]) -> list[tuple[torch.Tensor, float]]:
        """One server iteration on the members' smashed data: group loss (S²FL Eq. 3, plus
        mixup terms), one optimiser step; per member (activation gradient — S²FL Eq. 4, or
        rescaled to the member's own mean loss with ``device_grad: own`` — and loss sum)."""
        spec = self.spec
        inputs = [as_server_input(s.features) for s in sent]
        losses = self._member_losses(sent, inputs)
        for s, loss_sum in zip(sent, losses, strict=True):
            check_finite(loss_sum, s.client)
        sizes = [len(s.labels) for s in sent]
        loss = group_loss(losses, sizes, spec.group_loss)
        if spec.mixup:
            loss = self._with_mixup(loss, sent, sum(sizes))
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        out = []
        for fs, loss_sum, size in zip(inputs, losses, sizes, strict=True):
            grad = input_grad(fs)
            if spec.device_grad == "own":
                factor = own_grad_factor(size, sizes, spec.group_loss)
                grad = map_grad(lambda g, f=factor: g * f, grad)
            out.append((grad, loss_sum.item()))
        return out

    def _member_losses(self, sent: list[Smashed], inputs) -> list[torch.Tensor]:
        """Each member's summed loss (``train.loss``). ``separate``: one forward per member.
        ``concat`` (MergeSFL Eq. 16, S²FL's merged batches): one forward per cut point on its
        members' concatenated smashed data (member order), the output sliced back per member;
        autograd slices the input gradient the same way."""
        mode = self.spec.forward
        if mode == "separate":
            return [
                self.loss(self._forward(fs, s.cut), s.labels, reduction="sum")
                for s, fs in zip(sent, inputs, strict=True)
            ]
        by_cut: dict[int, list[int]] = {}
        for i, s in enumerate(sent):
            by_cut.setdefault(s.cut, []).append(i)
        losses: list[torch.Tensor] = [torch.zeros(())] * len(sent)
        for cut, members in by_cut.items():
            fs = cat([inputs[i] for i in members])
            y = torch.cat([sent[i].labels for i in members])
            per_sample = self.loss(self._forward(fs, cut), y, reduction="none")
            sizes = [len(sent[i].labels) for i in members]
            for i, part in zip(members, per_sample.split(sizes), strict=True):
                losses[i] = part.sum()
        return losses

    def _with_mixup(self, loss: torch.Tensor, sent: list[Smashed], n: int) -> torch.Tensor:
        """LocFedMix-SL: the loss averaged with the mixup terms of random member pairs."""
        terms, mixed_n = [], 0
        for fm, cut, ya, yb, lam in mix_pairs(sent, self.gen, self.spec.mixup):
            out = self._forward(fm, cut)
            terms.append(
                lam * self.loss(out, ya, reduction="sum")
                + (1 - lam) * self.loss(out, yb, reduction="sum")
            )
            mixed_n += len(ya)
        if not terms:
            return loss
        return (loss * n + torch.stack(terms).sum()) / (n + mixed_n)

    def _forward(self, x: Activation, cut: int) -> torch.Tensor:
        return self.runtime.forward(self.part, x, start=cut)

    def state(self) -> dict[str, torch.Tensor]:
        return detached(self.part.state_dict())


def _like(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` on ``like``'s device, floating tensors in its dtype."""
    return t.to(like.device, like.dtype) if t.is_floating_point() else t.to(like.device)


def group_loss(losses: list[torch.Tensor], sizes: list[int], mode: str) -> torch.Tensor:
    """S²FL Eq. (3) from the members' summed losses: ``mean`` over the union of samples,
    ``sum`` of the member means, or ``member_mean``: the mean of the member means (1/N of
    their sum, every member weighing the same: RingSFL's SplitFed baseline)."""
    if mode == "mean":
        return torch.stack(losses).sum() / sum(sizes)
    total = sum(ls / s for ls, s in zip(losses, sizes, strict=True))
    return total / len(sizes) if mode == "member_mean" else total


def own_grad_factor(size: int, sizes: list[int], mode: str) -> float:
    """``device_grad: own``: what turns a member's activation gradient of the group loss
    (:func:`group_loss`, ``mode``) into the gradient of its own mean loss; ``size`` is the
    member's batch, ``sizes`` the group's."""
    if mode == "mean":
        return sum(sizes) / size
    return float(len(sizes)) if mode == "member_mean" else 1.0


def mix_pairs(sent: list[Smashed], rng: np.random.Generator, alpha: float):
    """Mixup of the smashed data of random pairs of members with equal cut points
    (LocFedMix-SL): yields (mixed features, start block, y_a, y_b, λ ~ Beta(α, α))."""
    order = rng.permutation(len(sent)).tolist()
    for a, b in zip(order[0::2], order[1::2], strict=False):
        sa, sb = sent[a], sent[b]
        if sa.cut != sb.cut:
            continue
        m = min(len(sa.labels), len(sb.labels))
        lam = float(rng.beta(alpha, alpha))
        mixed = mix(lam, head(sa.features, m), head(sb.features, m))
        mixed = tree_map(torch.Tensor.detach, mixed)
        yield mixed, sa.cut, sa.labels[:m], sb.labels[:m], lam

"""What crosses a cut: one tensor, or a tuple of tensors (an *activation*).

A model split by :mod:`splitfl.models.graph` sends every value made before the cut and used
after it: the activation, and where the model has them a skip connection, an attention mask or
the input itself. Every tensor has the batch as its first dimension. Floating tensors carry
gradients back; integer and bool tensors (masks, token ids) carry none — their gradient is
``None``. These small functions are the one place that walks such a value (imports only torch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

Activation = torch.Tensor | tuple[torch.Tensor, ...]
#: The gradient of an activation: the same structure, ``None`` for non-floating tensors.
Gradient = torch.Tensor | tuple[torch.Tensor | None, ...] | None


def leaves(x: Activation) -> list[torch.Tensor]:
    """The tensors of ``x`` in order."""
    return list(x) if isinstance(x, tuple) else [x]


def rebuild(like: Activation, parts: Sequence) -> Activation:
    """``parts`` in the structure of ``like`` (a tuple, or the one value)."""
    return tuple(parts) if isinstance(like, tuple) else parts[0]


def tree_map(fn: Callable[[torch.Tensor], torch.Tensor], x: Activation) -> Activation:
    """``fn`` applied to every tensor of ``x``."""
    return rebuild(x, [fn(t) for t in leaves(x)])


def differentiable(t: torch.Tensor) -> bool:
    return t.is_floating_point() or t.is_complex()


def as_server_input(x: Activation) -> Activation:
    """``x`` detached, its floating tensors leaves that collect a gradient (the server's side
    of S²FL Eq. 4: the gradient of the loss with respect to what the device sent)."""
    return tree_map(lambda t: t.detach().requires_grad_(differentiable(t)), x)


def input_grad(x: Activation) -> Gradient:
    """The gradients collected by :func:`as_server_input`'s leaves (zeros for a floating
    tensor the server did not use, ``None`` for a non-floating one)."""
    parts = [
        (t.grad if t.grad is not None else torch.zeros_like(t)) if differentiable(t) else None
        for t in leaves(x)
    ]
    return rebuild(x, parts)


def map_grad(fn: Callable[[torch.Tensor], torch.Tensor], grad: Gradient) -> Gradient:
    """``fn`` applied to every gradient tensor of ``grad`` (``None`` stays ``None``)."""
    return rebuild(grad, [g if g is None else fn(g) for g in leaves(grad)])


def backward(out: Activation, grad: Gradient, penalty: torch.Tensor | None = None) -> None:
    """Back-propagate ``grad`` from the device's ``out`` (its floating tensors that have a
    graph; the rest carry no gradient), and with it the device's own scalar ``penalty`` (a
    defence's loss term, one backward pass for both)."""
    pairs = [
        (t, g)
        for t, g in zip(leaves(out), leaves(grad), strict=True)
        if g is not None and t.requires_grad
    ]
    if penalty is not None and penalty.requires_grad:
        pairs.append((penalty, torch.ones_like(penalty)))
    if pairs:
        torch.autograd.backward([t for t, _ in pairs], [g for _, g in pairs])


def cat(xs: Sequence[Activation]) -> Activation:
    """Several members' activations as one batch (MergeSFL Eq. 16): each tensor concatenated
    along the batch dimension."""
    columns = zip(*(leaves(x) for x in xs), strict=True)
    return rebuild(xs[0], [torch.cat(col) for col in columns])


def batch_size(x: Activation) -> int:
    return int(leaves(x)[0].shape[0])


def head(x: Activation, m: int) -> Activation:
    """The first ``m`` samples of every tensor."""
    return tree_map(lambda t: t[:m], x)


def mix(lam: float, a: Activation, b: Activation) -> Activation:
    """Mixup ``lam·a + (1 − lam)·b`` of the floating tensors (LocFedMix-SL); non-floating
    ones (masks) are ``a``'s."""
    parts = [
        lam * ta + (1 - lam) * tb if differentiable(ta) else ta
        for ta, tb in zip(leaves(a), leaves(b), strict=True)
    ]
    return rebuild(a, parts)


def first_float(x: Activation) -> torch.Tensor:
    """The first floating tensor (the activation proper)."""
    return next((t for t in leaves(x) if differentiable(t)), leaves(x)[0])


def aux_input(x: Activation) -> torch.Tensor:
    """What an auxiliary model reads of an activation: its one floating tensor (as it is: a
    mask beside it carries no gradient), or, where several floating tensors cross the cut (an
    activation and a skip connection), all of them flattened per sample and concatenated in
    order — differentiably, so the auxiliary loss and its gradient estimate reach each one."""
    floats = [t for t in leaves(x) if differentiable(t)]
    if len(floats) < 2:
        return first_float(x)
    return torch.cat([t.flatten(1) for t in floats], dim=1)


def grad_of(value: torch.Tensor, x: Activation, create_graph: bool = False) -> Gradient:
    """∂value/∂x for the floating leaves of ``x`` that require a gradient (all of them used by
    ``value``), ``None`` for the others, in ``x``'s structure."""
    wanted = [t for t in leaves(x) if t.requires_grad]
    grads = iter(torch.autograd.grad(value, wanted, create_graph=create_graph))
    return rebuild(x, [next(grads) if t.requires_grad else None for t in leaves(x)])


def pack(name: str, x: Activation | Gradient) -> dict[str, torch.Tensor]:
    """``x`` as named message tensors: ``{name: x}`` for one tensor, ``{name.i: x[i]}`` for a
    tuple (a ``None`` gradient is left out)."""
    if not isinstance(x, tuple):
        return {} if x is None else {name: x}
    return {f"{name}.{i}": t for i, t in enumerate(x) if t is not None}


def unpack(name: str, tensors: dict, count: int | None) -> Activation | Gradient:
    """What :func:`pack` made: one tensor (``count`` None) or a tuple of ``count`` (``None``
    where a tensor is missing; the caller checks what it needs)."""
    if count is None:
        return tensors.get(name)
    return tuple(tensors.get(f"{name}.{i}") for i in range(count))


def names(name: str, count: int | None) -> set[str]:
    """The message tensor names :func:`pack` gives an activation of ``count`` tensors."""
    return {name} if count is None else {f"{name}.{i}" for i in range(count)}


def count_of(x: Activation) -> int | None:
    """None for one tensor, else the tuple's length (what :func:`unpack` takes)."""
    return len(x) if isinstance(x, tuple) else None


def stack_rows(xs: Sequence[Activation]) -> Activation:
    """Rows of activations stacked ``[rows, batch, ...]`` per tensor (the vectorised
    executor's row stacks)."""
    columns = zip(*(leaves(x) for x in xs), strict=True)
    return rebuild(xs[0], [torch.stack(col) for col in columns])


def row_of(x: Activation, i: int) -> Activation:
    """Row ``i`` of every tensor of stacked activations."""
    return tree_map(lambda t: t[i], x)

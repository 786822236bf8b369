"""The auxiliary-model numerics of a split round, written once for every executor.

* :func:`aux_module` — a plan's auxiliary model (:class:`~splitfl.core.plan.AuxSpec`) holding a
  given state, built without drawing from torch's random stream.
* :func:`device_aux` — the same, as a device holds it (the executors' and device processes').
* :func:`returned_names` — what of it a device sends back after a round.
* :func:`estimate_gradient` — FSL-SAGE's estimate of the server's cut-layer gradient: the
  gradient of the auxiliary model's mean loss w.r.t. the smashed data (FSL-SAGE repo,
  ``src/models/aux_models/__init__.py::GradScalarAuxiliaryModel.forward``:
  ``autograd.grad(criterion(forward_inner(x), label), x, create_graph=True)``).
* :func:`true_gradients` — the server's cut-layer gradients of its mean loss over the samples
  it kept (``AuxiliaryModel.refresh_data``: one forward/backward of the whole memory).
* :func:`align_aux` — the fit of the auxiliary model's estimates to those gradients
  (``GradScalarAuxiliaryModel.align``/``align_loss``: ``mse_loss(..., reduction='sum')``,
  Adam, ``epochs`` passes over shuffled batches).
* :func:`remember` — the server's memory of a client's uploads, the last ``size`` samples
  (``AuxiliaryModel.add_datapoint``).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from splitfl.core.activations import (
    Activation,
    Gradient,
    as_server_input,
    aux_input,
    cat,
    grad_of,
    leaves,
    tree_map,
)
from splitfl.core.topology import AlignSpec, AuxSpec
from splitfl.extensions import build_aux
from splitfl.models.aux_heads import aux_flops
from splitfl.training import loss_fn

State = dict[str, torch.Tensor]
#: The server's memory of a client's uploads: what crossed the cut, and the labels.
Memory = tuple[Activation, torch.Tensor]


def aux_module(spec: AuxSpec, state: State, like: torch.Tensor | None = None) -> nn.Module:
    """The auxiliary model ``spec`` builds, holding ``state`` (on ``like``'s device and dtype
    where given). Built under a forked torch random stream: the caller's draws are unchanged."""
    with torch.random.fork_rng(devices=[]):
        module = build_aux(spec.model, spec.input_shape, spec.num_classes)
    if like is not None:
        module = module.to(like.device, like.dtype)
    module.load_state_dict(state)
    return module


def spec_flops(spec: AuxSpec, dtype: torch.dtype) -> float:
    """Forward + backward FLOPs per sample of the auxiliary model ``spec`` builds
    (:func:`~splitfl.models.aux_heads.aux_flops`, as the cost model charges them), built under a
    forked torch random stream."""
    with torch.random.fork_rng(devices=[]):
        module = build_aux(spec.model, spec.input_shape, spec.num_classes).to(dtype)
    return aux_flops(module, spec.input_shape, dtype)


def device_aux(spec: AuxSpec, state: State) -> nn.Module:
    """The auxiliary model a device steps with, holding ``state`` on its floating tensors'
    device and dtype: the in-process executors and the device processes build it here."""
    like = next((v for v in state.values() if v.is_floating_point()), None)
    return aux_module(spec, state, like)


def estimate_gradient(
    aux: nn.Module, fx: Activation, y: torch.Tensor, loss: str, forward: Callable
) -> Gradient:
    """ĝ = ∂ℓ(aux(fx), y)/∂fx with ℓ the mean ``loss`` over the batch (no graph kept), for
    each floating tensor of ``fx`` (the auxiliary model reads
    :func:`~splitfl.core.activations.aux_input`; ``None`` for a mask)."""
    x = as_server_input(fx)
    value = loss_fn(loss)(forward(aux, aux_input(x)), y)
    return grad_of(value, x)


def true_gradients(server: Callable, x: Activation, y: torch.Tensor, loss: str) -> Gradient:
    """g = ∂ℓ(server(x), y)/∂x, ℓ the mean ``loss`` over all of ``x`` (the server part runs in
    its current mode, train: as ``refresh_data``, BatchNorm statistics included), for each
    floating tensor of ``x``."""
    x = as_server_input(x)
    value = loss_fn(loss)(server(x), y)
    return grad_of(value, x)


def align_aux(
    aux: nn.Module,
    memory: Memory,
    grads: Gradient,
    spec: AlignSpec,
    loss: str,
    seed: int,
) -> float:
    """Fit ``aux`` in place: ``spec.epochs`` passes over ``memory`` in batches of
    ``spec.batch_size`` (shuffled by a generator seeded with ``seed``), each an Adam step (lr
    ``spec.lr``, torch's other defaults, a fresh optimiser) on
    Σ (∂ℓ(aux(x_b), y_b)/∂x_b − g_b)² — ℓ the mean over the batch, as FSL-SAGE's
    ``align_loss`` (second-order autograd: ``create_graph``), summed over the floating tensors
    where several cross the cut. Returns the last batch's loss."""
    x_all, y_all = memory
    criterion = loss_fn(loss)
    optimizer = torch.optim.Adam(aux.parameters(), lr=spec.lr)
    gen = torch.Generator().manual_seed(seed)
    last = float("nan")
    for _ in range(spec.epochs):
        for idx in torch.randperm(len(y_all), generator=gen).split(spec.batch_size):
            x = as_server_input(tree_map(lambda t, i=idx: t[i], x_all))
            estimate = grad_of(criterion(aux(aux_input(x)), y_all[idx]), x, create_graph=True)
            pairs = zip(leaves(estimate), leaves(grads), strict=True)
            terms = [((e - g[idx]) ** 2).sum() for e, g in pairs if e is not None]
            value = terms[0]
            for term in terms[1:]:
                value = value + term
            optimizer.zero_grad()
            value.backward()
            optimizer.step()
            last = value.item()
    return last


def remember(memory: Memory | None, x: Activation, y: torch.Tensor, size: int) -> Memory:
    """``memory`` with ``(x, y)`` appended, the oldest dropped beyond ``size`` samples (every
    tensor that crossed the cut: the server's forward needs them all)."""
    x, y = tree_map(lambda t: t.detach().cpu(), x), y.detach().cpu()
    if memory is not None:
        x, y = cat([memory[0], x]), torch.cat([memory[1], y])
    return tree_map(lambda t: t[-size:], x), y[-size:]


def returned_names(aux: nn.Module, device_loss: str) -> set[str]:
    """The entries of ``aux``'s state a device sends back after its round: all of them with
    ``device_loss: local`` (the device trains the auxiliary model: CSE-FSL, LocFedMix-SL, whose
    servers average it), else (``estimate``, FSL-SAGE) only its buffers — BatchNorm's running
    statistics and counter change with every forward in train mode on the device, while its
    parameters change only by the server's alignment, which the server already holds."""
    if device_loss in ("local", "local+server"):
        return set(aux.state_dict())
    return set(aux.state_dict()) - {name for name, _ in aux.named_parameters()}

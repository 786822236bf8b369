"""What the eavesdropper of RingSFL §4.2.5 (``papers/ringsfl.md``) observes: the model a client
uploads to the server, turned into a gradient for the DLG attack (:mod:`splitfl.privacy.attack`).

* FedAvg: client 0 uploads ``W' = W − lr·∇L(x_0)``, so ``(W − W')/lr`` is its exact gradient.
* RingSFL: client 0 uploads a *blended* model (one
  :func:`~splitfl.topologies.ring.member.ring_batch_update` with ``a_i = 1/N``): each of its blocks
  was trained by whichever clients' batches passed through
  it. The eavesdropper, not knowing the propagation lengths, takes ``(W − W_0')/(lr·a_0)`` as
  client 0's full gradient and runs the same attack.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from splitfl.models.base import BlockModel
from splitfl.topologies.ring.member import ring_batch_update


def gradient_from_update(
    before: Mapping[str, torch.Tensor] | nn.Module,
    after: Mapping[str, torch.Tensor] | nn.Module,
    lr_effective: float,
) -> dict[str, torch.Tensor]:
    """``(before − after) / lr_effective`` per parameter (models or name → tensor mappings)."""
    if lr_effective == 0:
        raise ValueError("lr_effective must be non-zero")
    b = _params(before)
    a = _params(after)
    if set(a) != set(b):
        raise ValueError("before and after hold different parameter names")
    return {k: (b[k] - a[k]) / lr_effective for k in b}


def _params(obj: Mapping[str, torch.Tensor] | nn.Module) -> dict[str, torch.Tensor]:
    if isinstance(obj, nn.Module):
        return {k: p.detach().clone() for k, p in obj.named_parameters()}
    return {k: torch.as_tensor(v).detach().clone() for k, v in obj.items()}


def true_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The exact gradient of the mean cross-entropy of ``(x, y)`` for every parameter."""
    names, params = zip(*model.named_parameters(), strict=True)
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), params)
    return {n: g.detach().clone() for n, g in zip(names, grads, strict=True)}


def observe_fedavg(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float
) -> dict[str, torch.Tensor]:
    """FedAvg upload: one local SGD step of a copy of ``model`` on ``(x, y)``; the eavesdropper
    computes ``(W − W')/lr`` (the exact gradient, up to floating-point rounding)."""
    local = copy.deepcopy(model)
    local.zero_grad(set_to_none=True)
    F.cross_entropy(local(x), y).backward()
    with torch.no_grad():
        for p in local.parameters():
            if p.grad is not None:
                p.sub_(lr * p.grad)
    return gradient_from_update(model, local, lr)


def observe_ringsfl(
    model: BlockModel,
    xs: torch.Tensor,
    ys: torch.Tensor,
    lengths: Sequence[int],
    lr: float,
    dynamic_lr: bool = False,
) -> dict[str, torch.Tensor]:
    """RingSFL upload of client 0 after one BatchUpdate of ``N = len(xs)`` clients.

    Client i holds sample ``xs[i]`` and the propagation length ``lengths[i]``; every client
    starts from ``model`` and the weights are ``a_i = 1/N``. Returns the eavesdropper's
    pseudo-gradient ``(W − W_0')/(lr·a_0)`` of client 0's uploaded blended model.
    """
    n = len(xs)
    if len(ys) != n or len(lengths) != n:
        raise ValueError(f"{n} samples but {len(ys)} labels and {len(lengths)} lengths")
    if sum(lengths) > model.num_blocks or min(lengths) < 1:
        raise ValueError(f"lengths {list(lengths)} must be >= 1 and sum to <= {model.num_blocks}")
    order = list(range(n))
    models = {i: copy.deepcopy(model) for i in order}
    batches = {i: (xs[i : i + 1], ys[i : i + 1]) for i in order}
    weights = {i: 1.0 / n for i in order}
    ring_batch_update(models, order, dict(enumerate(lengths)), batches, weights, lr, dynamic_lr)
    return gradient_from_update(model, models[0], lr * weights[0])

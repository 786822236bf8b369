"""Deep Leakage from Gradients (Zhu et al., NeurIPS 2019), the attack of RingSFL §4.2.5,
scored by the cosine similarity to the true image (Eq. 9):  s = xᵀx̂ / (‖x‖₂ ‖x̂‖₂)  on
flattened images.

The attack (:func:`dlg_attack`) optimises a dummy input (and, for DLG, a dummy soft label) so that
the gradient it induces on the known pre-update model matches the observed one (sum of squared
differences over all parameters), with L-BFGS as in Zhu et al. (``optimizer="lbfgs"``, strong
Wolfe line search for stability, ``max_iter`` inner steps per iteration) or Adam. With
``label="idlg"`` the label of a single sample is read off the sign of the last layer's gradient
(iDLG, Zhao et al. 2020) and only the input is optimised. The observed gradients come from
:mod:`splitfl.privacy.observe`; the experiment around it is :mod:`splitfl.privacy.experiment`.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class DLGResult:
    """Reconstruction ``[B, *input_shape]`` (after the last finite iteration), the cosine to the
    true input after each iteration (Eq. 9; empty without ``true_x``), the gradient-matching
    loss of each iteration (normalised by ``Σ‖g‖²``; for L-BFGS the value at the iteration's
    start) and ``label``: the inferred (iDLG) label or the final soft label's argmax."""

    reconstruction: torch.Tensor
    cosine_history: list[float] = field(default_factory=list)
    loss_history: list[float] = field(default_factory=list)
    label: list[int] = field(default_factory=list)


def cosine_similarity(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """RingSFL Eq. (9) on flattened tensors."""
    a = x.detach().reshape(-1).double()
    b = x_hat.detach().reshape(-1).double()
    denom = a.norm() * b.norm()
    return float(a @ b / denom) if denom > 0 else 0.0


def infer_label(model: nn.Module, target_grads: Mapping[str, torch.Tensor]) -> int:
    """iDLG: for one sample and cross-entropy, the last layer's bias gradient is
    ``softmax(z) − onehot(y)``, negative only at the true label; without a bias, the row of the
    last weight gradient with the smallest sum (its inputs are non-negative after ReLU/Sigmoid)."""
    last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    names = {id(p): n for n, p in model.named_parameters()}
    if last.bias is not None and names[id(last.bias)] in target_grads:
        return int(torch.argmin(target_grads[names[id(last.bias)]]))
    return int(torch.argmin(target_grads[names[id(last.weight)]].sum(dim=1)))


def _matched(
    net: nn.Module, target_grads: Mapping[str, torch.Tensor]
) -> tuple[list[torch.Tensor], list[torch.Tensor], float]:
    """The parameters of ``net`` named in ``target_grads``, their observed gradients (in the
    parameters' dtype) and ``Σ‖g‖²`` (1 when zero), the matching loss's normaliser."""
    names = [n for n, _ in net.named_parameters() if n in target_grads]
    if not names:
        raise ValueError("target_grads names none of the model's parameters")
    params = dict(net.named_parameters())
    matched = [params[n] for n in names]
    targets = [target_grads[n].detach().to(params[n].dtype) for n in names]
    scale = float(sum((t**2).sum() for t in targets)) or 1.0
    return matched, targets, scale


def _optimizer(
    variables: list[torch.Tensor], optimizer: str, lr: float | None, max_iter: int
) -> torch.optim.Optimizer:
    """L-BFGS (Zhu et al.; ``lr`` default 1, strong-Wolfe line search) or Adam (default 0.1)."""
    if optimizer == "lbfgs":
        return torch.optim.LBFGS(
            variables,
            lr=1.0 if lr is None else lr,
            max_iter=max_iter,
            tolerance_grad=1e-10,
            tolerance_change=1e-12,
            line_search_fn="strong_wolfe",
        )
    return torch.optim.Adam(variables, lr=0.1 if lr is None else lr)


def _optimise(
    opt: torch.optim.Optimizer,
    closure: Callable[[], torch.Tensor],
    dummy_x: torch.Tensor,
    iterations: int,
    true_x: torch.Tensor | None,
) -> DLGResult:
    """``iterations`` optimiser steps; stops at the first non-finite loss or input, keeping
    the last finite reconstruction; the cosine (Eq. 9) to ``true_x`` after each step."""
    result = DLGResult(reconstruction=dummy_x.detach().clone())
    for _ in range(iterations):
        loss = opt.step(closure)
        value = float(loss.detach())
        if not math.isfinite(value) or not torch.isfinite(dummy_x).all():
            break  # keep the last finite reconstruction
        result.loss_history.append(value)
        result.reconstruction = dummy_x.detach().clone()
        if true_x is not None:
            result.cosine_history.append(cosine_similarity(true_x, dummy_x))
    return result


def dlg_attack(
    model: nn.Module,
    target_grads: Mapping[str, torch.Tensor],
    input_shape: Sequence[int],
    num_classes: int,
    iterations: int = 300,
    seed: int = 0,
    true_x: torch.Tensor | None = None,
    *,
    batch_size: int = 1,
    optimizer: str = "lbfgs",
    label: str = "idlg",
    lr: float | None = None,
    max_iter: int = 20,
) -> DLGResult:
    """Reconstruct the input behind ``target_grads`` (parameter name → observed gradient).

    Minimises ``Σ_params ‖∇_θ L(model(x̂), ŷ) − g‖²`` (divided by the constant ``Σ‖g‖²`` so the
    optimiser's tolerances do not depend on the gradients' scale) over the dummy input ``x̂``
    (seeded standard normal start) and, with ``label="soft"`` (DLG), a dummy label
    ``ŷ = softmax(z)``; with ``label="idlg"`` (single sample only) ŷ is fixed to
    :func:`infer_label`. Only parameters named in ``target_grads`` are matched (pass a subset
    to attack some layers only). ``optimizer`` is ``"lbfgs"`` (Zhu et al.; ``lr`` default 1,
    ``max_iter`` inner steps and strong-Wolfe line search per iteration) or ``"adam"`` (``lr``
    default 0.1, one step per iteration).
    ``model`` keeps its parameters (a private copy is attacked; its train/eval mode is kept).
    """
    if optimizer not in ("lbfgs", "adam"):
        raise ValueError(f"optimizer must be lbfgs or adam (got {optimizer!r})")
    if label not in ("idlg", "soft"):
        raise ValueError(f"label must be idlg or soft (got {label!r})")
    if label == "idlg" and batch_size != 1:
        label = "soft"  # iDLG's sign rule identifies a single sample's label only
    net = copy.deepcopy(model)
    for p in net.parameters():
        p.requires_grad_(True)
    matched, targets, scale = _matched(net, target_grads)

    gen = torch.Generator().manual_seed(seed)
    dummy_x = torch.randn((batch_size, *input_shape), generator=gen).requires_grad_(True)
    variables = [dummy_x]
    fixed_y = None
    dummy_z = None
    if label == "idlg":
        fixed_y = torch.tensor([infer_label(net, target_grads)])
    else:
        dummy_z = torch.randn((batch_size, num_classes), generator=gen).requires_grad_(True)
        variables.append(dummy_z)

    def matching_loss() -> torch.Tensor:
        out = net(dummy_x)
        if fixed_y is not None:
            task = F.cross_entropy(out, fixed_y)
        else:
            task = torch.mean(torch.sum(-F.softmax(dummy_z, -1) * F.log_softmax(out, -1), -1))
        grads = torch.autograd.grad(task, matched, create_graph=True)
        diff = sum(((g - t) ** 2).sum() for g, t in zip(grads, targets, strict=True))
        return diff / scale

    opt = _optimizer(variables, optimizer, lr, max_iter)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = matching_loss()
        loss.backward(inputs=variables)
        return loss

    result = _optimise(opt, closure, dummy_x, iterations, true_x)
    if fixed_y is not None:
        result.label = fixed_y.tolist()
    else:
        result.label = dummy_z.detach().argmax(-1).tolist()
    return result

"""Input reconstruction from smashed data by an honest-but-curious server.

The server holds the smashed data ``z = f(x)`` a device sent (recorded in a run or computed
here) and, in SplitFed-style algorithms, the device part ``f`` itself (every device part is
uploaded for aggregation, so the server knows it after each round).

* :func:`unsplit_attack` — UnSplit (Erdogan, Küpçü, Çiçek, WPES 2022, §4; authors' code
  ``ege-erdogan/unsplit``, ``unsplit/attacks.py::model_inversion_stealing``): minimise
  ``MSE(f̂(x̂), z) + λ_TV·TV(x̂) + λ_2·mean(x̂²)`` over ``x̂`` (start: all 0.5, Adam
  ``lr = 0.001``, AMSGrad, as the authors' code), alternating, where ``model_iters > 0``,
  with steps of a clone ``f̂`` of the device part on ``MSE(f̂(x̂), z)`` (the paper's model
  stealing when the server knows only the architecture). With ``model_iters = 0`` the device
  part is known and only the input is optimised. ``optimizer="lbfgs"`` replaces Adam for the
  input (not in the paper: it solves the convex case, a linear device part, exactly).
  TV is the authors' squared-difference total variation (``unsplit/util.py::TV``).
* :func:`reinitialised` / :func:`align_to_domain` — the paper's server that knows only the
  device part's *architecture* (Alg. 1): a freshly drawn model of that architecture, stepped by
  :func:`unsplit_attack`'s model stealing; its reconstruction is defined only up to the
  affine map the estimated part absorbs, so it is brought into the auxiliary data's range
  (the authors' ``unsplit/util.py::normalize``) with a sign chosen against the auxiliary
  mean image (not in the paper).
* :func:`train_inverse_network` / :func:`invert` — the learned inverse network of He, Zhang
  and Lee, "Model inversion attacks against collaborative inference", ACSAC 2019, §4.2
  (black-box attack: query ``f`` on auxiliary data of the same domain, fit ``g ≈ f⁻¹`` by
  minimising ``‖g(f(x_aux)) − x_aux‖²``, then reconstruct ``x̂ = g(z)``). FORA (Xu et al.,
  CVPR 2024) and PCAT (Gao & Zhang 2023) first train a substitute of ``f``; here the server
  queries the device part it received, as in He et al.'s white-/black-box setting.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from splitfl.core.activations import Activation, leaves


@dataclass
class Reconstruction:
    """Reconstructed inputs ``[B, *input_shape]`` and the attack objective of each outer
    iteration (UnSplit: at the start of its last input step, as L-BFGS reports it)."""

    inputs: torch.Tensor
    loss_history: list[float] = field(default_factory=list)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """UnSplit's TV (``unsplit/util.py::TV``): mean squared vertical and horizontal
    neighbour differences of ``[B, C, H, W]`` per image; 0 for inputs that are not images."""
    if x.dim() != 4:
        return x.new_zeros(())
    b = x.shape[0]
    h_tv = ((x[:, :, 1:, :] - x[:, :, :-1, :]) ** 2).sum() / x[0, :, 1:, :].numel()
    w_tv = ((x[:, :, :, 1:] - x[:, :, :, :-1]) ** 2).sum() / x[0, :, :, 1:].numel()
    return (h_tv + w_tv) / b


def smashed_mse(out: Activation, target: Activation) -> torch.Tensor:
    """Mean squared error between two activations (summed over a tuple's float leaves)."""
    pairs = [(o, t) for o, t in zip(leaves(out), leaves(target), strict=True)]
    return sum(F.mse_loss(o, t.to(o.dtype)) for o, t in pairs if t.is_floating_point())


def unsplit_attack(
    device_part: nn.Module,
    smashed: Activation,
    input_shape: Sequence[int],
    *,
    iterations: int = 1000,
    input_iters: int = 1,
    model_iters: int = 0,
    lambda_tv: float = 0.1,
    lambda_l2: float = 1.0,
    lr: float = 0.001,
    optimizer: str = "adam",
) -> Reconstruction:
    """UnSplit: reconstruct the inputs behind ``smashed`` (``[B, ...]``) from the device part.

    ``iterations`` outer iterations, each ``input_iters`` steps on the input and (stealing,
    ``model_iters > 0``) ``model_iters`` steps of a private clone of ``device_part`` (the
    authors' ``main_iters``, ``input_iters``, ``model_iters``; their defaults are 1000, 100,
    100 with λ_TV = 0.1, λ_2 = 1). ``device_part`` is never changed (a clone is stepped);
    for the paper's architecture-only server pass a freshly initialised model of the same
    architecture and ``model_iters > 0``.
    """
    if optimizer not in ("adam", "lbfgs"):
        raise ValueError(f"optimizer must be adam or lbfgs (got {optimizer!r})")
    clone = copy.deepcopy(device_part).eval()
    for p in clone.parameters():
        p.requires_grad_(model_iters > 0)
    target = tuple(t.detach() for t in leaves(smashed))
    batch = target[0].shape[0]
    x_hat = torch.full((batch, *input_shape), 0.5, dtype=target[0].dtype)
    x_hat.requires_grad_(True)
    if optimizer == "adam":
        input_opt: torch.optim.Optimizer = torch.optim.Adam([x_hat], lr=lr, amsgrad=True)
    else:
        input_opt = torch.optim.LBFGS(
            [x_hat],
            lr=1.0,
            tolerance_grad=1e-14,
            tolerance_change=0.0,
            line_search_fn="strong_wolfe",
        )
    model_opt = (
        torch.optim.Adam(clone.parameters(), lr=lr, amsgrad=True) if model_iters > 0 else None
    )

    def input_loss() -> torch.Tensor:
        input_opt.zero_grad()
        loss = smashed_mse(clone(x_hat), target)
        loss = loss + lambda_tv * total_variation(x_hat) + lambda_l2 * (x_hat**2).mean()
        loss.backward(inputs=[x_hat])
        return loss

    history = []
    for _ in range(iterations):
        for _ in range(input_iters):
            loss = input_opt.step(input_loss)
        if model_opt is not None:
            for _ in range(model_iters):
                model_opt.zero_grad()
                smashed_mse(clone(x_hat.detach()), target).backward()
                model_opt.step()
        value = float(loss.detach())
        if not math.isfinite(value):
            break
        history.append(value)
    return Reconstruction(inputs=x_hat.detach().clone(), loss_history=history)


def inverse_network(
    smashed_shape: Sequence[int], input_shape: Sequence[int], width: int = 64
) -> nn.Module:
    """The decoder ``g`` (He et al. 2019 use a mirror of ``f``; any decoder of the same
    capacity serves): for image smashed data ``[C, h, w]`` and image inputs ``[C', H, W]``,
    bilinear upsampling to ``H × W`` and three 3×3 convolutions (``width``, ``width``, ``C'``
    channels, ReLU between); otherwise an MLP ``flatten → 8·width → prod(input_shape)``."""
    smashed_shape, input_shape = tuple(smashed_shape), tuple(input_shape)
    if len(smashed_shape) == 3 and len(input_shape) == 3:
        c_in = smashed_shape[0]
        return nn.Sequential(
            nn.Upsample(size=input_shape[1:], mode="bilinear", align_corners=False),
            nn.Conv2d(c_in, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, input_shape[0], 3, padding=1),
        )
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(smashed_shape), 8 * width),
        nn.ReLU(),
        nn.Linear(8 * width, math.prod(input_shape)),
        nn.Unflatten(1, input_shape),
    )


def train_inverse_network(
    device_part: nn.Module,
    auxiliary: torch.Tensor,
    *,
    epochs: int = 20,
    batch_size: int = 64,
    lr: float = 0.001,
    seed: int = 0,
    width: int = 64,
) -> tuple[nn.Module, list[float]]:
    """He et al. 2019 §4.2: query ``device_part`` (eval mode, a clone) on the auxiliary inputs
    and fit the inverse network by Adam on ``‖g(f(x_aux)) − x_aux‖²`` (mean), batches drawn
    from ``seed`` (``width``: :func:`inverse_network`'s); returns ``g`` and the mean loss of
    each epoch."""
    clone = copy.deepcopy(device_part).eval()
    with torch.no_grad():
        codes = clone(auxiliary)
    if isinstance(codes, tuple):
        raise ValueError("the inverse network needs one tensor crossing the cut")
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        g = inverse_network(codes.shape[1:], auxiliary.shape[1:], width)
    opt = torch.optim.Adam(g.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    history = []
    for _ in range(epochs):
        order = torch.randperm(len(auxiliary), generator=gen)
        total = 0.0
        for idx in order.split(batch_size):
            opt.zero_grad()
            loss = F.mse_loss(g(codes[idx]), auxiliary[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
        history.append(total / len(auxiliary))
    return g.eval(), history


def invert(inverse: nn.Module, smashed: torch.Tensor) -> torch.Tensor:
    """``x̂ = g(z)`` for recorded smashed data ``z``."""
    with torch.no_grad():
        return inverse(smashed.detach())


def reinitialised(part: nn.Module, seed: int) -> nn.Module:
    """A deep copy of ``part`` with every module that has ``reset_parameters`` re-drawn, in
    ``modules()`` order, from ``torch.manual_seed(seed)`` inside ``fork_rng`` (the caller's
    random state is untouched): the architecture-only server's starting clone (UnSplit,
    Erdogan et al., WPES 2022, Alg. 1; the authors' ``model_inversion_demo.py`` attacks with
    a fresh ``MnistNet()``/``CifarNet()``). BatchNorm's running statistics are reset with its
    affine parameters. A parameter or buffer of a module without ``reset_parameters`` keeps
    the value ``part`` has: nothing here knows how to draw it."""
    clone = copy.deepcopy(part)
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(seed)
        for module in clone.modules():
            reset = getattr(module, "reset_parameters", None)
            if callable(reset):
                reset()
    return clone


def align_to_domain(x_hat: torch.Tensor, auxiliary: torch.Tensor) -> torch.Tensor:
    """Each reconstruction ``x_hat[i]`` min-max scaled into the range of the auxiliary data
    ``[auxiliary.min(), auxiliary.max()]``: the authors' ``unsplit/util.py::normalize`` (per
    image, into [0, 1] there; an image with no range goes to the range's low end, as their
    zeros), which their demo applies to CIFAR-10 reconstructions.

    Not in the paper: first the sign of ``x_hat[i]`` is chosen so that its Pearson
    correlation with the auxiliary mean image is not negative. A clone fitted by model
    stealing can reproduce the smashed data from ``−x`` as well as from ``x`` (a conv + ReLU
    clone did: correlation −1.000 with the true image on 8 of 8 images), and min-max
    scaling alone keeps that inversion."""
    flat = x_hat.flatten(1)
    mean = auxiliary.mean(0).flatten().to(flat.dtype)
    centred = flat - flat.mean(1, keepdim=True)
    agree = centred @ (mean - mean.mean())
    signed = torch.where((agree < 0)[:, None], -flat, flat)
    low = signed.min(1, keepdim=True).values
    span = signed.max(1, keepdim=True).values - low
    unit = torch.where(span > 0, (signed - low) / span.clamp_min(1e-30), 0.0)
    lo, hi = float(auxiliary.min()), float(auxiliary.max())
    return (lo + unit * (hi - lo)).reshape(x_hat.shape)

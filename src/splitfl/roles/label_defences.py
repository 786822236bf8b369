"""Label defences of the U-shaped family (``train.defence.label_noise``): the device, which
holds the labels, perturbs the cut-layer gradients ``g_i = ∂L/∂h_i`` it sends the server.

Li et al., "Label Leakage and Protection in Two-party Split Learning" (ICLR 2022), §4, for a
binary task (here: ``label_positive`` against the rest); the authors' code is followed
(``OscarcarLi/label-protection``: ``solver.py``, and ``gradient_masking`` and
``KL_gradient_perturb`` of ``custom_gradients_masking.py``):

* **max-norm** (§4.1, "expectation norm alignment"): ``g̃_i = g_i·(1 + σ_i·ξ_i)``,
  ``ξ_i ~ N(0, 1)`` one scalar per sample, ``σ_i = sqrt(max(‖g_max‖²/‖g_i‖² − 1, 0))`` with
  ``‖g_max‖`` the batch's largest norm: every sample's expected squared norm is the largest
  one, so the norm no longer tells the classes apart.
* **Marvell** (§4.2): class ``k``'s gradients get ``N(0, Σ_k)`` noise, ``Σ_k = λ2k·I +
  (λ1k − λ2k)·ΔΔᵀ/‖Δ‖²``, ``Δ = ḡ₁ − ḡ₀`` the difference of the classes' mean gradients in the
  batch; the four λ minimise the symmetrised KL (sumKL) between the two classes' perturbed
  gradient distributions, modelled as Gaussians with isotropic coordinate variances ``u``
  (negatives) and ``v`` (positives) (Li et al. Eq. 6 and App. A):

      (d−1)(λ20+u)/(λ21+v) + (d−1)(λ21+v)/(λ20+u) + (λ10+u+g)/(λ11+v) + (λ11+v+g)/(λ10+u)

  with ``g = ‖Δ‖²``, subject to the power budget ``p(λ11 + (d−1)λ21) + (1−p)(λ10 +
  (d−1)λ20) ≤ P``, ``P = s·g`` (``marvell_s``), ``p`` the batch's positive fraction,
  ``λ1k ≥ λ2k ≥ 0``. Where we differ: the authors solve it by coordinate descent with their
  own 1-D convex searches; :func:`marvell_lambdas` hands the same objective and constraints
  to SciPy's SLSQP from a few starts (the minimiser of the same problem, to solver
  tolerance). A batch with only one class is sent unperturbed (Δ is undefined; the authors'
  code divides by zero there).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from splitfl.config import DefenceConfig


def _rows(g: torch.Tensor) -> torch.Tensor:
    return g.reshape(len(g), -1)


def max_norm_noise(grads: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Li et al. §4.1 (the authors' ``gradient_masking``): each sample's gradient times
    ``1 + σ_i·ξ_i`` (see the module docstring)."""
    norms = _rows(grads).norm(dim=1)
    top = norms.max()
    ratio = (top**2 / (norms**2 + 1e-32) - 1.0).clamp_min(0.0)
    xi = torch.randn(len(grads), generator=gen, device=grads.device, dtype=grads.dtype)
    factor = 1.0 + xi * ratio.sqrt()
    return grads * factor.reshape(-1, *([1] * (grads.dim() - 1)))


def sum_kl(lams: np.ndarray, u: float, v: float, d: float, g: float) -> float:
    """The authors' ``symKL_objective`` (2·sumKL + 2d: minimising it minimises sumKL)."""
    l10, l20, l11, l21 = (float(x) for x in lams)
    return (
        (d - 1) * (l20 + u) / (l21 + v)
        + (d - 1) * (l21 + v) / (l20 + u)
        + (l10 + u + g) / (l11 + v)
        + (l11 + v + g) / (l10 + u)
    )


def marvell_lambdas(u: float, v: float, d: int, g: float, p: float, power: float) -> np.ndarray:
    """(λ10, λ20, λ11, λ21) minimising :func:`sum_kl` under the power budget (SLSQP)."""
    from scipy.optimize import minimize

    tiny = 1e-12 * max(g, 1e-30)
    u, v = max(u, tiny), max(v, tiny)  # u = v = 0 (one sample per class): the zero-uv case
    scale = power if power > 0 else 1.0

    def objective(x: np.ndarray) -> float:
        return sum_kl(x * scale, u, v, d, g)

    budget = {
        "type": "ineq",
        "fun": lambda x: (
            power / scale - (p * (x[2] + (d - 1) * x[3]) + (1 - p) * (x[0] + (d - 1) * x[1]))
        ),
    }
    order = [
        {"type": "ineq", "fun": lambda x: x[0] - x[1]},
        {"type": "ineq", "fun": lambda x: x[2] - x[3]},
    ]
    starts = [  # all power along Δ, or spread over every coordinate
        np.array([1.0, 0.0, 1.0, 0.0]),
        np.array([1.0, 1.0, 1.0, 1.0]) / d,
        np.array([1.0 / (1 - p) if p < 1 else 0.0, 0.0, 0.0, 0.0]),
        np.array([0.0, 0.0, 1.0 / p if p > 0 else 0.0, 0.0]),
    ]
    best = None
    for x0 in starts:
        res = minimize(
            objective, x0, method="SLSQP", bounds=[(0, None)] * 4,
            constraints=[budget, *order], options={"maxiter": 500, "ftol": 1e-12},
        )  # fmt: skip
        if best is None or res.fun < best.fun:
            best = res
    return np.clip(best.x, 0, None) * scale


def marvell_noise(
    grads: torch.Tensor, positive: torch.Tensor, s: float, gen: torch.Generator
) -> torch.Tensor:
    """Li et al. §4.2 (the authors' ``KL_gradient_perturb``, ``uv_choice='uv'``,
    ``p_frac='pos_frac'``, not dynamic): ``grads`` with Marvell's class-dependent noise
    (``positive``: a bool per sample)."""
    rows = _rows(grads).double()
    pos, neg = rows[positive], rows[~positive]
    if len(pos) == 0 or len(neg) == 0:
        return grads
    delta = pos.mean(0) - neg.mean(0)
    g = float(delta.pow(2).sum())
    if g == 0.0:
        return grads
    u = float((neg - neg.mean(0)).pow(2).mean(0).mean())
    v = float((pos - pos.mean(0)).pow(2).mean(0).mean())
    d, p = rows.shape[1], float(positive.double().mean())
    l10, l20, l11, l21 = marvell_lambdas(u, v, d, g, p, s * g)
    unit = delta / math.sqrt(g)
    shape = (len(rows),)
    along = torch.randn(shape, generator=gen, dtype=torch.float64, device=rows.device)
    sphere = torch.randn(rows.shape, generator=gen, dtype=torch.float64, device=rows.device)
    lam1 = torch.where(positive, l11, l10).to(rows)
    lam2 = torch.where(positive, l21, l20).to(rows)
    noise = (along * (lam1 - lam2).clamp_min(0).sqrt()).unsqueeze(1) * unit
    noise = noise + sphere * lam2.sqrt().unsqueeze(1)
    return (rows + noise).to(grads.dtype).reshape(grads.shape)


def protect_labels(
    config: DefenceConfig, grads: torch.Tensor, labels: torch.Tensor, seed: int
) -> torch.Tensor:
    """The head's cut-layer gradients ``grads`` as the device sends them under
    ``label_noise`` (noise drawn from a generator seeded ``seed`` on their device)."""
    if config.label_noise == "none":
        return grads
    gen = torch.Generator(device=grads.device).manual_seed(seed)
    if config.label_noise == "max_norm":
        return max_norm_noise(grads, gen)
    positive = labels.reshape(-1).to(grads.device) == config.label_positive
    return marvell_noise(grads, positive, config.marvell_s, gen)


def label_flops_per_sample(method: str, grad_elements: int) -> float:
    """The device FLOPs a label defence adds per sample (the clock charges them): max-norm
    ≈ 4 per gradient element (norm 2, scale and add 2); Marvell ≈ 12 (class means and
    variances 6, the noise along Δ and spherical, drawn and added, 6); the solver's few
    hundred FLOPs per batch are left out."""
    return {"max_norm": 4.0, "marvell": 12.0}.get(method, 0.0) * grad_elements

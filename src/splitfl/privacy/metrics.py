"""How well an attack did: reconstruction quality (MSE, PSNR, SSIM) and label-inference AUC.

* ``PSNR = 10·log10(L² / MSE)`` with ``L`` the data range (the true inputs' max − min unless
  given), the figure UnSplit (Erdogan et al., WPES 2022) and the FORA/PCAT line report.
* SSIM is Wang et al., "Image quality assessment: from error visibility to structural
  similarity", IEEE TIP 2004, Eq. (13): an 11×11 Gaussian window (σ = 1.5), ``K1 = 0.01``,
  ``K2 = 0.03``, ``C_i = (K_i·L)²``, the mean of the SSIM map over valid window positions of
  each channel (no padding), averaged over channels and images; images smaller than the
  window use a window the size of their shorter side (odd). Eq. (13)'s luminance term
  ``(2μₓμᵧ + C₁)/(μₓ² + μᵧ² + C₁)`` assumes non-negative intensities: on signed inputs
  (data normalised to [−1, 1]) it scores an inverted image ``−x`` close to 1 (0.96 on a
  test image). Both images are therefore shifted by the true inputs' minimum when it is
  negative (a shift of both leaves MSE, PSNR and the contrast/structure terms unchanged;
  splitfl's choice, as image libraries take intensities in ``[0, L]``).
* AUC is the area under the ROC curve as the Mann–Whitney statistic: the probability that a
  positive sample scores above a negative one, ties counting one half (Li et al., "Label
  Leakage and Protection in Two-party Split Learning", ICLR 2022, §3: leak AUC).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

SSIM_WINDOW = 11
SSIM_SIGMA = 1.5
SSIM_K1, SSIM_K2 = 0.01, 0.03


def data_range(x: torch.Tensor) -> float:
    """``L``: the span of the true inputs (1 where they are constant)."""
    span = float(x.max() - x.min())
    return span if span > 0 else 1.0


def mse(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """Mean squared error over every element."""
    return float(((x.double() - x_hat.double()) ** 2).mean())


def psnr(x: torch.Tensor, x_hat: torch.Tensor, value_range: float | None = None) -> float:
    """``10·log10(L²/MSE)`` in dB (``inf`` for an exact reconstruction)."""
    error = mse(x, x_hat)
    span = data_range(x) if value_range is None else value_range
    return math.inf if error == 0 else 10.0 * math.log10(span**2 / error)


def _gaussian_window(size: int, sigma: float) -> torch.Tensor:
    coords = torch.arange(size, dtype=torch.float64) - (size - 1) / 2
    g = torch.exp(-(coords**2) / (2 * sigma**2))
    g = g / g.sum()
    return torch.outer(g, g)


def ssim(x: torch.Tensor, x_hat: torch.Tensor, value_range: float | None = None) -> float:
    """Mean SSIM (Wang et al. 2004, Eq. 13) of images ``[B, C, H, W]`` (or ``[C, H, W]``)."""
    if x.shape != x_hat.shape:
        raise ValueError(f"shapes differ: {tuple(x.shape)} vs {tuple(x_hat.shape)}")
    if x.dim() == 3:
        x, x_hat = x.unsqueeze(0), x_hat.unsqueeze(0)
    if x.dim() != 4:
        raise ValueError(f"SSIM needs images [B, C, H, W] (got shape {tuple(x.shape)})")
    span = data_range(x) if value_range is None else value_range
    size = min(SSIM_WINDOW, x.shape[-2], x.shape[-1])
    size -= 1 - size % 2  # odd
    window = _gaussian_window(size, SSIM_SIGMA)[None, None]
    b, c, h, w = x.shape
    shift = min(float(x.min()), 0.0)  # signed inputs into [0, L]: see the module docstring
    a = x.double().reshape(b * c, 1, h, w) - shift
    e = x_hat.double().reshape(b * c, 1, h, w) - shift

    def local(t: torch.Tensor) -> torch.Tensor:
        return F.conv2d(t, window)

    mu_a, mu_e = local(a), local(e)
    var_a = local(a * a) - mu_a**2
    var_e = local(e * e) - mu_e**2
    cov = local(a * e) - mu_a * mu_e
    c1, c2 = (SSIM_K1 * span) ** 2, (SSIM_K2 * span) ** 2
    ssim_map = ((2 * mu_a * mu_e + c1) * (2 * cov + c2)) / (
        (mu_a**2 + mu_e**2 + c1) * (var_a + var_e + c2)
    )
    return float(ssim_map.mean())


def reconstruction_scores(x: torch.Tensor, x_hat: torch.Tensor) -> dict[str, float]:
    """``{"mse", "psnr", "ssim"}`` of a reconstruction against the true inputs (SSIM only for
    image batches ``[B, C, H, W]``; NaN otherwise)."""
    return {
        "mse": mse(x, x_hat),
        "psnr": psnr(x, x_hat),
        "ssim": ssim(x, x_hat) if x.dim() == 4 else math.nan,
    }


def roc_auc(scores: torch.Tensor, positive: torch.Tensor) -> float:
    """Area under the ROC curve of ``scores`` for the boolean labels ``positive``: the
    Mann–Whitney ``U / (n₊·n₋)`` from mid-ranks (ties count one half)."""
    s = torch.as_tensor(scores, dtype=torch.float64).reshape(-1)
    pos = torch.as_tensor(positive, dtype=torch.bool).reshape(-1)
    if s.numel() != pos.numel():
        raise ValueError(f"{s.numel()} scores but {pos.numel()} labels")
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both positive and negative samples")
    order = torch.argsort(s, stable=True)
    ranks = torch.empty_like(s)
    sorted_s = s[order]
    i = 0
    while i < len(sorted_s):  # mid-ranks of tied runs (1-based)
        j = i
        while j + 1 < len(sorted_s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    u = float(ranks[pos].sum()) - n_pos * (n_pos + 1) / 2
    return u / (n_pos * n_neg)

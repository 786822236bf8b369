"""Label inference from cut-layer gradients, where the labels stay on the device.

In U-shaped split learning (:mod:`splitfl.topologies.ushaped`) the device holds the head and
the labels; the server receives, for each sample ``i`` of a batch, the gradient
``g_i = ∂L/∂h_i`` of the head's loss with respect to the middle's output ``h_i`` it sent.
Li et al., "Label Leakage and Protection in Two-party Split Learning" (ICLR 2022, §3.1–3.2)
score each sample from ``g_i`` alone:

* **norm scoring** (§3.1): ``s_i = ‖g_i‖₂``. For binary cross-entropy ``g_i = (p_i − y_i)·
  ∂z_i/∂h_i``; on an imbalanced task the model is less confident on the rare positive
  class, so positives carry larger gradients.
* **direction scoring** (§3.2): ``s_i = cos(g_i, g_r)`` for a reference sample ``r`` whose
  label the server knows (one positive): same-class gradients point the same way,
  opposite-class gradients the other way (the sign of ``p_i − y_i``).

The attack's quality is the leak AUC (:func:`~splitfl.privacy.metrics.roc_auc`) of the scores
against the true "is positive" labels; a random guess scores 0.5.
"""

from __future__ import annotations

import torch

from splitfl.privacy.metrics import roc_auc


def _rows(grads: torch.Tensor) -> torch.Tensor:
    """Per-sample gradients ``[B, ...]`` as rows ``[B, d]`` in float64."""
    if grads.dim() < 1 or grads.shape[0] == 0:
        raise ValueError("gradients must be a non-empty batch [B, ...]")
    return grads.detach().double().reshape(grads.shape[0], -1)


def norm_scores(grads: torch.Tensor) -> torch.Tensor:
    """Li et al. §3.1: ``‖g_i‖₂`` per sample."""
    return _rows(grads).norm(dim=1)


def direction_scores(grads: torch.Tensor, reference: int) -> torch.Tensor:
    """Li et al. §3.2: ``cos(g_i, g_reference)`` per sample (0 where a norm is 0)."""
    rows = _rows(grads)
    if not 0 <= reference < len(rows):
        raise ValueError(f"reference {reference} is not a sample of the batch of {len(rows)}")
    ref = rows[reference]
    norms = rows.norm(dim=1) * ref.norm()
    dots = rows @ ref
    return torch.where(norms > 0, dots / norms.clamp_min(1e-300), torch.zeros_like(dots))


def label_leak_auc(
    grads: torch.Tensor, labels: torch.Tensor, positive: int = 1, method: str = "norm"
) -> float:
    """The leak AUC of ``method`` (``norm`` or ``direction``) for "label == positive"; the
    direction reference is the first positive sample (the one label the server knows)."""
    is_pos = torch.as_tensor(labels).reshape(-1) == positive
    if method == "norm":
        scores = norm_scores(grads)
    elif method == "direction":
        if not bool(is_pos.any()):
            raise ValueError("direction scoring needs one positive sample as its reference")
        scores = direction_scores(grads, int(torch.nonzero(is_pos)[0]))
    else:
        raise ValueError(f"method must be norm or direction (got {method!r})")
    return roc_auc(scores, is_pos)

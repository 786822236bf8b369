"""Training losses (``train.loss``): one implementation used by every executor path.

Each loss maps model outputs ``[N, C]`` and targets to per-sample losses ``[N]``
(``reduction="none"``), their ``sum`` or their ``mean``; ``mean`` equals torch's own mean
reduction (``F.cross_entropy``, ``F.mse_loss``, ``F.binary_cross_entropy_with_logits``):

* ``cross_entropy`` — single-label classification; targets are int64 class labels ``[N]``.
* ``mse`` — regression; float targets ``[N]`` (one output) or ``[N, C]``. A sample's loss is
  the mean squared error over its C outputs.
* ``bce_logits`` — multi-label classification; float multi-hot targets ``[N, C]`` in [0, 1].
  A sample's loss is the mean over its C labels of the binary cross-entropy with logits.

* ``causal_lm`` — next-token language modelling; outputs ``[N, T, V]``, targets the int64
  token ids ``[N, T]`` with ``IGNORE`` (-100) where there is no token (padding). A sample's
  loss is the mean over its real next tokens of the cross-entropy of position t's logits
  against token t+1 (Hugging Face's causal-LM loss, per sample).

The papers train classifiers with cross-entropy only; the others let a regression, a
multi-label or a language-modelling task run through the same split/federated machinery.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

#: ``train.loss`` values; the first is the default.
LOSSES = ("cross_entropy", "mse", "bce_logits", "causal_lm")
#: Losses whose targets are float values (``data.targets: values`` by default).
FLOAT_TARGET_LOSSES = ("mse", "bce_logits")
#: The target of a padding position (``causal_lm``): no loss there (torch's ignore_index).
IGNORE = -100
#: ``reduction`` values of :func:`loss_fn`'s losses.
REDUCTIONS = ("none", "sum", "mean")

LossFn = Callable[..., torch.Tensor]


def _as_targets(out: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Float targets in ``out``'s dtype, ``out`` shaped like them (``[N, 1]`` outputs for
    ``[N]`` targets); per-sample elements flattened to ``[N, C]``."""
    y = y.to(out.dtype)
    if out.shape != y.shape and out.numel() == y.numel():
        out = out.reshape(y.shape)
    if out.shape != y.shape:  # never broadcast one target over several outputs
        raise ValueError(f"targets of shape {list(y.shape)} for outputs {list(out.shape)}")
    return out.reshape(len(out), -1), y.reshape(len(y), -1)


def _cross_entropy(out: torch.Tensor, y: torch.Tensor, reduction: str = "none") -> torch.Tensor:
    return F.cross_entropy(out, y, reduction=reduction)


def _mse(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out, y = _as_targets(out, y)
    return F.mse_loss(out, y, reduction="none").mean(1)


def _bce_logits(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    out, y = _as_targets(out, y)
    return F.binary_cross_entropy_with_logits(out, y, reduction="none").mean(1)


def _causal_lm(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per sample: the mean next-token cross-entropy over its real tokens (module docstring)."""
    logits, targets = out[:, :-1], y[:, 1:]
    tokens = F.cross_entropy(
        logits.reshape(-1, logits.shape[-1]),
        targets.reshape(-1),
        reduction="none",
        ignore_index=IGNORE,
    ).reshape(targets.shape)
    real = (targets != IGNORE).to(tokens.dtype)
    return (tokens * real).sum(1) / real.sum(1).clamp(min=1)


_PER_SAMPLE = {
    "cross_entropy": _cross_entropy,
    "mse": _mse,
    "bce_logits": _bce_logits,
    "causal_lm": _causal_lm,
}


def loss_fn(name: str) -> LossFn:
    """``train.loss`` ``name`` as ``f(out, y, reduction="mean")``: per-sample losses
    (``none``, shape ``[N]``), their ``sum`` or their ``mean``."""
    if name not in _PER_SAMPLE:
        raise ValueError(f"unknown loss {name!r}; allowed: {', '.join(LOSSES)}")
    per_sample = _PER_SAMPLE[name]

    def loss(out: torch.Tensor, y: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        if per_sample is _cross_entropy and reduction in ("sum", "mean"):
            return _cross_entropy(out, y, reduction)
        values = per_sample(out, y)
        if reduction == "none":
            return values
        if reduction == "sum":
            return values.sum()
        if reduction == "mean":
            return values.mean()
        raise ValueError(f"reduction must be one of {', '.join(REDUCTIONS)} (got {reduction!r})")

    return loss


def target_problem(name: str, y: torch.Tensor, outputs: int) -> str | None:
    """Why targets ``y`` (one split's) do not fit loss ``name`` on a model with ``outputs``
    outputs, or None: class labels int64 ``[N]`` below ``outputs`` (``cross_entropy``);
    float targets with ``outputs`` values per sample (``mse``); float multi-hot ``[N, outputs]``
    in [0, 1] (``bce_logits``); token ids ``[N, T]`` below the vocabulary (``causal_lm``)."""
    shape = list(y.shape)
    if name == "causal_lm":
        if y.is_floating_point() or y.dim() != 2:
            return f"needs int64 token ids [N, T], got {y.dtype} {shape}"
        real = y[y != IGNORE]
        top = int(real.max()) if real.numel() else -1
        return None if top < outputs else f"token ids reach {top} but the vocabulary is {outputs}"
    if name == "cross_entropy":
        if y.is_floating_point() or y.dim() != 1:
            return f"needs int64 class labels [N], got {y.dtype} {shape}"
        top = int(y.max())
        return None if top < outputs else f"labels reach {top} but the model has {outputs} outputs"
    if not y.is_floating_point():
        return f"needs float targets, got {y.dtype} {shape} (class labels: use cross_entropy)"
    per_sample = y[0].numel() if len(y) else 0
    if per_sample != outputs:
        return f"targets hold {per_sample} values per sample but the model has {outputs} outputs"
    if name == "bce_logits" and bool(((y < 0) | (y > 1)).any()):
        return "needs multi-hot targets in [0, 1]"
    return None

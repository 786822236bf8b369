"""Evaluation metrics (``eval.metrics``) on a model's test outputs.

* ``accuracy`` — fraction of samples whose top logit is the label (``cross_entropy``).
* ``top<k>`` (``top5``, ``top3``, …) — fraction whose label is among the k top logits (k above
  the number of classes counts every label as hit) (``cross_entropy``).
* ``macro_f1`` — the unweighted mean over classes of F1 = 2·TP / (2·TP + FP + FN); predictions
  are the top logit (``cross_entropy``) or every logit > 0 (``bce_logits``, multi-label).
  Classes absent from both targets and predictions are left out of the mean (as
  scikit-learn's single-label macro-F1, which averages over the labels present); none left: 0.
* ``mse`` — mean squared error over all outputs (``mse``).
* ``perplexity`` — exp of the mean test loss of ``causal_lm`` (each sample's mean next-token
  loss, averaged over samples: the corpus perplexity when every sample has as many tokens).
* ``loss`` — the mean test loss (``train.loss``); always recorded (``test_loss``), so
  ``[loss]`` alone records no other metric.

A metrics row holds each under :func:`row_key` (``test_acc`` for accuracy, ``test_loss``,
else ``test_<name>``); a value that is not finite (a diverged model) is recorded as null.
"""

from __future__ import annotations

import re

import torch

from splitfl.training.losses import loss_fn

#: ``eval.metrics`` names, ``top<k>`` standing for ``top1``, ``top2``, …; the default is
#: ``[accuracy]``.
METRICS = ("accuracy", "loss", "top<k>", "macro_f1", "mse", "perplexity")
#: The losses each metric is defined for (None: every loss).
_NEEDS: dict[str, tuple[str, ...] | None] = {
    "accuracy": ("cross_entropy",),
    "top": ("cross_entropy",),
    "macro_f1": ("cross_entropy", "bce_logits"),
    "mse": ("mse",),
    "perplexity": ("causal_lm",),
    "loss": None,
}
_TOP = re.compile(r"top([1-9][0-9]*)")


def _kind(name: str) -> str | None:
    if _TOP.fullmatch(name):
        return "top"
    return name if name in _NEEDS else None


def metric_problem(name: str, loss: str) -> str | None:
    """Why ``eval.metrics`` entry ``name`` cannot be used with ``train.loss`` ``loss``, or None."""
    kind = _kind(name)
    if kind is None:
        return f"unknown {name!r}; allowed: {', '.join(METRICS)}"
    needs = _NEEDS[kind]
    if needs is not None and loss not in needs:
        return f"{name} needs train.loss: {' or '.join(needs)} (got {loss}); use loss or mse"
    return None


def row_key(name: str) -> str:
    """The metrics-row key of metric ``name``: ``test_acc``, ``test_loss``, ``test_<name>``."""
    return {"accuracy": "test_acc", "loss": "test_loss"}.get(name, f"test_{name}")


def top_k(out: torch.Tensor, y: torch.Tensor, k: int) -> float:
    """Fraction of samples whose label is among the ``k`` largest logits."""
    k = min(k, out.shape[1])
    hits = (out.topk(k, dim=1).indices == y.unsqueeze(1)).any(1)
    return float(hits.double().mean())


def macro_f1(out: torch.Tensor, y: torch.Tensor) -> float:
    """Macro-averaged F1 over the classes present in targets or predictions: single-label
    (``y`` int ``[N]``, prediction = top logit) or multi-label (``y`` multi-hot ``[N, C]``,
    prediction = logit > 0)."""
    classes = out.shape[1]
    if y.is_floating_point():
        pred, true = out.reshape(len(out), -1) > 0, y.reshape(len(y), -1) > 0.5
    else:
        eye = torch.eye(classes, dtype=torch.bool)
        pred, true = eye[out.argmax(1)], eye[y]
    tp = (pred & true).sum(0).double()
    fp = (pred & ~true).sum(0).double()
    fn = (~pred & true).sum(0).double()
    denom = 2 * tp + fp + fn
    present = denom > 0
    if not bool(present.any()):
        return 0.0
    return float((2 * tp[present] / denom[present]).mean())


def mse(out: torch.Tensor, y: torch.Tensor) -> float:
    """Mean squared error over every output of every sample."""
    y = y.to(out.dtype).reshape(len(y), -1)
    return float(((out.reshape(len(out), -1) - y) ** 2).mean())


def score(name: str, out: torch.Tensor, y: torch.Tensor) -> float:
    """Metric ``name`` (not ``loss``) of outputs ``out`` ``[N, C]`` against targets ``y``."""
    if name == "accuracy":
        return float((out.argmax(1) == y).double().mean())
    if _TOP.fullmatch(name):
        return top_k(out, y, int(name[3:]))
    if name == "macro_f1":
        return macro_f1(out, y)
    if name == "mse":
        return mse(out, y)
    if name == "perplexity":
        return float(torch.exp(loss_fn("causal_lm")(out, y).double()))
    raise ValueError(f"unknown metric {name!r}; allowed: {', '.join(METRICS)}")

"""What a RingSFL member accepts from its neighbours beyond shape, dtype and finite values:
magnitudes relative to what its own samples produce (``network.bounds``, the smashed-data
bounds of :mod:`splitfl.net.trust.checks` applied at every ring hop). A hop that breaks them ends
the member's round naming the neighbour that sent it (the server's drop reasons then name the
member that misbehaved, not the honest one that saw it)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch

from splitfl.config import BoundsConfig
from splitfl.core.activations import leaves
from splitfl.net.trust.checks import rms

#: Own samples the ring's reference scales are measured on.
REFERENCE_SAMPLES = 64


@dataclass(frozen=True)
class HopScale:
    """At the input of one block (index ``k``; ``k = n``: the logits): each tensor's largest
    absolute value, and the RMS of the loss gradient with respect to it."""

    peaks: tuple[float, ...]
    grad_rms: tuple[float, ...]


def hop_scales(model, x: torch.Tensor, y: torch.Tensor, criterion) -> list[HopScale]:
    """:class:`HopScale` at every block input and the logits, on ``x``/``y`` (the member's own
    samples) as training computes them: train mode, on a copy, random state restored."""
    probe = copy.deepcopy(model).train()
    dtype = next(probe.parameters()).dtype
    h = x.to(dtype) if x.is_floating_point() else x
    seen = []
    with torch.random.fork_rng():
        for k in range(probe.num_blocks):
            h = probe(h, k, k + 1)
            for t in leaves(h):
                if t.is_floating_point() and t.requires_grad:
                    t.retain_grad()
            seen.append(h)
        criterion(leaves(h)[0], y).backward()
    inputs = [[x], *(leaves(s) for s in seen)]
    return [_scale(ts) for ts in inputs]


def _scale(tensors) -> HopScale:
    peaks, grads = [], []
    for t in tensors:
        floating = t.is_floating_point() and t.numel()
        peaks.append(float(t.detach().abs().max()) if floating else 0.0)
        grads.append(rms(t.grad) if floating and t.grad is not None else 0.0)
    return HopScale(tuple(peaks), tuple(grads))


def activation_problem(t: torch.Tensor, scale: HopScale, i: int, b: BoundsConfig) -> str | None:
    """Tensor ``i`` of an activation hop whose peak is above ``activation_factor`` × the
    member's own peak there + ``activation_abs``, or None. (The tighter RMS bound of the
    server's checks is not applied: the ring's model moves every step, and on the test
    models honest hops reached 7 × the RMS measured at the round's start.)"""
    if not t.is_floating_point() or not t.numel():
        return None
    peak = float(t.abs().max())
    top = b.activation_factor * scale.peaks[i] + b.activation_abs
    if peak > top:
        return f"activation {peak:.3g} above {top:.3g} (network.bounds.activation_factor x own)"
    return None


def gradient_problem(t: torch.Tensor, scale: HopScale, i: int, b: BoundsConfig) -> str | None:
    """Tensor ``i`` of a gradient hop whose RMS is above ``activation_factor`` × the RMS of
    the member's own loss gradient there (+ 1e-6), or None."""
    value, ref = rms(t), scale.grad_rms[i]
    top = b.activation_factor * ref + 1e-6
    if not math.isfinite(value) or value > top:
        return f"gradient RMS {value:.3g} above {top:.3g} (network.bounds.activation_factor x own)"
    return None

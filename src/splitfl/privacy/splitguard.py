"""SplitGuard: a split-learning client's detection of a training-hijacking server.

Erdogan, Küpçü, Çiçek, "SplitGuard: Detecting and Mitigating Training-Hijacking Attacks in
Split Learning", WPES 2022 (arXiv 2108.09052); authors' code ``ege-erdogan/splitguard``,
``label-changing/splitguard.ipynb`` (``sg_score`` and its main loop). After ``start``
batches the client sends, with probability ``p_fake``, a *fake* batch: the same smashed data
with every label changed (``(y + s) mod C``, ``s`` uniform in ``1..C−1``), and does not step
on the gradient that comes back. It keeps the gradient of its first trainable parameter on
fake batches (``F``) and on regular batches, the latter split at random into ``R₁``, ``R₂``.
A server that trains the task sends fake-batch gradients far from the regular ones; a server
that ignores the labels (FSHA's discriminator loss) sends alike gradients. The score (the
notebook's ``sg_score``), with means ``m̄`` of the vectors and mean norms ``|·|`` of each set,
``R = (R₁ + R₂)/2`` for both::

    x = θ(F, R)·||F|−|R||/Δ − θ(R₁, R₂)·||R₁|−|R₂||/Δ,   Δ = ||F|−|R|| + ||R₁|−|R₂||
    SG = sigmoid(mult·x)^exp        (θ: the angle of the mean vectors, in radians)

with the notebook's ``mult = 5``, ``exp = 2``: near 1 for an honest server, near 0 for a
hijacking one. Where this differs from the notebook: the label shift ``s`` is drawn from
``1..C−1`` (the notebook's ``random.randint(1, 8)`` for 10 classes never draws 9), every label
of a fake batch is changed (the notebook's ``b_fake = 64``, its batch size), the random
draws come from a seeded generator, and the means are running sums (the same values, O(1)
per batch).
"""

from __future__ import annotations

import math

import numpy as np
import torch

#: The notebook's squashing parameters (``mult = 5``, ``exp = 2``) and schedule
#: (``p_fake = 0.1``, ``N = 20``).
SG_MULT, SG_EXP, SG_P_FAKE, SG_START = 5.0, 2.0, 0.1, 20


def angle(u: torch.Tensor, v: torch.Tensor) -> float:
    """The angle between two vectors in radians (``arccos`` of their cosine, clamped to
    [−1, 1] against rounding; π/2 where one is zero)."""
    nu, nv = float(u.norm()), float(v.norm())
    if nu == 0.0 or nv == 0.0:
        return math.pi / 2
    return math.acos(max(-1.0, min(1.0, float(u @ v) / (nu * nv))))


def fake_labels(labels: torch.Tensor, num_classes: int, gen: np.random.Generator) -> torch.Tensor:
    """Every label changed: ``(y + s) mod C`` with one shift ``s`` uniform in ``1..C−1`` for the
    batch (the notebook's ``(labels + random.randint(1, 8)) % 10``)."""
    if num_classes < 2:
        raise ValueError(f"fake labels need at least 2 classes (got {num_classes})")
    shift = int(gen.integers(1, num_classes))
    return (labels + shift) % num_classes


class _Set:
    """A running sum of vectors and of their norms (the notebook's means of a list)."""

    def __init__(self) -> None:
        self.total: torch.Tensor | None = None
        self.norms, self.count = 0.0, 0

    def add(self, v: torch.Tensor) -> None:
        v = v.detach().double().reshape(-1)
        self.total = v.clone() if self.total is None else self.total + v
        self.norms += float(v.norm())
        self.count += 1

    def mean(self) -> torch.Tensor:
        return self.total / self.count

    def mean_norm(self) -> float:
        return self.norms / self.count


def raw_score(fakes: _Set, first: _Set, second: _Set) -> float:
    """The notebook's ``sg_score(..., raw=True)``: ``x`` of the module docstring (0 where both
    norm gaps vanish)."""
    regular = (first.mean() + second.mean()) / 2
    regular_norm = (first.mean_norm() + second.mean_norm()) / 2
    gap_fake = abs(fakes.mean_norm() - regular_norm)
    gap_regular = abs(first.mean_norm() - second.mean_norm())
    div = gap_fake + gap_regular
    if div == 0.0:
        return 0.0
    return (
        angle(fakes.mean(), regular) * gap_fake / div
        - angle(first.mean(), second.mean()) * gap_regular / div
    )


def squash(x: float, mult: float = SG_MULT, exp: float = SG_EXP) -> float:
    """``sigmoid(mult·x)^exp`` (the notebook's ``sigmoid(x, shift=0, mult, exp)``)."""
    return (1.0 / (1.0 + math.exp(-max(-700.0, min(700.0, mult * x))))) ** exp


class SplitGuard:
    """The client's detector over one training run: :meth:`fake_now` decides each batch,
    :meth:`record` files its gradient; ``scores`` holds the SG score after each fake batch
    (from the first fake batch that finds both regular sets non-empty)."""

    def __init__(
        self,
        seed: int,
        p_fake: float = SG_P_FAKE,
        start: int = SG_START,
        mult: float = SG_MULT,
        exp: float = SG_EXP,
    ):
        self.gen = np.random.default_rng(seed)
        self.p_fake, self.start, self.mult, self.exp = p_fake, start, mult, exp
        self.fakes, self.first, self.second = _Set(), _Set(), _Set()
        self.scores: list[float] = []

    def fake_now(self, index: int) -> bool:
        """Whether batch ``index`` is sent as a fake (the notebook's ``index > N and
        random.random() <= p_fake``; no draw before ``start``)."""
        return index > self.start and float(self.gen.random()) <= self.p_fake

    def record(self, index: int, grad: torch.Tensor, fake: bool) -> None:
        """File the first parameter's gradient of batch ``index`` and score after a fake."""
        if fake:
            self.fakes.add(grad)
            if self.first.count and self.second.count:
                x = raw_score(self.fakes, self.first, self.second)
                self.scores.append(squash(x, self.mult, self.exp))
        elif index > self.start:
            (self.first if float(self.gen.random()) <= 0.5 else self.second).add(grad)

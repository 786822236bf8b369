"""Updates held against the round's centre: the per-step moves of a round's clients and the
spread check (``network.bounds.peer_spread_factor``).

The norm check (:func:`~splitfl.net.trust.checks.peer_outliers`) compares how *far* each update
moved; a part sign-flipped by colluders in round 1, when honest updates from a fresh model
are large, moved only ~6× the median and passes it (the attack benchmark's two colluders of
ten). What gives it away is its *direction*: honest updates of a round agree with each other
(from the same model, on the same task), a flipped one points elsewhere. So each update's
move per local step, ``Δ_c = (part_c − sent_c) / steps_c``, is held against the round's
coordinate-wise median move ``m`` (the centre colluders cannot pull while they are fewer
than half the round), by its distance ``s_c = ‖Δ_c − m‖`` against the median ``s̃`` of those
distances:

    rejected  ⇔  s_c > peer_spread_factor × s̃ + ñ,

``ñ`` the median ‖Δ‖ (a round whose honest updates nearly coincide, ``s̃ ≈ 0``, still leaves
each one a typical update of room). Robust centres and distances from them are the
Byzantine-robust literature's tool (coordinate-wise median: Yin et al. ICML 2018; distance
from a robust centre: Karimireddy et al., "Learning from History for Byzantine Robust
Optimization", ICML 2021); the rule and its factor are splitfl's choice (README, "Hostile
devices"). Measured on the attack benchmark (two colluders of ten): honest ``s_c`` within
1.7 × ``s̃`` in round 1 and 3.3 × over 6 rounds, the colluders' 17–26 × in round 1.
"""

from __future__ import annotations

import collections
import math
import statistics
from collections.abc import Callable

import torch

from splitfl.net.trust.checks import PeerHistory, State, update_distance


class RoundMoves:
    """Each accepted update's move per local step: its length (``distance``, the norm check's)
    and the move itself (``delta``, the spread check's), by client (or cluster)."""

    def __init__(self) -> None:
        self.distance: dict[int, float] = {}
        self.delta: dict[int, State] = {}

    def add(self, key: int, part: State, sent: State, steps: int) -> None:
        """Record ``part`` (floating tensors) against ``sent`` after ``steps`` local steps."""
        delta = {
            k: (t - sent[k]).to(torch.float32) / max(steps, 1)
            for k, t in part.items()
            if t.is_floating_point()
        }
        self.delta[key] = delta
        self.distance[key] = update_distance(part, sent) / max(steps, 1)

    def spread_outliers(self, factor: float, what: str = "model update") -> dict[int, str]:
        """The keys whose move lies more than ``factor`` × the median distance + the median
        length from the coordinate-wise median move (module docstring), with their reasons;
        checked among the keys that sent the same tensors, 3 or more of them."""
        found: dict[int, str] = {}
        for keys in _same_tensors(self.delta).values():
            if len(keys) < 3:
                continue
            spread = spread_from_centre([self.delta[k] for k in keys])
            typical = statistics.median(spread)
            norm = statistics.median(self.distance[k] for k in keys)
            room = factor * typical + norm
            found |= {
                k: (
                    f"rejected {what}: {s:.3g} per step from the round's median move, above "
                    f"{room:.3g} (network.bounds.peer_spread_factor {factor:g} x the median "
                    f"distance {typical:.3g} + the median norm {norm:.3g})"
                )
                for k, s in zip(keys, spread, strict=True)
                if s > room
            }
        return found

    def outliers(
        self,
        history: PeerHistory,
        spread_factor: float,
        what: str = "model update",
        reference: Callable[[], float] | None = None,
    ) -> dict[int, str]:
        """Both peer checks, as every checking place runs them: the spread
        (:meth:`spread_outliers`), then the norm (``history``,
        :class:`~splitfl.net.trust.checks.PeerHistory`, which does not record what the spread
        rejected); where both reject, the norm's reason."""
        spread = self.spread_outliers(spread_factor, what)
        return spread | history.outliers(self.distance, what, reference, spread)


def spread_from_centre(deltas: list[State]) -> list[float]:
    """Each move's L2 distance from the coordinate-wise median of ``deltas`` (the lower
    median for an even count, as ``torch.median``), in order."""
    squares = [0.0] * len(deltas)
    for name in deltas[0]:
        stack = torch.stack([d[name] for d in deltas])
        centre = stack.median(dim=0).values
        per_key = (stack - centre).reshape(len(deltas), -1).double().pow(2).sum(1)
        squares = [s + v for s, v in zip(squares, per_key.tolist(), strict=True)]
    return [math.sqrt(s) for s in squares]


def _same_tensors(deltas: dict[int, State]) -> dict[tuple, list[int]]:
    """Keys grouped by the tensors (names and shapes) they sent, in key order."""
    groups: dict[tuple, list[int]] = collections.defaultdict(list)
    for key in sorted(deltas):
        groups[tuple((k, tuple(t.shape)) for k, t in sorted(deltas[key].items()))].append(key)
    return groups

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
Optimization", ICML 2021); the rule and its factor are splitfl's choice
(docs/explanation/trust-model.md, "Hostile devices"). Measured on the attack benchmark (two
colluders of ten): honest ``s_c`` within 1.7 × ``s̃`` in round 1 and 3.3 × over 6 rounds, the
colluders' 17–26 × in round 1.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable

import torch

from splitfl.net.trust.checks import PeerHistory, State, update_distance
from splitfl.net.trust.direction import Toward, direction_outliers, median_move, same_tensors


class RoundMoves:
    """Each accepted update's move per local step: its length (``distance``, the norm check's)
    and the move itself (``delta``, the spread check's), by client (or cluster)."""

    def __init__(self) -> None:
        self.distance: dict[int, float] = {}
        self.delta: dict[int, State] = {}
        #: the norm of the part each update was sent (the norm check's floor)
        self.scale: dict[int, float] = {}

    def add(self, key: int, part: State, sent: State, steps: int) -> None:
        """Record ``part`` (floating tensors) against ``sent`` after ``steps`` local steps."""
        delta = {
            k: (t - sent[k]).to(torch.float32) / max(steps, 1)
            for k, t in part.items()
            if t.is_floating_point()
        }
        self.delta[key] = delta
        self.distance[key] = update_distance(part, sent) / max(steps, 1)
        floats = {k: sent[k] for k, t in part.items() if t.is_floating_point()}
        self.scale[key] = update_distance(
            floats, {k: torch.zeros_like(t) for k, t in floats.items()}
        )

    def spread_outliers(
        self, factor: float, what: str = "model update", floor: float = 0.0
    ) -> dict[int, str]:
        """The keys whose move lies more than ``factor`` × the median distance + the median
        length (at least ``floor`` × the median norm of the parts sent:
        ``network.bounds.peer_update_floor``) from the coordinate-wise median move (module
        docstring), with their reasons; checked among the keys that sent the same tensors, 3
        or more of them."""
        found: dict[int, str] = {}
        for keys in same_tensors(self.delta).values():
            if len(keys) < 3:
                continue
            spread = spread_from_centre([self.delta[k] for k in keys])
            typical = statistics.median(spread)
            norm = statistics.median(self.distance[k] for k in keys)
            norm = max(norm, floor * statistics.median(self.scale[k] for k in keys))
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
        reference: Callable[[Iterable[str]], float] | None = None,
        toward: Toward | None = None,
        min_cosine: float | None = None,
        floor: float = 0.0,
        small_round_min_cosine: float | None = None,
    ) -> dict[int, str]:
        """The peer checks, as every checking place runs them: the spread
        (:meth:`spread_outliers`), the direction (with ``min_cosine``; ``toward``: the server's
        own step, :func:`~splitfl.net.trust.direction.direction_outliers`), then the norm
        (``history``, :class:`~splitfl.net.trust.checks.PeerHistory`, which does not record
        what the others rejected; ``reference``: the server's own step per local step over
        some tensors); where several reject, the last one's reason. Each check compares like
        with like: updates of the same tensors (S²FL's clients train different cuts, whose
        parts' norms differ in kind: issue 51, an honest client dropped at 13.4× a median of
        other cuts' parts). The norm check's median is at least ``floor`` × the median norm of
        the parts sent (``network.bounds.peer_update_floor``); ``small_round_min_cosine``:
        the direction check's bound where fewer than 3 updates of the same tensors leave the
        server's step as the only yardstick (star rounds of one or two clients)."""
        found = self.spread_outliers(spread_factor, what, floor)
        if min_cosine is not None:  # the direction check is on (network.trust: untrusted)
            found |= direction_outliers(
                self.delta, toward, min_cosine, what, small_round_min_cosine
            )
        norm: dict[int, str] = {}
        for keys in same_tensors(self.delta).values():
            names = list(self.delta[keys[0]])
            own = None if reference is None else (lambda names=names: reference(names))
            group = {k: self.distance[k] for k in keys}
            least = floor * statistics.median(self.scale[k] for k in keys)
            kind = tuple(sorted(names))
            norm |= history.outliers(group, what, own, found, kind=kind, floor=least)
        return found | norm


def spread_from_centre(deltas: list[State]) -> list[float]:
    """Each move's L2 distance from the coordinate-wise median of ``deltas``
    (:func:`~splitfl.net.trust.direction.median_move`), in order."""
    centre = median_move(deltas)
    squares = [0.0] * len(deltas)
    for name, mid in centre.items():
        stack = torch.stack([d[name] for d in deltas])
        per_key = (stack - mid).reshape(len(deltas), -1).double().pow(2).sum(1)
        squares = [s + v for s, v in zip(squares, per_key.tolist(), strict=True)]
    return [math.sqrt(s) for s in squares]

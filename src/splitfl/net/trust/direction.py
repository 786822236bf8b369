"""Updates held against the direction of the round (``network.trust: untrusted``,
``network.bounds.min_cosine``).

Magnitude rules (:mod:`~splitfl.net.trust.checks`, :mod:`~splitfl.net.trust.spread`) cannot see
a negated move: colluders sending ``sent − 6 × (their honest move)`` stay inside every
norm bound, and once they are a third of the round the spread's median distance grows with
them (issue 51: 15 of 24 attacker client-rounds caught, accuracy swinging 21–81 %). Their
*direction* gives them away. FLTrust (Cao et al., "FLTrust: Byzantine-robust Federated
Learning via Trust Bootstrapping", NDSS 2021, §IV-B) scores each client update ``g_i`` by its
ReLU-clipped cosine similarity with the server's own update ``g_0`` on its root dataset,

    TS_i = ReLU(cos(g_i, g_0)),

so an update at an obtuse angle to the server's step has weight 0. Here an update's move
(per local step, over its own tensors: S²FL's clients train different cuts, each is compared
with the moves of the same part) is held against the round's direction: among 3 or more moves
of the same tensors their coordinate-wise median move (Yin et al. ICML 2018: the centre
colluders cannot pull while they are fewer than half; the honest members of a RingSFL ring,
whose models are blended, agree with it, where an honest member's cosine with the server's
step was −0.22 on the graph-split ring of the tests); with fewer (a star round of two),
FLTrust's server step,
:class:`~splitfl.net.trust.reference.ServerStep` (the model it sent, trained on its first
``reference_samples`` test samples for the round's local steps). An update whose cosine is
below ``min_cosine`` (0: FLTrust's ReLU) is dropped for the round with the reason (RingSFL
members and ParallelSFL top workers: only with 3 or more, an honest top part's cosine with the
server's step was −0.04 on the graph-split run of the tests); the rest
are aggregated by ``train.aggregation`` as before (an honest round loses nothing). What a
coalition below half the round can then not do: pull the aggregate backward along the
round's direction — each accepted update has a non-negative component along it; the norm
checks (``peer_update_factor``) bound the rest.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable

import torch

from splitfl.net.trust.checks import State

#: The server's step over a set of tensor names (name → move).
Toward = Callable[[Iterable[str]], State]


def cosine(a: State, b: State) -> float | None:
    """Cosine similarity of two moves over the floating tensors they share (float64); None
    when either has zero length there (nothing moved: no direction)."""
    dot = na = nb = 0.0
    for name, t in a.items():
        if name not in b or not t.is_floating_point():
            continue
        x, y = t.double().flatten(), b[name].double().flatten()
        dot += float(x @ y)
        na += float(x @ x)
        nb += float(y @ y)
    if na <= 0 or nb <= 0:
        return None
    return dot / math.sqrt(na * nb)


def direction_outliers(
    moves: dict[int, State],
    toward: Toward | None,
    min_cosine: float,
    what: str = "model update",
    small_round_min_cosine: float | None = None,
) -> dict[int, str]:
    """The keys whose move (``moves``: key → tensor moves) has cosine below ``min_cosine``
    with the round's direction, with the reason to record: among 3 or more moves of the same
    tensors, their coordinate-wise median move (:func:`median_move`; the centre colluders
    cannot pull while they are fewer than half); for fewer, the server's step over the move's
    own tensors (``toward``; None: not checked), held to the larger of ``min_cosine`` and
    ``small_round_min_cosine`` (``network.bounds.small_round_min_cosine``: no robust rule
    separates one liar from one honest client, their direction does; None: ``min_cosine``)."""
    found = {}
    for keys in same_tensors(moves).values():
        centre = median_move([moves[k] for k in keys]) if len(keys) >= 3 else None
        if centre is None and toward is None:
            continue
        bound, field = min_cosine, "min_cosine"
        if centre is None and small_round_min_cosine is not None:
            if small_round_min_cosine > min_cosine:
                bound, field = small_round_min_cosine, "small_round_min_cosine"
        whose = "the round's median move" if centre is not None else "the server's own step"
        for key in keys:
            c = cosine(moves[key], centre if centre is not None else toward(moves[key].keys()))
            if c is not None and c < bound:
                found[key] = (
                    f"rejected {what}: cosine {c:.3g} with {whose}, below {bound:g} "
                    f"(network.bounds.{field}; FLTrust's trust score)"
                )
    return found


def median_move(moves: list[State]) -> State:
    """The coordinate-wise median of ``moves`` (the lower median for an even count, as
    ``torch.median``; Yin et al. ICML 2018)."""
    return {name: torch.stack([m[name] for m in moves]).median(dim=0).values for name in moves[0]}


def same_tensors(moves: dict[int, State]) -> dict[tuple, list[int]]:
    """Keys grouped by the tensors (names and shapes) they sent, in key order (S²FL's cuts:
    compare like with like)."""
    groups: dict[tuple, list[int]] = collections.defaultdict(list)
    for key in sorted(moves):
        groups[tuple((k, tuple(t.shape)) for k, t in sorted(moves[key].items()))].append(key)
    return groups

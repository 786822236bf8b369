"""Verdicts on the papers' time and traffic claims from ``executor: timing`` (issue 50 items
5, 6 and 8), written once for ``timing_report.py`` and ``robustness.py``.

A paper claims "A takes ``paper``× less time (or traffic) than B to the target accuracy".
Without training, splitfl measures the ratio B / A **per round** (equal rounds). Total = rounds
× per round, so the claim needs B to take ``paper / ours`` times A's rounds to reach the
target (:func:`rounds_needed`). The verdict words:

* **per round** — ``holds per round`` where ours ≥ the paper's figure (the claim needs no help
  from the rounds), ``direction only per round`` where 1 < ours < paper, ``fails per round``
  where ours ≤ 1. These judge the per-round cost, never the claim to the target.
* **time per 1,000 samples** is reported and never judged (:data:`JUDGED_METRICS`): no paper
  uses it, and it did not predict the project's own trained result (ParallelSFL README:
  adaptive τ vs WC 0.94× per sample, 1.31× per round, 1.14× sooner to 75.5 % when trained).
* **robustness** — a claim's per-round verdict over each unsourced parameter's plausible
  range: ``holds across the ranges`` / ``fails across the ranges`` where no value changes the
  word, else ``depends on X`` naming each parameter whose range changes it
  (:func:`robust_verdict`); never ``holds`` when any value flips it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

HOLDS, DIRECTION, FAILS = "holds per round", "direction only per round", "fails per round"
#: The metrics a verdict may rest on; time per 1,000 samples is reported, never judged.
JUDGED_METRICS = ("per round", "to target")


def per_round_verdict(ours: float, paper: float, metric: str = "per round") -> str:
    """The verdict word for a claim of ``paper``× (B / A, > 1 = A better) against our ratio
    ``ours`` on ``metric`` (ValueError for a metric no verdict may rest on)."""
    if metric not in JUDGED_METRICS:
        raise ValueError(f"no verdict rests on {metric!r}: judged are {JUDGED_METRICS}")
    if ours >= paper:
        return HOLDS
    return DIRECTION if ours > 1.0 else FAILS


def rounds_needed(ours: float, paper: float) -> float:
    """B's rounds to the target ÷ A's that the paper's ``paper``× needs, given our per-round
    ratio ``ours`` (B / A): totals are rounds × per-round cost."""
    return paper / ours


def saving_claim(saving: float) -> float:
    """A claim "A saves ``saving`` (0.21 = 21 %) of B's traffic" as a ratio B / A ≥ this."""
    if not 0.0 <= saving < 1.0:
        raise ValueError(f"a saving is in [0, 1) (got {saving})")
    return 1.0 / (1.0 - saving)


def traffic_verdicts(
    ours_mb: Mapping[str, float], theirs_mb: Mapping[str, float], saving: float
) -> dict[str, tuple[float, str, float]]:
    """Per metric (``per round``, ``per 1,000 samples``, ...): (B / A, the verdict word, the
    rounds ratio the claim "A saves ``saving`` of B's traffic" needs). The per-1,000-samples
    row carries ``reported, not judged`` (:data:`JUDGED_METRICS`)."""
    claim = saving_claim(saving)
    out = {}
    for metric, mine in ours_mb.items():
        ratio = theirs_mb[metric] / mine
        word = (
            per_round_verdict(ratio, claim, metric)
            if metric in JUDGED_METRICS
            else "reported, not judged"
        )
        out[metric] = (ratio, word, rounds_needed(ratio, claim))
    return out


def robust_verdict(default: str, by_parameter: Mapping[str, Sequence[str]]) -> str:
    """``default``: the verdict word at the cards' values; ``by_parameter``: the words over
    each parameter's range. One word everywhere: that word ``across the ranges``; else
    ``depends on`` every parameter whose range holds another word."""
    flips = [p for p, words in by_parameter.items() if any(w != default for w in words)]
    if not flips:
        return f"{default.removesuffix(' per round')} across the ranges (per round)"
    return "depends on " + ", ".join(flips)


def tornado(
    default: float, by_parameter: Mapping[str, Sequence[tuple[str, float]]]
) -> list[tuple[str, float, float, str, str]]:
    """Tornado rows, widest first: (parameter, lowest ratio, highest ratio, the value giving
    the lowest, the value giving the highest), the default included in each range."""
    rows = []
    for name, points in by_parameter.items():
        pts = [("default", default), *points]
        lo, hi = min(pts, key=lambda p: p[1]), max(pts, key=lambda p: p[1])
        rows.append((name, lo[1], hi[1], lo[0], hi[0]))
    return sorted(rows, key=lambda r: r[1] - r[2])

"""The verdict rules of the paper timing tables (issue 50 items 5, 6, 8;
``benchmarks/papers/verdicts.py``): hand-worked ratios, no verdict on time per 1,000
samples, a verdict that flips inside a range is "depends on X"."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "papers"))
from verdicts import (  # noqa: E402
    DIRECTION,
    FAILS,
    HOLDS,
    per_round_verdict,
    robust_verdict,
    rounds_needed,
    tornado,
    traffic_verdicts,
)


def test_per_round_words_and_the_rounds_the_claim_needs():
    assert per_round_verdict(2.5, 2.18) == HOLDS
    assert per_round_verdict(1.5, 2.18) == DIRECTION
    assert per_round_verdict(0.78, 2.18) == FAILS
    assert rounds_needed(0.78, 2.18) == pytest.approx(2.18 / 0.78)


def test_no_verdict_rests_on_time_per_1000_samples():
    with pytest.raises(ValueError, match="no verdict rests on"):
        per_round_verdict(3.0, 1.5, "per 1,000 samples")


def test_parallelsfl_traffic_claim_per_metric_by_hand():
    """ParallelSFL 73.3 MB per 1,000 samples vs AdaSFL 44.0 (issue 50 item 5): "at least 21 %"
    less traffic needs AdaSFL to take (73.3 / 44.0) / 0.79 = 2.11× ParallelSFL's rounds."""
    ours = {"per round": 1000.0, "per 1,000 samples": 73.3}
    theirs = {"per round": 600.0, "per 1,000 samples": 44.0}
    got = traffic_verdicts(ours, theirs, 0.21)
    ratio, word, needed = got["per round"]
    assert ratio == pytest.approx(0.6) and word == FAILS
    assert needed == pytest.approx(1 / 0.79 / 0.6)
    ratio, word, needed = got["per 1,000 samples"]
    assert word == "reported, not judged"
    assert needed == pytest.approx((73.3 / 44.0) / 0.79)


def test_a_verdict_that_flips_inside_a_range_depends_on_that_parameter():
    words = {"device FLOP/s": [FAILS, HOLDS], "PS link": [HOLDS, HOLDS]}
    assert robust_verdict(HOLDS, words) == "depends on device FLOP/s"
    assert robust_verdict(HOLDS, {"PS link": [HOLDS]}) == "holds across the ranges (per round)"
    both = {"a": [FAILS], "b": [DIRECTION, FAILS]}
    assert robust_verdict(FAILS, both) == "depends on b"


def test_tornado_rows_widest_first_with_the_default_inside_each_range():
    rows = tornado(1.0, {"narrow": [("x2", 1.1)], "wide": [("x0.25", 0.45), ("x4", 1.46)]})
    assert [r[0] for r in rows] == ["wide", "narrow"]
    assert rows[0][1:] == (0.45, 1.46, "x0.25", "x4")
    assert rows[1][1:] == (1.0, 1.1, "default", "x2")


def _cell(traffic_mb: float, samples: float = 1000.0, warmup_mb: float = 0.0) -> dict:
    return {"stats": {"traffic_mb": traffic_mb, "samples": samples, "warmup_traffic_mb": warmup_mb}}


def test_s2fl_warmup_on_every_device_cannot_give_table3s_traffic():
    """α 0.5: S²FL's printed traffic to 50 % is 5,142 MB; a warm-up of 13,453 MB (every
    device) is impossible, one of 1,363 MB (selected only) leaves (5,142 − 1,363) / 344 rounds."""
    from timing_report import s2fl_warmup_rows

    cells = {
        "s2fl": _cell(457.0, warmup_mb=13453.0),
        "s2fl (warm-up: selected only)": _cell(344.0, warmup_mb=1363.0),
    }
    rows = {(r[1], r[2]): r[5] for r in s2fl_warmup_rows("a=0.5", cells)}
    every = "every device (§3.1 'sends W_c to all the devices')"
    assert rows[("50%", every)] == rows[("60%", every)] == "impossible"
    assert rows[("50%", "the round's selected devices only")] == (
        f"possible: {(5142 - 1363) / 344:.1f} rounds after it"
    )


def test_parallelsfl_traffic_rows_judge_per_round_and_report_per_sample():
    from timing_report import parallelsfl_traffic_rows

    cells = {"parallelsfl": _cell(1000.0, 13643.0), "adasfl": _cell(600.0, 13636.0)}
    rows = parallelsfl_traffic_rows(cells)
    assert [r[:2] for r in rows] == [
        ["adasfl (proxy)", "per round"],
        ["adasfl (proxy)", "per 1,000 samples"],
    ]
    assert rows[0][2:4] == ["0.60×", FAILS]
    assert rows[1][3] == "reported, not judged"

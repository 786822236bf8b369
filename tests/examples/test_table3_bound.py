"""S²FL Table 3's per-round ratios (``benchmarks/papers/s2fl/table3_bound.py``, issue 50
item 9) on a hand-made table: the traffic bound puts every device at its least-traffic cut,
not at its fastest (which is what S²FL picks by time, so its traffic is no bound)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "papers" / "s2fl"))
import table3_bound  # noqa: E402


def test_the_ratios_by_hand(monkeypatch):
    # 10 devices (every draw selects all of them), 3 cuts; the last cut is SFL's
    times = np.array([[3.0, 1.0, 4.0]] * 5 + [[2.0, 5.0, 6.0]] * 5)
    traffic = np.array([[5.0, 8.0, 10.0]] * 5 + [[9.0, 2.0, 10.0]] * 5)
    monkeypatch.setattr(table3_bound, "eq1_tables", lambda ctx: (times, traffic))
    r = table3_bound.ratios(None, draws=3)
    # SFL: slowest at the last cut 6.0; S²FL at each device's fastest cut (1 and 0): max 2.0
    assert r["time"] == pytest.approx(6.0 / 2.0)
    # traffic at the fastest cuts: 5 × 8 + 5 × 9 = 85; at the least-traffic cuts 5 × 5 + 5 × 2
    assert r["traffic_fastest"] == pytest.approx(100.0 / 85.0)
    assert r["traffic_bound"] == pytest.approx(100.0 / 35.0)
    assert r["traffic_bound"] >= r["traffic_fastest"]

"""S²FL's swap search just inside and just outside its table's exact-integer range (issue 54).

``_SwapTable`` claimed an error bound on its entries only while ``16·(C·Σ samples)² < 2⁵³``
(``_SwapTable.integral``; outside it ``error_bound`` is infinite and every improving pair is
scored exactly each step); since 2026-12-06 the samples are those of the ``2 × width`` largest
devices (a pair's scoring involves two groups), so ``in_range`` (the old rule) no longer
decides. One restart of ``balanced_groups`` on 1,000 Dirichlet(0.5) devices
(10 classes, 200 groups) with ``samples`` a device: at C = 10 the range ends at Σ ≈ 2.37·10⁶.

    PYTHONPATH=src python benchmarks/s2fl_integer_range.py --samples 2300 2400
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

from splitfl.algorithms.s2fl import data_balance as db


def one(samples: int, n: int = 1000) -> dict:
    """CPU seconds and pairs scored exactly for one restart on ``n`` devices."""
    rng = np.random.default_rng(0)
    shares = rng.dirichlet([0.5] * 10, n)
    hist = np.stack([rng.multinomial(samples, p) for p in shares]).astype(np.float64)
    scored, score_pairs = [0], db._score_pairs

    def counted(*args):
        scored[0] += len(args[5])
        return score_pairs(*args)

    db._score_pairs = counted
    try:
        start = time.process_time()
        db.balanced_groups(hist, n // 5, np.random.default_rng(1), restarts=1)
        cpu = time.process_time() - start
    finally:
        db._score_pairs = score_pairs
    in_range = bool(16 * (10 * hist.sum()) ** 2 < db._EXACT_INTS)  # the rule before 2026-12-06
    return {"n": n, "samples": samples, "in_range": in_range, "cpu_s": cpu, "scored": scored[0]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, nargs="+", default=[2300, 2400])
    for samples in parser.parse_args(argv).samples:
        print(json.dumps(one(samples)), flush=True)


if __name__ == "__main__":
    main()

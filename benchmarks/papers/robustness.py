"""Robustness of every per-round verdict to the unsourced parameters on the model cards
(issue 50 item 8): each parameter swept one at a time over a stated plausible range, per claim
the ratio B / A per round, its verdict word (``verdicts.py``), a tornado table, and the claim's
verdict across the ranges ("depends on X" where a value inside a range flips it).

    python benchmarks/papers/robustness.py                      # every claim
    python benchmarks/papers/robustness.py --only mergesfl-vs-locfedmix --rounds 3

Writes ``benchmarks/results/robustness-<date>.md`` and ``.json``. The ranges (``RANGES``) are
the plausible spans named on the cards; the papers print none of these values.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing_setups import MBPS, SETUPS  # noqa: E402
from timing_tables import run_cell, steady  # noqa: E402
from verdicts import per_round_verdict, robust_verdict, tornado  # noqa: E402


@dataclass(frozen=True)
class Claim:
    """A paper's claim "A is ``paper``× better than B" on ``key`` (``round_time`` or
    ``traffic_mb``), judged per round on ``setup`` with ``overrides``."""

    name: str
    text: str
    setup: str
    a: str
    b: str
    key: str
    paper: float
    overrides: dict
    ranges: str


#: Plausible ranges of each unsourced parameter, per preset: label -> [(value, overrides)].
RANGES = {
    "jetson80": {
        "device FLOP/s (×0.25–×4; Table II prints peaks only)": [
            ("×0.25", {"devices.flops_scale": 0.25}),
            ("×4", {"devices.flops_scale": 4.0}),
        ],
        "PS link (50–1000 Mb/s; no figure)": [
            ("50 Mb/s", {"devices.server_rate": 50 * MBPS}),
            ("1000 Mb/s", {"devices.server_rate": 1000 * MBPS}),
        ],
        "PS link sharing (a reading)": [("unshared", {"devices.contention": False})],
        "bandwidth correlation ρ (0–1; an assumption)": [
            ("ρ = 0", {"devices.bandwidth_correlation": 0.0}),
            ("ρ = 1", {"devices.bandwidth_correlation": 1.0}),
        ],
        "LocFedMix-SL's gradients (a reading)": [
            ("local only", {"options.locfedmix_sl.device_update": "local"})
        ],
    },
    "s2fl_table1": {
        "device FLOP/s (×0.25–×4; Table 1 printed, a stress)": [
            ("×0.25", {"devices.flops_scale": 0.25}),
            ("×4", {"devices.flops_scale": 4.0}),
        ],
        "server link sharing at §5.1's 1e7 B/s (a reading)": [
            ("shared", {"devices.contention": True})
        ],
    },
    "ringsfl_testbed": {
        "PC / Pi FLOP/s (×0.25–×4; CPU names only)": [
            ("×0.25", {"devices.flops_scale": 0.25}),
            ("×4", {"devices.flops_scale": 4.0}),
        ],
        "server link sharing (a reading)": [("shared", {"devices.contention": True})],
    },
}

CLAIMS = [
    Claim(
        "mergesfl-vs-locfedmix",
        "MergeSFL: 54 % less completion time than LocFedMix-SL (Fig. 6(c))",
        "mergesfl-alexnet",
        "mergesfl",
        "locfedmix_sl",
        "round_time",
        1 / (1 - 0.54),
        {},
        "jetson80",
    ),
    Claim(
        "parallelsfl-vs-adasfl",
        "ParallelSFL: 1.36× faster than AdaSFL (Fig. 4(b))",
        "parallelsfl-alexnet",
        "parallelsfl",
        "adasfl",
        "round_time",
        1.36,
        {},
        "jetson80",
    ),
    Claim(
        "parallelsfl-traffic-vs-adasfl",
        "ParallelSFL: at least 21 % less traffic than AdaSFL (§5.2)",
        "parallelsfl-alexnet",
        "parallelsfl",
        "adasfl",
        "traffic_mb",
        1 / (1 - 0.21),
        {},
        "jetson80",
    ),
    Claim(
        "s2fl-vs-sfl",
        "S²FL: 3.26× less time than SFL to 50 % at α 0.5 (Table 3)",
        "s2fl-table3",
        "s2fl",
        "splitfed_v1",
        "round_time",
        7612 / 2338,
        {"data.alpha": 0.5},
        "s2fl_table1",
    ),
    Claim(
        "ringsfl-vs-fl",
        "RingSFL: 61.6 % less time per round than vanilla FL at 135 Mb/s (Fig. 13)",
        "ringsfl-resnet18",
        "ringsfl",
        "fedavg",
        "round_time",
        1 / (1 - 0.616),
        {},
        "ringsfl_testbed",
    ),
]


def ratio(claim: Claim, rounds: int | None, overrides: dict, cache: dict) -> float:
    """B / A per round on ``claim.key`` with ``overrides`` (cells cached across claims)."""
    setup = SETUPS[claim.setup]
    base = copy.deepcopy(setup.base)
    if rounds is not None:
        base["rounds"] = max(rounds, setup.warmup + 1)
    values = []
    for algorithm in (claim.b, claim.a):
        key = json.dumps([claim.setup, algorithm, base["rounds"], overrides], sort_keys=True)
        if key not in cache:
            cell = run_cell(base, {**claim.overrides, **overrides}, algorithm)
            cache[key] = steady(cell["rows"], setup.warmup)
            print(key, f"{cache[key][claim.key]:.1f}", flush=True)
        values.append(cache[key][claim.key])
    return values[0] / values[1]


def judge(claim: Claim, rounds: int | None, cache: dict) -> dict:
    """The claim at the cards' values and over each range: ratios, words, tornado, verdict."""
    default = ratio(claim, rounds, {}, cache)
    points = {
        label: [(value, ratio(claim, rounds, over, cache)) for value, over in values]
        for label, values in RANGES[claim.ranges].items()
    }
    word = per_round_verdict(default, claim.paper)
    words = {p: [per_round_verdict(r, claim.paper) for _, r in pts] for p, pts in points.items()}
    return {
        "default": default,
        "word": word,
        "points": points,
        "tornado": tornado(default, points),
        "verdict": robust_verdict(word, words),
    }


def markdown(results: dict, rounds: int | None) -> str:
    lines = [
        "# Robustness of the per-round verdicts to the unsourced parameters",
        "",
        f"`benchmarks/papers/robustness.py`, {date.today().isoformat()}, "
        f"{rounds or 'each setup’s'} rounds, seed 0. Ratio = B ÷ A per round (> 1: A better); "
        "a claim's paper figure is to the target accuracy, so `holds per round` means the "
        "per-round cost alone gives the figure; the claim itself needs training (issue 50 item 7).",
        "",
    ]
    for claim in CLAIMS:
        if claim.name not in results:
            continue
        r = results[claim.name]
        lines += [
            f"## {claim.text}",
            "",
            f"Paper {claim.paper:.2f}×; ours at the cards' values {r['default']:.2f}× "
            f"({r['word']}). **Verdict across the ranges: {r['verdict']}.**",
            "",
            "| parameter | lowest ratio | highest ratio | at | at |",
            "|---|---|---|---|---|",
        ]
        for name, lo, hi, at_lo, at_hi in r["tornado"]:
            lines.append(f"| {name} | {lo:.2f}× | {hi:.2f}× | {at_lo} | {at_hi} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=[c.name for c in CLAIMS])
    parser.add_argument("--rounds", type=int, help="rounds per cell (default: each setup's)")
    parser.add_argument("--out", type=Path, help="output stem")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    stem = args.out or Path(__file__).resolve().parents[1] / "results" / (
        f"robustness-{date.today().isoformat()}"
    )
    cache: dict = {}
    results = {
        c.name: judge(c, args.rounds, cache) for c in CLAIMS if not args.only or c.name in args.only
    }
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps({"results": results, "cells": cache}, indent=1))
    stem.with_suffix(".md").write_text(markdown(results, args.rounds))
    print(f"wrote {stem.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

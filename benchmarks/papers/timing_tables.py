"""Every time/traffic claim of the four papers at the papers' model sizes, with
``executor: timing`` (the algorithms' real control and the clock, no training).

Without training there is no accuracy, so no time *to a target accuracy*: each table compares
time, traffic and waiting **per round** (the same number of rounds for every algorithm), next
to the paper's figures. Where the paper prints time and traffic to a target, the ratio of the
paper's to-target figure to our per-round ratio is the ratio of rounds-to-target the paper's
training must have had (``rounds ratio implied``); if the paper's time and traffic come from
the same runs, the two implied ratios agree. Setups: ``timing_setups.py``.

    python benchmarks/papers/timing_tables.py                     # all four papers
    python benchmarks/papers/timing_tables.py --only s2fl-table3 --rounds 20

Writes ``benchmarks/results/timing-tables-<date>.md`` and ``.json`` (per-round rows).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import date
from pathlib import Path
from typing import Any

import torch

import splitfl
from splitfl.config import set_dotted

sys.path.insert(0, str(Path(__file__).resolve().parent))
import timing_report  # noqa: E402
from timing_setups import SETUPS, Setup  # noqa: E402

ROW_KEYS = (
    "round",
    "round_time",
    "sim_time",
    "traffic_total",
    "traffic_total_cum",
    "avg_waiting",
    "samples",
)


def run_cell(base: dict[str, Any], overrides: dict[str, Any], algorithm: str) -> dict:
    """One timing run: its per-round rows (the fields the tables need) and wall seconds."""
    cfg = copy.deepcopy(base)
    for key, value in {**overrides, "algorithm": algorithm}.items():
        set_dotted(cfg, key.split("."), value)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = splitfl.run(cfg, run_dir=Path(tmp) / "run", progress=False)
    rows = [{k: r[k] for k in ROW_KEYS} | {"clients": len(r["clients"])} for r in res.metrics]
    return {"rows": rows, "wall_s": time.perf_counter() - t0, "config": cfg}


def steady(rows: list[dict], warmup: int) -> dict[str, float]:
    """Means per round after ``warmup`` rounds, and the warm-up's totals."""
    tail = rows[warmup:] or rows
    head = rows[:warmup]
    return {
        "round_time": statistics.fmean(r["round_time"] for r in tail),
        "traffic_mb": statistics.fmean(r["traffic_total"] for r in tail) / 1e6,
        "waiting": statistics.fmean(r["avg_waiting"] for r in tail),
        "clients": statistics.fmean(r["clients"] for r in tail),
        # work per round, and time per 1,000 samples trained: the equal-work comparison
        "samples": statistics.fmean(r["samples"] for r in tail),
        "time_per_1k": 1000 * sum(r["round_time"] for r in tail) / sum(r["samples"] for r in tail),
        "warmup_time": sum(r["round_time"] for r in head),
        "warmup_traffic_mb": sum(r["traffic_total"] for r in head) / 1e6,
        "rounds": len(rows),
    }


def run_setup(setup: Setup, rounds: int | None) -> dict:
    """Every (variant, algorithm) cell of ``setup``."""
    base = copy.deepcopy(setup.base)
    if rounds is not None:
        base["rounds"] = max(rounds, setup.warmup + 1)
    out: dict[str, dict] = {}
    rows = {a: (a, {}) for a in setup.algorithms} | setup.extra
    for label, overrides in setup.variants.items():
        out[label] = {}
        for name, (algorithm, extra) in rows.items():
            cell = run_cell(base, {**overrides, **extra}, algorithm)
            cell["stats"] = steady(cell["rows"], setup.warmup)
            out[label][name] = cell
            s = cell["stats"]
            print(
                f"{setup.name} {label} {name}: {s['round_time']:.1f} s/round, "
                f"{s['traffic_mb']:.0f} MB/round, waiting {s['waiting']:.1f} s "
                f"({cell['wall_s']:.0f} s wall)",
                flush=True,
            )
    return out


def git_head() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=sorted(SETUPS), help="setups to run")
    parser.add_argument("--rounds", type=int, help="rounds per run (default: each setup's)")
    parser.add_argument("--out", type=Path, help="output stem (default: benchmarks/results/...)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = args.only or list(SETUPS)
    stem = args.out or Path(__file__).resolve().parents[1] / "results" / (
        f"timing-tables-{date.today().isoformat()}"
    )
    results = {"commit": git_head(), "date": date.today().isoformat(), "setups": {}}
    for name in names:
        results["setups"][name] = run_setup(SETUPS[name], args.rounds)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(results, indent=1))
    stem.with_suffix(".md").write_text(timing_report.markdown(results))
    print(f"wrote {stem.with_suffix('.md')} and {stem.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

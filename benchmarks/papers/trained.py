"""Claims judged by training to the target accuracy (issue 50 item 7).

For each paper's headline claim (``trained_setups.py``), train the method and its baselines
on the paper's time model for 3 seeds and read, per run, the simulated time and the traffic
at the first round whose test accuracy reaches the target (:func:`time_to_target`, the way
the papers read their curves). Per pair: the ratio baseline / method per seed, its mean ± std,
and a verdict against the printed figure (:func:`verdict`).

    python benchmarks/papers/trained.py                       # the CPU grid (resumable)
    python benchmarks/papers/trained.py --only s2fl --seeds 0
    python benchmarks/papers/trained.py --mode full --data-root /data   # a GPU, full scale
    python benchmarks/papers/trained.py --mode tiny --out /tmp/t        # seconds (the test)

Each finished run is one JSON file under ``--out`` (default
``benchmarks/results/trained-<mode>/``); a rerun skips those (resume), prints one progress
line per run, then writes ``summary.json`` and ``summary.md`` there. Several processes may
work on one grid at once (each run is claimed by a ``.lock`` file while it trains); the
summary needs every run, so start ``--summary-only`` once all have finished.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import splitfl
from splitfl.config import read_yaml_mapping, set_dotted
from splitfl.config.parse import flatten
from splitfl.metrics.summary import target_for, to_target

sys.path.insert(0, str(Path(__file__).resolve().parent))
from trained_setups import CLAIMS, COMMON, HERE, MODES, TINY, Claim  # noqa: E402

ROW_KEYS = ("round", "sim_time", "traffic_total_cum", "test_acc")
HOLDS, DIRECTION, FAILS, UNREACHED = "holds", "direction only", "fails", "not reached"


def config_for(claim: Claim, mode: str, algorithm: str, seed: int, data_root: str | None):
    """The run's config: the base YAML, the mode's overrides (tiny = cpu + :data:`TINY`),
    :data:`COMMON`, the algorithm and the seed."""
    cfg = read_yaml_mapping(HERE / claim.base)
    layers = {"cpu": [claim.cpu], "full": [claim.full], "tiny": [claim.cpu, TINY, claim.tiny]}
    over: dict[str, Any] = {}
    for layer in layers[mode]:
        over |= layer
    algorithm, reading = claim.readings.get(algorithm, (algorithm, {}))
    over |= COMMON | reading | {"algorithm": algorithm, "seed": seed}
    if data_root is not None and mode != "tiny":
        over["data.root"] = data_root
    for key, value in over.items():
        set_dotted(cfg, key.split("."), value)
    return cfg


def time_to_target(rows: Sequence[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """Simulated seconds, MB (10^6 B) and round at the first row whose ``test_acc`` reaches
    ``target``; None if no row does (rows without an evaluation are skipped)."""
    hit = to_target(list(rows), target)
    if hit["round"] is None:
        return None
    return {"round": hit["round"], "time": hit["sim_time"], "mb": hit["traffic_bytes"] / 1e6}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), std


def verdict(ratios: Sequence[float | None], paper: float | None) -> str:
    """The claim "B / A ≥ ``paper``" on the per-seed ratios: ``not reached`` when a seed
    has no ratio (a run missed the target), else ``holds`` where the mean ≥ the figure,
    ``direction only`` where 1 < mean < figure, ``fails`` where the mean ≤ 1; with how many
    seeds are on the claim's side."""
    if not ratios:
        return "not run"
    if any(r is None for r in ratios):
        return UNREACHED
    mean = statistics.fmean(ratios)
    if paper is None:
        word = "reported (no figure)"
    else:
        word = HOLDS if mean >= paper else DIRECTION if mean > 1.0 else FAILS
    if paper is not None:
        word += f" ({sum(r >= paper for r in ratios)} of {len(ratios)} seeds ≥ {paper:.2f}×)"
    return word


def run_one(cfg: dict[str, Any]) -> dict[str, Any]:
    """Train one config; its rows (the fields the table needs) and wall seconds."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        res = splitfl.run(cfg, run_dir=Path(tmp) / "run", progress=False)
    rows = [{k: r.get(k) for k in ROW_KEYS} for r in res.metrics]
    return {"rows": rows, "wall_s": time.perf_counter() - t0}


def run_grid(
    claims: Sequence[Claim], mode: str, seeds: Sequence[int], out: Path, data_root: str | None
) -> None:
    """Every (claim, seed, algorithm) run not yet in ``out``, one JSON file each."""
    out.mkdir(parents=True, exist_ok=True)
    cells = [
        (c, s, a)
        for c in claims
        for s in seeds
        for a in c.algorithms
        if a not in c.reuse.get(mode, {})
    ]
    for k, (claim, seed, algorithm) in enumerate(cells, 1):
        path = out / f"{claim.name}-{algorithm}-s{seed}.json"
        tag = f"[{k}/{len(cells)}] {claim.name} {algorithm} seed {seed}"
        if path.exists():
            print(f"{tag}: done before", flush=True)
            continue
        lock = path.with_suffix(".lock")
        try:  # several processes may share one grid: each run is claimed by one
            lock.open("x").close()
        except FileExistsError:
            print(f"{tag}: running in another process (else delete {lock.name})", flush=True)
            continue
        cfg = config_for(claim, mode, algorithm, seed, data_root)
        try:
            result = run_one(cfg) | {"config": cfg}
            path.write_text(json.dumps(result, allow_nan=False) + "\n")
        finally:
            lock.unlink()
        last = result["rows"][-1]
        print(
            f"{tag}: {result['wall_s']:.0f} s wall, acc {last['test_acc']:.4f}, "
            f"sim {last['sim_time']:.0f} s, {last['traffic_total_cum'] / 1e6:.0f} MB",
            flush=True,
        )


def differing_fields(mine: dict[str, Any], theirs: dict[str, Any]) -> set[str]:
    """Dotted fields where two configs differ, leaving out ``options`` of algorithms other
    than the one both run (they are never read)."""
    a, b = flatten(mine), flatten(theirs)
    used = f"options.{mine['algorithm']}."
    keys = {k for k in set(a) | set(b) if a.get(k) != b.get(k)}
    return {k for k in keys if not k.startswith("options.") or k.startswith(used)}


def load_run(claim: Claim, mode: str, algorithm: str, seed: int, out: Path) -> dict | None:
    """One run's record (None: not run); a run reused from another claim (``Claim.reuse``),
    or run for more rounds than the claim now has, is cut to the claim's rounds, after
    checking the configs differ in ``rounds`` only (a run's first rounds do not depend on
    how many follow)."""
    other = claim.reuse.get(mode, {}).get(algorithm, claim.name)
    path = out / f"{other}-{algorithm}-s{seed}.json"
    if not path.exists():
        return None
    record = json.loads(path.read_text())
    mine = config_for(claim, mode, algorithm, seed, record["config"]["data"].get("root"))
    diff = differing_fields(mine, record["config"])
    if diff - {"rounds"} or mine["rounds"] > record["config"]["rounds"]:
        raise ValueError(f"{claim.name}/{algorithm} cannot reuse {other}'s run: {sorted(diff)}")
    if other == claim.name:  # a longer run of this config (the grid was shortened)
        return {**record, "rows": record["rows"][: mine["rounds"]]}
    return {**record, "rows": record["rows"][: mine["rounds"]], "reused_from": other}


def pair_rows(claim: Claim, runs: dict[tuple[str, int], dict], target: float, seeds) -> list:
    """Per method (and reading) and baseline: per-seed time and traffic ratios (B / A) to
    ``target`` and verdicts."""
    out = []
    for method, (base, (p_time, p_mb)) in itertools.product(claim.methods, claim.figures.items()):
        t_ratio, mb_ratio = [], []
        for seed in seeds:
            ra, rb = runs[(method, seed)], runs[(base, seed)]
            if ra is None or rb is None:  # not run: this seed is left out of the pair
                continue
            a = time_to_target(ra["rows"], target)
            b = time_to_target(rb["rows"], target)
            ok = a is not None and b is not None
            t_ratio.append(b["time"] / a["time"] if ok else None)
            mb_ratio.append(b["mb"] / a["mb"] if ok else None)
        out.append(
            {
                "method": method,
                "baseline": base,
                "target": target,
                "time_ratio": t_ratio,
                "traffic_ratio": mb_ratio,
                "paper_time": p_time,
                "paper_traffic": p_mb,
                "time_verdict": verdict(t_ratio, p_time),
                "traffic_verdict": verdict(mb_ratio, p_mb),
            }
        )
    return out


def resolve_targets(spec: Sequence[float | str], runs: Sequence[list[dict]]) -> list[float]:
    """The claim's targets: numbers as given; ``auto`` = splitfl's common-target rule
    (:func:`~splitfl.metrics.summary.target_for`: ``DEFAULT_TARGET_FRACTION`` = 0.95 of the
    lowest best test accuracy over every run of the claim, all methods and seeds, rounded
    down to 0.5 %), a level every run reaches, as the papers read their curves."""
    bests = [max(r["test_acc"] for r in rows if r["test_acc"] is not None) for rows in runs]
    out = []
    for target in spec:
        value = target_for(bests, None) if target == "auto" else target
        if value is not None and value not in out:
            out.append(float(value))
    return out


def cell_stats(rows: list[dict], target: float) -> dict[str, Any]:
    """One run at ``target``: its time, traffic and round (None: not reached), final acc."""
    hit = time_to_target(rows, target)
    accs = [r["test_acc"] for r in rows if r["test_acc"] is not None]
    return {"hit": hit, "final_acc": accs[-1], "best_acc": max(accs)}


def summarise(claims: Sequence[Claim], mode: str, seeds: Sequence[int], out: Path) -> dict:
    """The summary of the runs in ``out``: per claim, target and algorithm the per-seed
    times/traffic to the target; per pair the ratios and verdicts."""
    summary: dict[str, Any] = {"mode": mode, "seeds": list(seeds), "claims": {}}
    for claim in claims:
        runs = {(a, s): load_run(claim, mode, a, s, out) for a in claim.algorithms for s in seeds}
        entry: dict[str, Any] = {"quote": claim.quote, "where": claim.where, "targets": {}}
        done = [r["rows"] for r in runs.values() if r is not None]
        entry["not_run"] = [f"{a} seed {s}" for (a, s), r in runs.items() if r is None]
        for target in resolve_targets(claim.targets[mode], done):
            cells = {
                a: [cell_stats(runs[(a, s)]["rows"], target) for s in seeds if runs[(a, s)]]
                for a in claim.algorithms
            }
            entry["targets"][str(target)] = {
                "cells": cells,
                "pairs": pair_rows(claim, runs, target, seeds),
            }
        summary["claims"][claim.name] = entry
    return summary


def pm(values: Sequence[float | None], digits: int = 1, suffix: str = "") -> str:
    """``mean ± std`` over the seeds that have a value; ``-`` (n of m) when some have none."""
    if not values:
        return "not run"
    have = [v for v in values if v is not None]
    if not have:
        return "not reached"
    m, s = mean_std(have)
    digits += 2 if 0 < abs(m) < 0.1 else 0  # small ratios keep two significant digits
    text = f"{m:,.{digits}f} ± {s:,.{digits}f}{suffix}"
    return text if len(have) == len(values) else f"{text} ({len(have)} of {len(values)})"


def headline_table(summary: dict[str, Any]) -> list[str]:
    """One row per claim and pair at each claim's first target: the paper's and our ratios
    (B / A, mean ± std over seeds), the verdicts and the rounds each side needed."""
    lines = [
        "| paper | pair (B / A) | target | rounds to target A / B | time: paper | ours "
        "| verdict | traffic: paper | ours | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    fig = lambda v: "-" if v is None else f"{v:.2f}×"  # noqa: E731
    for name, entry in summary["claims"].items():
        claim = CLAIMS[name]
        if not entry["targets"]:
            continue
        target, block = next(iter(entry["targets"].items()))
        for p in block["pairs"]:
            rounds = [
                pm([c["hit"] and c["hit"]["round"] for c in block["cells"][a]])
                for a in (p["method"], p["baseline"])
            ]
            lines.append(
                f"| {claim.paper} | {claim.labels.get(p['baseline'], p['baseline'])} / "
                f"{claim.labels.get(p['method'], p['method'])} | {100 * float(target):g} % "
                f"| {rounds[0]} / {rounds[1]} | {fig(p['paper_time'])} "
                f"| {pm(p['time_ratio'], 2, '×')} | {p['time_verdict']} "
                f"| {fig(p['paper_traffic'])} | {pm(p['traffic_ratio'], 2, '×')} "
                f"| {p['traffic_verdict']} |"
            )
    return lines


def markdown(summary: dict[str, Any]) -> str:
    """The tables: per claim and target, time/traffic to the target per algorithm, then the
    pairs' ratios (mean ± std over seeds) against the paper's figures, with the verdicts."""
    lines = [f"Mode `{summary['mode']}`, seeds {summary['seeds']}.", ""]
    lines += [*headline_table(summary), ""]
    for name, entry in summary["claims"].items():
        claim = CLAIMS[name]
        lines += [f"### {claim.paper}: {entry['where']}", "", f"> {entry['quote']}", ""]
        lines += [f"Narrowed: {'; '.join(claim.narrowed)}.", ""]
        if entry["not_run"]:
            lines += [f"Not run (CPU budget): {', '.join(entry['not_run'])}.", ""]
        for target, block in entry["targets"].items():
            lines += [f"Target {100 * float(target):g} %:", ""]
            lines += ["| algorithm | time to target (s) | traffic to target (MB) | round | "]
            lines[-1] += "final acc % |"
            lines.append("|---|---|---|---|---|")
            for alg, cells in block["cells"].items():
                hits = [c["hit"] for c in cells]
                lines.append(
                    f"| {claim.labels.get(alg, alg)} "
                    f"| {pm([h and h['time'] for h in hits])} "
                    f"| {pm([h and h['mb'] for h in hits])} "
                    f"| {pm([h and h['round'] for h in hits])} "
                    f"| {pm([100 * c['final_acc'] for c in cells], 2)} |"
                )
            lines += ["", "| pair (B / A) | time: paper | ours | verdict | traffic: paper "]
            lines[-1] += "| ours | verdict |"
            lines.append("|---|---|---|---|---|---|---|")
            for p in block["pairs"]:
                fig = lambda v: "-" if v is None else f"{v:.2f}×"  # noqa: E731
                lines.append(
                    f"| {claim.labels.get(p['baseline'], p['baseline'])} / "
                    f"{claim.labels.get(p['method'], p['method'])} "
                    f"| {fig(p['paper_time'])} | {pm(p['time_ratio'], 2, '×')} "
                    f"| {p['time_verdict']} | {fig(p['paper_traffic'])} "
                    f"| {pm(p['traffic_ratio'], 2, '×')} | {p['traffic_verdict']} |"
                )
            lines.append("")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=MODES, default="cpu")
    ap.add_argument("--only", help="comma-separated claims: " + ",".join(CLAIMS))
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    ap.add_argument("--out", type=Path, help="default benchmarks/results/trained-<mode>")
    ap.add_argument("--data-root", help="data.root for cpu/full (default: the configs')")
    ap.add_argument("--summary-only", action="store_true", help="tables from finished runs")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else list(CLAIMS)
    unknown = [n for n in names if n not in CLAIMS]
    if unknown:
        ap.error(f"--only: unknown claim(s) {unknown}; known: {sorted(CLAIMS)}")
    claims = [CLAIMS[n] for n in names]
    seeds = [int(s) for s in args.seeds.split(",")]
    out = args.out or HERE.parent / "results" / f"trained-{args.mode}"
    if not args.summary_only:
        run_grid(claims, args.mode, seeds, out, args.data_root)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarise(claims, args.mode, seeds, out)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, allow_nan=False) + "\n")
    (out / "summary.md").write_text(markdown(summary))
    print(f"wrote {out / 'summary.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

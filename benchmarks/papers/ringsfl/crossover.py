"""RingSFL vs FedAvg on the ``ringsfl_testbed`` clock: where the crossover D2D rate sits as a
function of the Raspberry Pi's speed (issue 32 item 4), and §3.3's compute-only bound.

The paper prints no device speeds; ``ringsfl_testbed`` assumes 1e11 FLOP/s per PC and 5e9 per
Pi (``splitfl.system.devices``), and those two numbers set the D2D rate at which RingSFL's
round gets shorter than FedAvg's (Fig. 12: between 5 and 10 Mb/s in the paper). For each Pi
speed, the crossover is found by bisection on log(rate) with one timing round per run
(ResNet-18, CIFAR-10, 4:3:1:1:1, the paper's Fig. 12-13 setup, ``timing_setups.RINGSFL``).

    python benchmarks/papers/ringsfl/crossover.py   # results/ringsfl-crossover-<date>.json
"""

from __future__ import annotations

import copy
import json
import math
import sys
import tempfile
from dataclasses import replace
from datetime import date
from pathlib import Path

import numpy as np
import torch

import splitfl
import splitfl.system.devices as devices
from splitfl.config import set_dotted
from splitfl.experiment.runner import as_config, prepare

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from timing_setups import MBPS, RINGSFL  # noqa: E402

PI_FLOPS = (2.5e9, 5e9, 1e10, 2e10)
PIPELINES = ("ideal", "schedule", "arrival")


def round_time(algorithm: str, overrides: dict) -> float:
    cfg = copy.deepcopy(RINGSFL.base)
    for key, value in {**overrides, "algorithm": algorithm, "rounds": 1}.items():
        set_dotted(cfg, key.split("."), value)
    with tempfile.TemporaryDirectory() as tmp:
        return splitfl.run(cfg, run_dir=Path(tmp) / "r", progress=False).metrics[0]["round_time"]


def crossover(pipeline: str, lo: float = 0.5, hi: float = 2000.0, steps: int = 14) -> float:
    """The D2D rate (Mb/s) at which RingSFL's round equals FedAvg's (FedAvg uses the
    client-server links only, so its round does not depend on the D2D rate)."""
    fedavg = round_time("fedavg", {})

    def faster(mbps: float) -> bool:
        over = {"devices.d2d_rate": mbps * MBPS, "options.ringsfl.pipeline": pipeline}
        return round_time("ringsfl", over) < fedavg

    if not faster(hi):
        return math.inf
    for _ in range(steps):
        mid = math.sqrt(lo * hi)
        lo, hi = (lo, mid) if faster(mid) else (mid, hi)
    return math.sqrt(lo * hi)


def compute_only_reduction() -> float:
    """§3.3 with computation alone: 1 − max_i (Σ_s D_s·FLOPs(i's segment of s's pass) / C_i)
    / max_i (D_i·FLOPs(model) / C_i), D the samples of a round. Every batch passes through
    every member, on a segment that depends on where the batch started (the ring's
    ``segments``); FedAvg's round is the slowest device training the whole model."""
    cfg = as_config({**copy.deepcopy(RINGSFL.base), "algorithm": "ringsfl"})
    prep = prepare(cfg)
    ctx, alg = prep.ctx, prep.algorithm
    prof, clients = ctx.profile, list(range(ctx.num_clients))
    plan = alg.plan_round(0, clients, np.random.default_rng(0))
    samples = {t.client: ctx.round_samples(t.client, t.batch_size, t.steps) for t in plan.tasks}
    flops = {c: ctx.population.devices[c].flops for c in clients}
    load = dict.fromkeys(clients, 0.0)
    for start in plan.topology.spec.order:
        for member, lo, hi in plan.topology.spec.segments(start):
            load[member] += samples[start] * prof.part_flops(lo, hi) / flops[member]
    fedavg = max(samples[c] * prof.part_flops(0, prof.num_blocks) / flops[c] for c in clients)
    return 1.0 - max(load.values()) / fedavg


def main() -> int:
    torch.set_num_threads(1)
    original = devices.RINGSFL_PI
    result = {"date": date.today().isoformat(), "pi_flops": {}, "paper_crossover_mbps": [5, 10]}
    result["compute_only_reduction_4_3_1_1_1"] = compute_only_reduction()
    result["paper_reduction"] = 0.616
    print(f"compute-only bound: {100 * result['compute_only_reduction_4_3_1_1_1']:.1f} %")
    try:
        for pi in PI_FLOPS:
            devices.RINGSFL_PI = replace(original, flops=pi)
            row = {p: crossover(p) for p in PIPELINES}
            result["pi_flops"][f"{pi:.1e}"] = row
            print(f"Pi {pi:.1e} FLOP/s: " + ", ".join(f"{p} {v:.1f} Mb/s" for p, v in row.items()))
    finally:
        devices.RINGSFL_PI = original
    out = Path(__file__).resolve().parents[2] / "results" / f"ringsfl-crossover-{date.today()}.json"
    out.write_text(json.dumps(result, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Hold the simulated clock against measured time: the same config simulated and networked
with emulated devices (``network.emulate``), per round predicted vs measured.

For each algorithm and workload, a networked run on this machine (``network.devices`` device
processes, loopback) with every device emulating its ``devices.preset`` profile runs the
same plans as the simulation (``clock: simulated``, so the algorithms decide alike) and each
metrics row holds both sides: ``round_time`` / ``client_times`` (cost model, S²FL Eq. 1) and
``measured_round_time`` / ``measured_busy_s`` (wall clock). The shared server link and jitter
are off (``devices.contention: false``, ``devices.jitter: 0``): they are not emulated.

Second part, ``--sliding``: S²FL and SplitFed V1 with ``clock: measured`` on emulated
``s2fl_table1`` devices — which cut points slow and fast devices get, and the measured waiting.

    python benchmarks/clock_validation.py --out benchmarks/results/clock_validation.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import splitfl
from splitfl.experiment.runner import prepare
from splitfl.testing import config_for

WORKLOADS = {
    "digits": {"model": "cnn_digits", "data.dataset": "digits", "data.num_clients": 12},
    "mnist-lenet5": {
        "model": "lenet5",
        "data.dataset": "mnist",
        "data.num_clients": 12,
        "data.min_samples": 8,
        "train.local_steps": 5,
    },
}
EMULATED = {
    "executor": "networked",
    "network.devices": 3,
    "network.emulate": True,
    "devices.preset": "s2fl_table1",
    "devices.contention": False,
    "devices.jitter": 0.0,
}


def round_summary(row: dict) -> dict:
    """One metrics row as predicted vs measured: round time, ratio, median client ratio
    (measured busy ÷ predicted), waiting, dropped clients."""
    pairs = [
        (m, p)
        for m, p in zip(row["measured_busy_s"], row["client_times"], strict=True)
        if m is not None and p
    ]
    return {
        "round": row["round"],
        "predicted_s": row["round_time"],
        "measured_s": row["measured_round_time"],
        "ratio": row["measured_round_time"] / row["round_time"],
        "client_ratio_median": statistics.median(m / p for m, p in pairs),
        "predicted_wait_s": row["avg_waiting"],
        "measured_wait_s": statistics.mean(w for w in row["measured_wait_s"] if w is not None),
        "dropped": row["dropped_clients"],
    }


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]


#: RingSFL's ring: at most one client per block; 4 clients, 4 device processes (one each).
RING = {"data.num_clients": 4, "train.clients_per_round": 4, "network.devices": 4}


def validate(
    algorithm: str,
    workload: str,
    rounds: int,
    folder: Path,
    root: str,
    latency: float,
    preset: str = "s2fl_table1",
) -> dict:
    changes = {**WORKLOADS[workload], **EMULATED, "rounds": rounds, "data.root": root}
    changes["devices.exchange_latency_s"] = latency
    changes["devices.preset"] = preset
    if algorithm.startswith("ringsfl"):
        changes.update(RING)
    run_dir = folder / f"{algorithm}-{workload}-{preset}"
    splitfl.run(config_for(algorithm, **changes), run_dir=run_dir)
    per_round = [round_summary(row) for row in _rows(run_dir)]
    steady = per_round[1:] or per_round  # round 1 includes the devices' first-use costs
    return {
        "algorithm": algorithm,
        "workload": workload,
        "preset": preset,
        "rounds": per_round,
        "steady_ratio_mean": statistics.mean(r["ratio"] for r in steady),
    }


def sliding(rounds: int, folder: Path) -> dict:
    """S²FL vs SplitFed V1, measured clock, emulated s2fl_table1 devices."""
    out = {}
    for algorithm in ("s2fl", "splitfed_v1"):
        changes = {**WORKLOADS["digits"], **EMULATED, "rounds": rounds, "clock": "measured"}
        run_dir = folder / f"sliding-{algorithm}"
        result = splitfl.run(config_for(algorithm, **changes), run_dir=run_dir)
        ctx = prepare(result.config).ctx
        cuts_by_flops: dict[float, list[int]] = {}
        rows = _rows(run_dir)
        for row in rows[1:]:
            for client, cut in zip(row["clients"], row["cuts"], strict=True):
                flops = ctx.population.at(client, row["round"] - 1).flops
                cuts_by_flops.setdefault(flops, []).append(cut)
        out[algorithm] = {
            "mean_cut_by_device_flops": {
                f"{f:.0e}": statistics.mean(c) for f, c in sorted(cuts_by_flops.items())
            },
            "measured_wait_s_per_round": [
                statistics.mean(w for w in r["measured_wait_s"] if w is not None) for r in rows
            ],
            "measured_round_time_s": [r["measured_round_time"] for r in rows],
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algorithms", nargs="*", default=["splitfed_v1", "s2fl", "mergesfl"])
    p.add_argument("--workloads", nargs="*", default=["digits", "mnist-lenet5"])
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--presets", nargs="*", default=["s2fl_table1"], help="device presets")
    p.add_argument("--sliding", action="store_true", help="also the S²FL sliding-split check")
    p.add_argument("--data-root", default="../shared/data", help="where MNIST is")
    p.add_argument(
        "--exchange-latency",
        type=float,
        default=0.0,
        help="devices.exchange_latency_s of the prediction (0 = S²FL Eq. 1 exactly)",
    )
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    results: dict = {
        "validation": [],
        "date": time.strftime("%Y-%m-%d"),
        "exchange_latency_s": args.exchange_latency,
    }
    with tempfile.TemporaryDirectory() as tmp:
        for preset in args.presets:
            for workload in args.workloads:
                for algorithm in args.algorithms:
                    row = validate(
                        algorithm,
                        workload,
                        args.rounds,
                        Path(tmp),
                        args.data_root,
                        args.exchange_latency,
                        preset,
                    )
                    print(json.dumps(row), flush=True)
                    results["validation"].append(row)
        if args.sliding:
            results["sliding"] = sliding(args.rounds + 2, Path(tmp))
            print(json.dumps(results["sliding"]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

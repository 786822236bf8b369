"""Replay a few rounds of the MergeSFL benchmark at a given PS link rate and count the rounds in
which the PS link binds (some upload got less than its own uplink: the clock's max-min share of
the server link, ``splitfl.system.cost.share_server_link``). Prints one JSON line.

    python benchmarks/papers/mergesfl/ps_link_replay.py mergesfl 200 --rounds 30
    python benchmarks/papers/mergesfl/ps_link_replay.py fedavg preset -- devices.contention=false

The PS link rate is in Mb/s (``preset``: the preset's own, jetson80's 200 Mb/s); further
``key=value`` overrides follow ``--``. The sensitivity table of this directory's README was
made with it.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import splitfl
from splitfl.experiment import round_step

CONFIG = Path(__file__).with_name("mnist_lenet5_jetson80.yaml")


def _binds(report) -> bool:
    """Whether the server link slowed some upload below its own uplink this round."""
    return any(
        c.server_link is not None
        and c.extra.get("server_in_rate", c.server_link[0]) < c.server_link[0] * (1 - 1e-12)
        for c in report.costs.values()
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("algorithm")
    parser.add_argument("mbps", help="PS link rate in Mb/s, or 'preset'")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--out-dir", default="runs/ps-link-replay")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    torch.set_num_threads(1)
    bound: list[bool] = []
    measure = round_step.measure

    def counting(config, algorithm, plan, result, r):
        report, waits = measure(config, algorithm, plan, result, r)
        bound.append(_binds(report))
        return report, waits

    round_step.measure = counting  # the round step looks it up at call time
    overrides = [f"algorithm={args.algorithm}", f"rounds={args.rounds}", "eval.every=1000"]
    overrides += [f"output.out_dir={args.out_dir}", "output.checkpoint_every=1000"]
    if args.mbps != "preset":
        overrides.append(f"devices.server_rate={float(args.mbps) * 1e6 / 8}")
    start = time.perf_counter()
    rows = splitfl.run(CONFIG, overrides + args.overrides, progress=False).metrics
    batch = [sum(r["plan_batch_sizes"]) for r in rows if "plan_batch_sizes" in r]
    print(
        json.dumps(
            {
                "algorithm": args.algorithm,
                "ps_mbps": args.mbps,
                "overrides": args.overrides,
                "sim_time": rows[-1]["sim_time"],
                "mean_round": rows[-1]["sim_time"] / len(rows),
                "rounds_bound": sum(bound),
                "rounds": len(bound),
                "workers_per_round": sum(len(r["clients"]) for r in rows) / len(rows),
                "samples_per_iteration": sum(batch) / len(batch) if batch else None,
                "ingress_estimate_mbps": [
                    None
                    if r.get("plan_ingress_estimate") is None
                    else r["plan_ingress_estimate"] * 8 / 1e6
                    for r in rows
                ],
                "test_acc": rows[-1]["test_acc"],
                "wall_s": time.perf_counter() - start,
            }
        )
    )


if __name__ == "__main__":
    main()

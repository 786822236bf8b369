"""Calibrate ``jetson80``'s absolute worker speeds against MergeSFL §II's one printed time pair
(issue 50 item 1): "*SFL-BR* only takes 5,943s to achieve the target accuracy of around 65%,
while *SFL-T* takes 10,585s" (AlexNet, CIFAR-10, 10 workers), and "*SFL-BR* reduces the
average per-round waiting time by about 67%, compared to *SFL-T*".

SFL-T = MergeSFL without feature merging and batch regulation, SFL-BR = with batch
regulation only (both: τ = 30, batch 64, split after the 5th layer). Assumption: the two reach
~65 % in the same number of rounds (batch regulation keeps each round's total batch; feature
merging, which changes accuracy, is off in both), so the printed time ratio 1.78× is their
per-round time ratio. For each ``devices.flops_scale`` the script reports the clock's per-round
ratio and waiting reduction; the calibrated scale is the one closest to 1.78× (log distance).

    python benchmarks/papers/mergesfl/calibrate_speeds.py --rounds 20
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from timing_setups import _jetson  # noqa: E402
from timing_tables import run_cell, steady  # noqa: E402

PRINTED_RATIO = 10_585 / 5_943  # SFL-T / SFL-BR to ~65 % (§II)
PRINTED_WAITING = 0.67  # SFL-BR's waiting reduction against SFL-T (§II)
SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)
VARIANTS = {
    "SFL-T": {
        "options.mergesfl.feature_merging": False,
        "options.mergesfl.batch_regulation": False,
    },
    "SFL-BR": {"options.mergesfl.feature_merging": False},
}


def base(rounds: int) -> dict:
    """10 jetson80 workers (the 3:4:1 mix kept), AlexNet on CIFAR-10, IID over the workers."""
    cfg = _jetson("alexnet", "cifar10", 50_000, {"mergesfl": {"tau": 30, "cut": 5}}, rounds,
                  local_steps=30)  # fmt: skip
    cfg["data"]["num_clients"] = 10
    return cfg


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--scales", type=float, nargs="*", default=list(SCALES))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for scale in args.scales:
        stats = {
            name: steady(
                run_cell(base(args.rounds), {**over, "devices.flops_scale": scale}, "mergesfl")[
                    "rows"
                ],
                0,
            )
            for name, over in VARIANTS.items()
        }
        t, br = stats["SFL-T"], stats["SFL-BR"]
        row = {
            "scale": scale,
            "SFL-T s/round": t["round_time"],
            "SFL-BR s/round": br["round_time"],
            "ratio": t["round_time"] / br["round_time"],
            "waiting reduction": 1 - br["waiting"] / t["waiting"] if t["waiting"] else math.nan,
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
    best = min(rows, key=lambda r: abs(math.log(r["ratio"] / PRINTED_RATIO)))
    waiting = 100 * best["waiting reduction"]
    print(
        f"printed {PRINTED_RATIO:.2f}× (waiting −{100 * PRINTED_WAITING:.0f} %); closest: "
        f"×{best['scale']} with {best['ratio']:.2f}× (waiting −{waiting:.0f} %)"
    )
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "best": best}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""GPU correctness check of the vectorised executor (run on a machine with CUDA).

For every algorithm, two rounds of the tiny digits config run with the sequential executor on
CPU and with the vectorised executor on the GPU (vmap mode; also bf16), and the script prints
the largest parameter difference and both runs' final accuracy. fp32 differences come from
GPU kernels (cuDNN convolution algorithms, reduction orders), so the bound is looser than the
CPU test's 1e-5.

    pip install --no-deps -e . && python benchmarks/gpu_check.py [--tolerance 1e-4]

Exit code 1 if any fp32 difference exceeds the tolerance.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

import splitfl
from splitfl.algorithms import ALGORITHMS
from splitfl.testing import config_for

HARD = {"train.lr": 0.01, "train.momentum": 0.9, "train.weight_decay": 1e-4}


def final_state(cfg: dict, out: Path) -> tuple[dict, float]:
    res = splitfl.run(cfg, run_dir=out)
    return torch.load(out / "model.pt", weights_only=True), res.metrics[-1]["test_acc"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tolerance", type=float, default=1e-4)
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU visible; run this on the GPU machine")
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    worst = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for algorithm in sorted(ALGORITHMS):
            cpu = config_for(algorithm, rounds=2, **HARD)
            ref, acc_ref = final_state(cpu, root / f"{algorithm}-cpu")
            line = [f"{algorithm:14s} cpu acc {acc_ref:.4f}"]
            for precision in ("fp32", "bf16"):
                cfg = config_for(
                    algorithm,
                    rounds=2,
                    executor="vectorized",
                    device="cuda",
                    precision=precision,
                    **HARD,
                )
                got, acc = final_state(cfg, root / f"{algorithm}-{precision}")
                diff = max((ref[k].float() - got[k].float()).abs().max().item() for k in ref)
                if precision == "fp32":
                    worst = max(worst, diff)
                line.append(f"{precision}: max |Δθ| {diff:.2e} acc {acc:.4f}")
            print(" | ".join(line), flush=True)
    print(f"worst fp32 difference {worst:.2e} (tolerance {args.tolerance:.0e})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    raise SystemExit(main())

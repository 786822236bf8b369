"""FSHA (Pasquini et al., CCS 2021) by a malicious server against a splitfl device part on the
embedded digits, and the client's SplitGuard score against it and an honest server (issue 53).

Each row is one ``splitfl.privacy.fsha.run_fsha`` call: the hijacked run's reconstruction
(MSE, PSNR, SSIM of ``f̃⁻¹(f(x_priv))`` on 64 private samples) at each checkpoint, the
server's guesses without the attack (the public mean image, uniform noise), and both runs'
mean SplitGuard scores. Rows: the notebook's learning rates (``lr_f = lr_f̃ = 1e-5``,
``lr_D = 1e-4``, ``w = 500``) and raised ones (1e-3, ``w = 10``), the client-architecture and
the linear pilot, cuts 1 and 2 of ``cnn_digits``.

Run: ``nice -n 10 python benchmarks/privacy_fsha.py [--iterations 2000]
[--out benchmarks/results/privacy-fsha.json]`` (about 15 minutes on 2 busy cores); with
``--cifar /work/shared/data --out benchmarks/results/privacy-fsha-cifar.json`` the one
CIFAR-10 row instead.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from splitfl.privacy.fsha_run import FshaConfig, run_fsha
from splitfl.privacy.results import results_to_json

RAISED = {"lr_client": 1e-3, "lr_pilot": 1e-3, "lr_discriminator": 1e-3, "gradient_penalty": 10.0}
ROWS = {
    "notebook-lrs, client pilot, cut 1": {"pilot": "client", "cut": 1},
    "raised-lrs, client pilot, cut 1": {**RAISED, "pilot": "client", "cut": 1},
    "raised-lrs, linear pilot, cut 1": {**RAISED, "pilot": "linear", "cut": 1},
    "raised-lrs, client pilot, cut 2": {**RAISED, "pilot": "client", "cut": 2},
}
#: ``--cifar ROOT``: the CIFAR-10 subset (``/work/shared/data``) instead, ResNet-8 at cut 1
#: (conv, BatchNorm, ReLU: 16 × 32 × 32 features), batch 32, 16-channel server nets.
CIFAR = {
    "raised-lrs, client pilot, resnet8 cut 1": {
        **RAISED, "pilot": "client", "cut": 1, "model": "resnet8", "dataset": "cifar10",
        "batch_size": 32, "width": 16,
    },
}  # fmt: skip


def row(name: str, options: dict, iterations: int) -> dict:
    """One FSHA run and its honest control."""
    start = time.perf_counter()
    every = max(1, iterations // 4)
    spec = FshaConfig(
        **{"width": 32, **options, "iterations": iterations, "checkpoint_every": every}
    )
    result = run_fsha(spec)
    last = result["fsha"]["checkpoints"][-1]
    out = {
        "row": name, "options": options, "iterations": iterations,
        "checkpoints": result["fsha"]["checkpoints"], "baseline": result["baseline"],
        "splitguard_fsha": result["fsha"]["splitguard_mean"],
        "splitguard_honest": result["honest"]["splitguard_mean"],
        "fake_batches": result["fsha"]["fake_batches"],
        "honest_train_loss": result["honest"]["checkpoints"][-1]["train_loss"],
        "seconds": time.perf_counter() - start,
    }  # fmt: skip
    print(
        f"{name:36s} MSE {last['mse']:.4f} PSNR {last['psnr']:5.2f} dB SSIM {last['ssim']:.3f}"
        f"  (mean image MSE {result['baseline']['public_mean']['mse']:.4f})  SG fsha "
        f"{out['splitguard_fsha']:.3f} honest {out['splitguard_honest']:.3f}"
        f"  {out['seconds']:.0f} s",
        flush=True,
    )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--out", default="benchmarks/results/privacy-fsha.json")
    parser.add_argument("--cifar", metavar="ROOT", help="run the CIFAR-10 row on ROOT instead")
    args = parser.parse_args()
    torch.set_num_threads(1)
    table = {n: {**o, "root": args.cifar} for n, o in CIFAR.items()} if args.cifar else ROWS
    rows = [row(name, options, args.iterations) for name, options in table.items()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(results_to_json({"rows": rows}), indent=1, allow_nan=False)
    Path(args.out).write_text(text)


if __name__ == "__main__":
    main()

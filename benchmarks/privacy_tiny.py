"""A small privacy–utility table (issue 53; the grid with tuned attacks is ``splitfl privacy
eval``): algorithms × device-side defences on the embedded digits, each run attacked by the
curious server (``splitfl.privacy.attack_run``): UnSplit's PSNR/SSIM on a split run's victim,
label inference AUCs on a U-shaped run (also under the label defences max-norm and Marvell,
which only a U-shaped device applies); with the run's final accuracy and simulated time.

Run: ``python benchmarks/privacy_tiny.py [--rounds 3] [--out benchmarks/results/privacy-tiny.json]``
(a few minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import splitfl
from splitfl.privacy.on_run import RunAttack, attack_run
from splitfl.testing import config_for

ALGORITHMS = ("splitfed_v1", "s2fl", "ushaped_sl")
DEFENCES = {
    "none": {},
    "noise": {"train.defence.noise_std": 0.5, "train.defence.noise_clip": 20.0},
    "nopeek": {"train.defence.nopeek": 5.0},
}
LABEL_DEFENCES = {  # U-shaped only: the head's gradients are what they perturb
    "max_norm": {"train.defence.label_noise": "max_norm"},
    "marvell": {"train.defence.label_noise": "marvell", "train.defence.marvell_s": 4.0},
}


def defences_of(algorithm: str) -> dict[str, dict]:
    """The defences a run of ``algorithm`` can take."""
    return {**DEFENCES, **LABEL_DEFENCES} if algorithm == "ushaped_sl" else DEFENCES


def cell(algorithm: str, defence: str, rounds: int, base: Path) -> dict:
    """One run and its attack."""
    run_dir = base / f"{algorithm}-{defence}"
    run = splitfl.run(
        config_for(algorithm, rounds=rounds, **defences_of(algorithm)[defence]), run_dir=run_dir
    )
    last = run.metrics[-1]
    row = {"algorithm": algorithm, "defence": defence, "test_acc": last["test_acc"]}
    row["sim_time"] = last["sim_time"]
    if algorithm == "ushaped_sl":
        attack = attack_run(RunAttack(str(run_dir), "labels", samples=64))
        row.update(auc_norm=attack["auc_norm"], auc_direction=attack["auc_direction"])
    else:
        attack = attack_run(RunAttack(str(run_dir), "unsplit", samples=8, iterations=150))
        row.update(psnr=attack["psnr"], ssim=attack["ssim"])
    row.update(client=attack["client"], cut=attack["cut"])
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/privacy-tiny.json")
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="privacy-tiny-"))
    rows = [cell(a, d, args.rounds, base) for a in ALGORITHMS for d in defences_of(a)]
    for r in rows:
        attack = (
            f"AUC norm {r['auc_norm']:.3f} direction {r['auc_direction']:.3f}"
            if "auc_norm" in r
            else f"UnSplit PSNR {r['psnr']:.2f} dB SSIM {r['ssim']:.3f}"
        )
        print(
            f"{r['algorithm']:12s} {r['defence']:8s} cut {r['cut']} acc {r['test_acc']:.3f} "
            f"sim {r['sim_time']:.3f} s  {attack}"
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1, allow_nan=False))


if __name__ == "__main__":
    main()

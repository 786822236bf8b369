"""splitfl as a peer runner (``bench_peers.py``): ``python peer_splitfl.py DATA [--no-plots]``.

The workload's tensors reach splitfl through the extension API: :func:`load_bundle` is the
dataset (``data.dataset: peer_splitfl:load_bundle``, a ``DatasetBundle`` whose writer ids are
the clients, ``partition: natural``) and :func:`peer_workload.build_model` the model. FedAvg,
the sequential executor, every default a user gets (metrics rows, the simulated clock,
checkpoints every 10 rounds, the plots and summary at the end; the run directory is
``$PEERS_OUT.run``, kept for the launcher, which waits for the plots that a background
process draws after the run, ``plots_ready_s``). Round times are the
differences of the rows' ``wall_time`` (and of the CPU time read with them); the rounds
start when splitfl's round loop does.
"""

from __future__ import annotations

import os
import sys
import time
from importlib.metadata import version
from pathlib import Path

import torch
from peer_workload import (
    BATCH,
    LR,
    NUM_CLIENTS,
    OUT_ENV,
    PER_ROUND,
    ROUNDS,
    SEED,
    Report,
    read_workload,
    save_final,
)

import splitfl
import splitfl.experiment.loop as loop
import splitfl.experiment.round_step as round_step
from splitfl.data.base import ArrayDataset, DatasetBundle


def load_bundle(root: Path) -> DatasetBundle:
    """The workload's tensors as a splitfl dataset (writer id = client)."""
    w = read_workload(root)
    return DatasetBundle(
        "peers_digits",
        ArrayDataset(w.x, w.y, w.writers),
        ArrayDataset(w.x_test, w.y_test),
        10,
        tuple(w.x.shape[1:]),
    )


def config(folder: Path, out_dir: str, plots: bool = True) -> dict:
    """The run's config: the workload, FedAvg, defaults elsewhere (``plots=False``:
    ``output.plots: false``, to measure what the end-of-run plots cost)."""
    return {
        "algorithm": "fedavg",
        "model": "peer_workload:build_model",
        "seed": SEED,
        "threads": 1,
        "rounds": ROUNDS,
        "data": {
            "dataset": "peer_splitfl:load_bundle",
            "root": str(folder),
            "partition": "natural",
            "num_clients": NUM_CLIENTS,
            "min_samples": 1,
        },
        "train": {"clients_per_round": PER_ROUND, "batch_size": BATCH, "lr": LR, "local_epochs": 1},
        "eval": {"every": 1},
        "output": {"progress": False, "out_dir": out_dir, "plots": plots},
    }


class Clock:
    """splitfl's round clock (``time`` in its round loop): wall time as usual, and this
    process's CPU time at the same instants (a round's ``wall_time`` is read once a round)."""

    def __init__(self):
        self.cpu: list[float] = []

    def perf_counter(self) -> float:
        self.cpu.append(time.process_time())
        return time.perf_counter()


def main(folder: Path, plots: bool = True) -> None:
    """Run splitfl on the workload and report its rounds."""
    report = Report("splitfl", version("splitfl"))
    play = loop._play_rounds
    ends: list[float] = []
    loop.time = round_step.time = clock = Clock()

    def timed(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        report.rounds_begin()
        try:
            return play(*args, **kwargs)
        finally:
            ends.append(time.time())

    loop._play_rounds = timed
    run_dir = Path(os.environ[OUT_ENV] + ".run")  # kept: the launcher waits for its plots
    result = splitfl.run(config(folder, str(run_dir.parent), plots), run_dir=run_dir)
    walls = [row["wall_time"] for row in result.metrics]
    report.round_s = [b - a for a, b in zip([0.0, *walls], walls, strict=False)]
    report.round_cpu_s = [b - a for a, b in zip(clock.cpu, clock.cpu[1:], strict=False)]
    report.acc = [row["test_acc"] for row in result.metrics]
    save_final(torch.load(result.run_dir / "model.pt", weights_only=True))
    report.write(ends[0])


if __name__ == "__main__":
    main(Path(sys.argv[1]), plots="--no-plots" not in sys.argv[2:])

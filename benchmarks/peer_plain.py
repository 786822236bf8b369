"""The lean plain loop as a peer runner (``bench_peers.py``): ``python peer_plain.py DATA``.

Imports torch and numpy only; the rounds are :func:`plain_loop.fedavg_rounds` on the
workload's schedule.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
from peer_workload import LR, ROUNDS, Report, build_model, read_workload, save_final
from plain_loop import fedavg_rounds


def main(folder: Path) -> None:
    """Set up, play the rounds, report."""
    torch.set_num_threads(1)
    w = read_workload(folder)
    model = build_model()
    report = Report("plain loop", torch.__version__)
    report.rounds_begin()
    _, state, _ = fedavg_rounds(
        model,
        (w.x, w.y),
        (w.x_test, w.y_test),
        w.client_rounds,
        ROUNDS,
        LR,
        after_round=report.round_end,
    )
    end = time.time()
    save_final(state)
    report.write(end)


if __name__ == "__main__":
    main(Path(sys.argv[1]))

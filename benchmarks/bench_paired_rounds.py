"""splitfl's round against the lean loop's, alternated in one process: issue 39's workload
(:mod:`peer_workload`), each splitfl round (``play_round`` and its metrics row) followed by the
plain loop's round on the same clients and mini-batches (:func:`plain_loop.train_round` and
its evaluation), both timed by the CPU time of this thread. Alternating round by round in one
process cancels the drift of a shared machine and process-to-process differences that
``bench_peers.py``'s separate processes see; it leaves out what happens between rounds (the
checkpoints) and at start and end.

    python benchmarks/bench_paired_rounds.py --repeats 5

Prints the median of the per-round ratios (rounds after :data:`peer_workload.WARM` of the
first pass over the workload's 30 rounds, then every round of the later passes) and each
side's median round.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import tempfile
import time
from pathlib import Path

import bench_peers
import peer_splitfl
import torch
from peer_workload import LR, ROUNDS, WARM, build_model, read_workload
from plain_loop import evaluate, train_round

from splitfl.experiment.loop import start_state, thread_limits
from splitfl.experiment.round_step import play_round
from splitfl.experiment.runner import as_config, prepare
from splitfl.experiment.runtimes import build_runtime
from splitfl.training import import_optimizers


def paired_rounds(folder: Path, run_dir: Path, repeats: int) -> tuple[list[float], list[float]]:
    """Each side's CPU seconds per round, alternated: splitfl's round ``r``, then the loop's."""
    w = read_workload(folder)
    run_dir.mkdir(parents=True, exist_ok=True)
    prep = prepare(as_config(peer_splitfl.config(folder, str(run_dir))))
    executor = build_runtime(prep.config, "cpu")
    st, rec = start_state(prep, None, prep.ctx.model, run_dir, True)
    model = build_model()
    local, state = copy.deepcopy(model), {k: v.clone() for k, v in model.state_dict().items()}
    ours, plain = [], []
    with thread_limits(1):
        for rep in range(repeats):
            for r in range(ROUNDS):
                start = time.thread_time()
                rec.record(play_round(prep, executor, st, r, prep.ctx.model, 0.0))
                middle = time.thread_time()
                state = train_round(local, state, w.x, w.y, w.client_rounds(r), LR)
                model.load_state_dict(state)
                evaluate(model, w.x_test, w.y_test)
                if rep or r >= WARM:
                    ours.append(middle - start)
                    plain.append(time.thread_time() - middle)
    return ours, plain


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5, help="passes over the workload's rounds")
    args = p.parse_args()
    torch.set_num_threads(1)
    import_optimizers()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "data"
        bench_peers.prepare(folder)
        ours, plain = paired_rounds(folder, Path(tmp) / "run", args.repeats)
    ratios = sorted(a / b for a, b in zip(ours, plain, strict=True))
    q = len(ratios) // 4
    print(
        f"{len(ratios)} paired rounds: splitfl {1000 * statistics.median(ours):.2f} ms, "
        f"plain loop {1000 * statistics.median(plain):.2f} ms (CPU); per-round ratio median "
        f"{statistics.median(ratios):.3f} (quartiles {ratios[q]:.3f}, {ratios[-q - 1]:.3f})"
    )


if __name__ == "__main__":
    main()

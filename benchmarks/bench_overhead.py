"""Framework overhead: splitfl's FedAvg round against a plain PyTorch loop doing the same work.

The peer workload (issue 25): scikit-learn digits, 100 clients (Dirichlet 0.5), 10 per round,
batch 16, one local epoch, ``cnn_digits``, SGD lr 0.05, one thread, the test split evaluated
every round. The plain loop uses splitfl only to set up (data, partition, model builder) and
then does by hand what a FedAvg round is: the same client selection, the same mini-batches
(the same seeded streams), SGD, the |D_i|-weighted average, the test evaluation. Its final
model is checked against splitfl's (same work, not just the same amount of work).

Each repeat runs splitfl then the plain loop (interleaved, so drift of a shared machine hits
both); the figure is the median over repeats of each side's median steady-state round (rounds
after ``--warm``). splitfl's round is the difference of consecutive ``wall_time`` values in
``metrics.jsonl`` (select, plan, execute, cost model, aggregate, evaluate, record).

    python benchmarks/bench_overhead.py --repeats 3 --rounds 40 --json benchmarks/results/x.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
import types
from pathlib import Path

import torch
from plain_loop import fedavg_rounds

CONFIG = {
    "algorithm": "fedavg",
    "model": "cnn_digits",
    "seed": 0,
    "threads": 1,
    "data": {
        "dataset": "digits",
        "partition": "dirichlet",
        "alpha": 0.5,
        "num_clients": 100,
        "min_samples": 8,
    },
    "devices": {"preset": "s2fl_table1"},
    "train": {"clients_per_round": 10, "batch_size": 16, "lr": 0.05, "local_epochs": 1},
    "eval": {"every": 1},
    "output": {"progress": False, "checkpoint_every": 10},
}

#: What a round's time is read from: wall time, or this process's CPU time (``--clock cpu``:
#: less sensitive to other processes on a shared machine; equal to wall time on an idle one,
#: as both sides run single-threaded).
CLOCK = [time.perf_counter]


def splitfl_rounds(rounds: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Per-round times of a splitfl run (:data:`CLOCK`) and its final model."""
    import splitfl
    import splitfl.experiment.loop as loop
    import splitfl.experiment.round_step as round_step

    # the run's ``wall_time`` read from the benchmark's clock (the CPU time with --clock cpu)
    loop.time = round_step.time = types.SimpleNamespace(perf_counter=CLOCK[0])

    with tempfile.TemporaryDirectory() as tmp:
        config = {**CONFIG, "rounds": rounds, "output": {**CONFIG["output"], "out_dir": tmp}}
        result = splitfl.run(config, run_dir=Path(tmp) / "run")
        walls = [row["wall_time"] for row in result.metrics]
        state = torch.load(result.run_dir / "model.pt", weights_only=True)
    return [b - a for a, b in zip([0.0, *walls], walls, strict=False)], state


def plain_rounds(rounds: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """The same FedAvg rounds as the plain PyTorch loop (:mod:`plain_loop`; set-up, selection
    and mini-batches from splitfl's seeded streams, the rounds by hand)."""
    from splitfl.core.seeding import derive_seed, rng_for
    from splitfl.data.base import load_dataset
    from splitfl.data.clients import client_partition
    from splitfl.experiment.runner import as_config
    from splitfl.models import build_model
    from splitfl.roles.common import client_batches

    config = as_config({**CONFIG, "rounds": rounds})
    torch.set_num_threads(1)
    bundle = load_dataset("digits")
    parts = client_partition(config, bundle)
    torch.manual_seed(config.seed)
    model = build_model("cnn_digits", bundle.input_shape, bundle.num_classes)
    t = config.train

    def schedule(r: int) -> list[tuple[int, list[torch.Tensor]]]:
        chosen = sorted(
            int(c) for c in rng_for(config.seed, "select", r).choice(100, 10, replace=False)
        )
        round_seed = derive_seed(config.seed, "b", r)
        steps = [-(-len(parts[c]) // t.batch_size) for c in chosen]
        return [
            (len(parts[c]), client_batches(parts[c], t.batch_size, s, derive_seed(round_seed, c)))
            for c, s in zip(chosen, steps, strict=True)
        ]

    times, state, _ = fedavg_rounds(
        model,
        (bundle.train.x, bundle.train.y),
        (bundle.test.x, bundle.test.y),
        schedule,
        rounds,
        t.lr,
        clock=CLOCK[0],
        before_round=lambda r: torch.manual_seed(derive_seed(config.seed, "torch", r)),
    )
    return times, state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--warm", type=int, default=5, help="rounds left out of each median")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json", type=Path, help="write the raw figures here")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    args = p.parse_args()
    CLOCK[0] = time.process_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(1)
    ours, plain, max_diff = [], [], 0.0
    for rep in range(args.repeats):
        a, state_a = splitfl_rounds(args.rounds)
        b, state_b = plain_rounds(args.rounds)
        max_diff = max(max_diff, max(float((state_a[k] - state_b[k]).abs().max()) for k in state_b))
        ours.append(statistics.median(a[args.warm :]))
        plain.append(statistics.median(b[args.warm :]))
        print(
            f"repeat {rep}: splitfl {ours[-1] * 1e3:.1f} ms/round, plain {plain[-1] * 1e3:.1f} "
            f"ms/round, ratio {ours[-1] / plain[-1]:.2f}",
            flush=True,
        )
    ratios = [a / b for a, b in zip(ours, plain, strict=True)]
    out = {
        "workload": CONFIG,
        "rounds": args.rounds,
        "warm": args.warm,
        "clock": args.clock,
        "splitfl_round_s": ours,
        "plain_round_s": plain,
        "ratio_per_repeat": ratios,
        "ratio_median": statistics.median(ratios),
        "final_model_max_abs_diff": max_diff,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    print(
        f"median ratio splitfl / plain: {out['ratio_median']:.2f} "
        f"(final models differ by at most {max_diff:.2e})"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()

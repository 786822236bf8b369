"""Executor benchmark: sequential reference vs vectorised clients, per workload.

For each workload and executor it runs the algorithm's real loop (select → plan → execute →
cost → observe → aggregate) for ``--warmup`` rounds, then times one more round's execution
and reports

* client-iterations/s — client mini-batch steps executed per wall-clock second,
* achieved TFLOP/s — forward+backward FLOPs of the samples processed, from the cost model's
  measured per-block FLOPs (``splitfl.models.profile``), over the same time,
* peak memory — CUDA ``max_memory_allocated`` on a GPU; peak resident set size of the
  measuring process on CPU (each measurement runs in its own process),
* the speed-up of each executor over ``sequential`` measured in the same invocation.

Usage::

    python benchmarks/bench_executors.py                       # every workload, CPU
    python benchmarks/bench_executors.py --device cuda --precision fp32 bf16
    python benchmarks/bench_executors.py --workloads resnet8-sfl-10 --steps 3
    python benchmarks/bench_executors.py --executors sequential,vectorized:rows,vectorized:vmap

Data: ``synthetic_cifar`` (generated CIFAR-shaped images; no files needed). Results are
printed as a Markdown table and written as JSON to ``--out``.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

import torch

from splitfl.config import resolve_device, set_dotted
from splitfl.core.seeding import derive_seed, rng_for
from splitfl.executors.vectorized import VectorizedExecutor
from splitfl.experiment.round_step import measure as clock_measure
from splitfl.experiment.runner import as_config, prepare
from splitfl.experiment.runtimes import build_runtime

#: name → (algorithm, model, registered clients, clients per round, batch, extra overrides)
WORKLOADS: dict[str, tuple[str, str, int, int, int, dict]] = {
    "resnet8-sfl-10": ("splitfed_v1", "resnet8", 100, 10, 128, {}),
    "resnet8-sfl-100": ("splitfed_v1", "resnet8", 100, 100, 128, {}),
    "resnet8-s2fl-10": ("s2fl", "resnet8", 100, 10, 128, {}),
    "resnet8-s2fl-100": ("s2fl", "resnet8", 100, 100, 128, {}),
    "vgg16-sfl-10": ("splitfed_v1", "vgg16_cifar", 100, 10, 128, {}),
    "mergesfl-unequal-10": (
        "mergesfl",
        "resnet8",
        100,
        10,
        64,
        {"options.mergesfl.batch_regulation": True},
    ),
    "resnet8-sfl-10k-registered": ("splitfed_v1", "resnet8", 10_000, 100, 128, {}),
    # issue 54 item 4: K = 10 / 50 / 100 on the quickstart CNN (digits) and ResNet-8 at batch 32
    **{
        f"cnn-digits-sfl-{k}": ("splitfed_v1", "cnn_digits", 100, k, 16, {"data.dataset": "digits"})
        for k in (10, 50, 100)
    },
    **{f"resnet8-b32-sfl-{k}": ("splitfed_v1", "resnet8", 100, k, 32, {}) for k in (10, 50, 100)},
}


def workload_config(name: str, executor: str, args) -> dict:
    algorithm, model, registered, per_round, batch, extra = WORKLOADS[name]
    cfg = {
        "algorithm": algorithm,
        "model": model,
        "rounds": args.warmup + 1,
        "seed": 0,
        "executor": executor,
        "device": args.device,
        "precision": args.precision_one,
        "threads": args.threads,
        "data": {
            "dataset": "synthetic_cifar",
            "partition": "iid",
            "num_clients": registered,
            "min_samples": 1,
        },
        "train": {
            "clients_per_round": per_round,
            "batch_size": batch,
            "local_steps": args.steps,
            "lr": 0.01,
            "momentum": 0.9,
        },
        "output": {"progress": False},
    }
    if algorithm == "mergesfl":
        extra = {**extra, "options.mergesfl.tau": args.steps}
    for key, value in extra.items():
        set_dotted(cfg, key.split("."), value)
    return cfg


def measure(name: str, executor: str, args) -> dict:
    """Run the workload's loop in this process and time its last round's execution."""
    engine, _, mode = executor.partition(":")  # vectorized:rows / vectorized:vmap force a mode
    cfg = as_config(workload_config(name, engine, args))
    prep = prepare(cfg)
    ctx, algorithm = prep.ctx, prep.algorithm
    device = resolve_device(cfg.device)
    ex = build_runtime(cfg, device)
    if mode:
        ex = VectorizedExecutor(device, cfg.precision, cfg.channels_last, use_vmap=mode == "vmap")
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    cuda = device.startswith("cuda")
    for r in range(cfg.rounds):
        torch.manual_seed(derive_seed(cfg.seed, "torch", r))
        clients = algorithm.select_clients(r, rng_for(cfg.seed, "select", r))
        plan = algorithm.plan_round(r, clients, rng_for(cfg.seed, "plan", r))
        timed = r == cfg.rounds - 1
        if timed and cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        result = ex.run_round(ctx, state, plan, derive_seed(cfg.seed, "b", r))
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        report, _ = clock_measure(cfg, algorithm, plan, result, r)
        algorithm.observe(r, plan, report)
        state = algorithm.aggregate(state, plan, result)
    iterations = sum(t.steps for t in plan.tasks)
    samples = sum(u.samples for u in result.updates)
    flops = samples * ctx.profile.total_flops
    peak = (
        torch.cuda.max_memory_allocated() / 2**20
        if cuda
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    return {
        "workload": name,
        "executor": executor,
        "precision": cfg.precision,
        "clients": len(plan.tasks),
        "batch_sizes": sorted({t.batch_size for t in plan.tasks}),
        "cuts": sorted({t.cut for t in plan.tasks}),
        "iterations": iterations,
        "samples": samples,
        "seconds": seconds,
        "iters_per_s": iterations / seconds,
        "tflops": flops / seconds / 1e12,
        "peak_mib": peak,
        "fallbacks": getattr(ex, "fallbacks", 0),
        "train_loss": result.train_loss,
    }


def run_child(name: str, executor: str, precision: str, args) -> dict:
    """One measurement in a fresh process (clean peak-memory figure)."""
    cmd = [
        sys.executable,
        __file__,
        "--child",
        name,
        executor,
        "--device",
        args.device,
        "--precision",
        precision,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        *(["--threads", str(args.threads)] if args.threads else []),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {
            "workload": name,
            "executor": executor,
            "precision": precision,
            "error": out.stderr.strip().splitlines()[-1] if out.stderr else "failed",
        }
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(rows: list[dict]) -> str:
    head = (
        "| workload | executor | precision | clients | iters/s | TFLOP/s | peak MiB "
        "| speed-up | loss |\n|---|---|---|---:|---:|---:|---:|---:|---:|"
    )
    base = {  # each speed-up against the sequential run of the same repeat
        (r["workload"], r["precision"], r.get("repeat")): r["iters_per_s"]
        for r in rows
        if r.get("executor") == "sequential" and "error" not in r
    }
    lines = [head]
    for r in rows:
        if "error" in r:
            lines.append(
                f"| {r['workload']} | {r['executor']} | {r['precision']} | "
                f"error: {r['error']} | | | | | |"
            )
            continue
        ref = base.get((r["workload"], r["precision"], r.get("repeat")))
        speed = f"{r['iters_per_s'] / ref:.2f}×" if ref else "—"
        lines.append(
            f"| {r['workload']} | {r['executor']} | {r['precision']} | {r['clients']} "
            f"| {r['iters_per_s']:.1f} | {r['tflops']:.4f} | {r['peak_mib']:.0f} | {speed} "
            f"| {r['train_loss']:.4f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default=",".join(WORKLOADS))
    p.add_argument("--executors", default="sequential,vectorized")
    p.add_argument("--device", default="cpu")
    p.add_argument("--precision", nargs="+", default=["fp32"])
    p.add_argument("--steps", type=int, default=2, help="local steps per client in a round")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds before the timed one")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="measure every (workload, executor) this many times, interleaved: each repeat "
        "runs the workload's executors in turn, in an order rotated by one each repeat",
    )
    p.add_argument("--out", default=None, help="JSON results file")
    p.add_argument("--child", nargs=2, metavar=("WORKLOAD", "EXECUTOR"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        args.precision_one = args.precision[0]
        print(json.dumps(measure(*args.child, args)))
        return
    rows = []
    executors = args.executors.split(",")
    for rep in range(args.repeats):
        for name in args.workloads.split(","):
            for precision in args.precision:
                turn = rep % len(executors)
                for executor in executors[turn:] + executors[:turn]:
                    row = {**run_child(name, executor, precision, args), "repeat": rep}
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor()
    header = (
        f"device: {args.device} ({gpu or platform.machine()}), torch {torch.__version__}, "
        f"{date.today()}, {args.steps} local steps/client, {args.warmup} warm-up round(s), "
        f"threads {args.threads or 'all'}, {args.repeats} repeat(s)"
    )
    print(header)
    print(table(rows))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"header": header, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()

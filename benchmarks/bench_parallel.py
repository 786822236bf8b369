"""Parallel executor benchmark: sequential vs ``executor: parallel`` with 1 and 2 workers.

For SplitFed V1 (10 clients per round = 10 units) and S²FL (20 clients in groups of 2 = 10
units), LeNet-5 on generated CIFAR-shaped images (``synthetic_cifar``; no files needed), it
runs ``splitfl run`` end to end once per executor, each in a fresh process (clean peak
memory), interleaving the executors ``--repeats`` times, and reports

* that the final models are identical (asserted: every tensor bit for bit),
* the steady-state round time (median over rounds 2…R of the wall time per round) and the
  speed-up over sequential,
* peak resident memory of the driver and of each worker,
* the inputs of the projection in ``benchmarks/README.md``: units per round U, per-unit
  training time on a worker t_u, the driver's serial time per round S = T_seq − U·t_u, bytes
  sent to and from the workers per round, the global model's size, and the driver's
  effective transfer rate κ (bytes per second of round time not spent training units, with
  one worker).

Usage::

    python benchmarks/bench_parallel.py                     # 4 rounds, 1 repeat, local workers
    python benchmarks/bench_parallel.py --rounds 6 --repeats 3 --backend ray
    python benchmarks/bench_parallel.py --algorithms splitfed_v1 --workers 1,2,4
    python benchmarks/bench_parallel.py --device cuda --gpus-per-worker 0.5 --workers 1,2,8

Raw results go to ``benchmarks/results/parallel-<date>.json`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

import torch

import splitfl
from splitfl.config import set_dotted
from splitfl.executors.workers import peak_rss
from splitfl.experiment import loop

#: algorithm → overrides giving 10 units per round.
WORKLOADS: dict[str, dict] = {
    "splitfed_v1": {"train.clients_per_round": 10},
    "s2fl": {
        "train.clients_per_round": 20,
        "options.s2fl.group_size": 2,
        "options.s2fl.warmup_all_devices": False,  # every round 20 clients, not all 100
    },
}


def config(algorithm: str, executor: str, workers: int, args) -> dict:
    cfg: dict = {
        "algorithm": algorithm,
        "model": "lenet5",
        "rounds": args.rounds,
        "seed": 0,
        "executor": executor,
        "data": {"dataset": "synthetic_cifar", "partition": "iid", "num_clients": 100},
        "train": {"batch_size": 32, "lr": 0.01, "local_steps": args.steps},
        "eval": {"every": args.rounds},
        "output": {"progress": False, "checkpoint_every": args.rounds},
        "device": args.device,
        "parallel": {
            "workers": max(workers, 1),
            "backend": args.backend,
            "gpus_per_worker": args.gpus_per_worker,
        },
    }
    for key, value in WORKLOADS[algorithm].items():
        set_dotted(cfg, key.split("."), value)
    return cfg


def measure(algorithm: str, executor: str, workers: int, run_dir: str, args) -> dict:
    """One run in this (fresh) process; the executor's counters are read off the instance
    the loop builds."""
    built = []
    original = loop.build_runtime

    def capture(*a, **k):
        built.append(original(*a, **k))
        return built[-1]

    loop.build_runtime = capture
    res = splitfl.run(config(algorithm, executor, workers, args), run_dir=run_dir)
    walls = [r["wall_time"] for r in res.metrics]
    rounds = [b - a for a, b in zip([0.0, *walls], walls, strict=False)]
    state = torch.load(Path(run_dir) / "model.pt", weights_only=True)
    row = {
        "algorithm": algorithm,
        "executor": executor,
        "workers": workers if executor == "parallel" else 0,
        "round_s": rounds,
        "steady_round_s": statistics.median(rounds[1:] or rounds),
        "driver_peak_rss": peak_rss(),
        "model_bytes": sum(t.numel() * t.element_size() for t in state.values()),
        "units_per_round": statistics.median(len(set(r["groups"])) for r in res.metrics),
        "model": str(Path(run_dir) / "model.pt"),
    }
    stats = getattr(built[0], "stats", None)
    if stats is not None:
        row["stats"] = {**stats, "worker_peak_rss": list(stats["worker_peak_rss"].values())}
    return row


def run_child(algorithm: str, executor: str, workers: int, folder: Path, args) -> dict:
    run_dir = folder / f"{algorithm}-{executor}-{workers}-{len(list(folder.iterdir()))}"
    cmd = [sys.executable, __file__, "--child", algorithm, executor, str(workers), str(run_dir)]
    cmd += ["--rounds", str(args.rounds), "--steps", str(args.steps), "--backend", args.backend]
    cmd += ["--device", args.device, "--gpus-per-worker", str(args.gpus_per_worker)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise SystemExit(f"{algorithm}/{executor}/{workers} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def projection_inputs(seq: dict, one: dict, rounds: int) -> dict:
    """U, t_u, S, bytes per round, κ (see benchmarks/README.md, "Parallel executor")."""
    st = one["stats"]
    units = seq["units_per_round"]
    t_u = statistics.median(st["unit_seconds"])
    serial = seq["steady_round_s"] - units * t_u
    to_w = st["bytes_to_workers"]["units"] / rounds
    from_w = st["bytes_from_workers"] / rounds
    overhead = one["steady_round_s"] - serial - units * t_u
    return {
        "U": units,
        "t_u_s": t_u,
        "S_s": serial,
        "bytes_to_workers_per_round": to_w,
        "bytes_from_workers_per_round": from_w,
        "model_bytes": seq["model_bytes"],
        "data_bytes_at_start": st["bytes_to_workers"]["data"],
        "kappa_bytes_per_s": (to_w + from_w) / overhead if overhead > 0 else None,
    }


def project(inp: dict, n: int, t_u: float | None = None) -> float:
    """T_N = S + ceil(U/N)·t_u + B_N/κ, B_N = B_1 + (N−1)·model (pessimistic: no overlap of
    the driver's transfers with training)."""
    t_u = inp["t_u_s"] if t_u is None else t_u
    b = inp["bytes_to_workers_per_round"] + inp["bytes_from_workers_per_round"]
    b += (n - 1) * inp["model_bytes"]
    comm = b / inp["kappa_bytes_per_s"] if inp["kappa_bytes_per_s"] else 0.0
    return inp["S_s"] + -(-inp["U"] // n) * t_u + comm


def summarize(rows: list[dict], args) -> dict:
    out = {}
    for alg in args.algorithms.split(","):
        mine = [r for r in rows if r["algorithm"] == alg]
        seq = [r for r in mine if r["executor"] == "sequential"]
        ref = torch.load(seq[0]["model"], weights_only=True)
        for r in mine:
            got = torch.load(r["model"], weights_only=True)
            assert all(torch.equal(ref[k], got[k]) for k in ref), f"{alg}: {r['executor']} differs"
        t_seq = statistics.median(r["steady_round_s"] for r in seq)
        summary = {"identical_final_models": True, "sequential_round_s": t_seq}
        for w in sorted({r["workers"] for r in mine if r["workers"]}):
            par = [r for r in mine if r["workers"] == w]
            t = statistics.median(r["steady_round_s"] for r in par)
            rss = max(max(r["stats"]["worker_peak_rss"]) for r in par)
            summary[f"workers_{w}"] = {
                "round_s": t,
                "speedup": t_seq / t,
                "worker_peak_rss_mib": rss / 2**20,
                "driver_peak_rss_mib": max(r["driver_peak_rss"] for r in par) / 2**20,
            }
        summary["sequential_peak_rss_mib"] = max(r["driver_peak_rss"] for r in seq) / 2**20
        one = [r for r in mine if r["workers"] == 1]
        if one:
            inp = projection_inputs(seq[0] | {"steady_round_s": t_seq}, one[0], args.rounds)
            summary["projection_inputs"] = inp
            summary["projected_speedup"] = {n: t_seq / project(inp, n) for n in (2, 4, 8)}
        out[alg] = summary
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--algorithms", default=",".join(WORKLOADS))
    p.add_argument("--workers", default="1,2")
    p.add_argument("--backend", default="local", choices=["local", "ray"])
    p.add_argument("--device", default="cpu", help="cpu or cuda (driver and workers)")
    p.add_argument("--gpus-per-worker", type=float, default=0.0)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--steps", type=int, default=5, help="local steps per client per round")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", default=f"benchmarks/results/parallel-{date.today()}.json")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        alg, executor, workers, run_dir = args.child
        print(json.dumps(measure(alg, executor, int(workers), run_dir, args)))
        return
    rows = []
    runs = [("sequential", 0)] + [("parallel", int(w)) for w in args.workers.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.repeats):
            for alg in args.algorithms.split(","):
                for executor, workers in runs:
                    row = run_child(alg, executor, workers, Path(tmp), args)
                    rows.append(row)
                    print(
                        f"{alg:12s} {executor:10s} w={workers} {row['steady_round_s']:.3f} s/round"
                    )
        summary = summarize(rows, args)
    header = {
        "machine": f"{platform.machine()} {platform.processor()}, {torch.get_num_threads()} "
        f"torch threads available, torch {torch.__version__}",
        "date": str(date.today()),
        "rounds": args.rounds,
        "steps": args.steps,
        "repeats": args.repeats,
        "backend": args.backend,
        "device": args.device,
        "gpus_per_worker": args.gpus_per_worker,
    }
    print(json.dumps(summary, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"header": header, "summary": summary, "rows": rows}))


if __name__ == "__main__":
    main()

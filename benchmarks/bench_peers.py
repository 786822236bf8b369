"""Per-round overhead against peer frameworks: a lean plain PyTorch loop, splitfl,
pfl-research and Flower's simulation on one workload (:mod:`peer_workload`), each in its own
process (and the peers in their own virtual environments, ``benchmarks/.venvs/<name>``).

The workload file (the digits tensors, the Dirichlet partition as writer ids, every round's
clients and shuffle seeds from splitfl's seeded streams) is written once; every runner reads
it and builds the model with :func:`peer_workload.build_model` (seeded weights), so all
train the same clients on the same mini-batches from the same weights. Runs are interleaved
(plain, splitfl, pfl, flwr, then again) ``--repeats`` times. Per run: the median steady-
state round (rounds after :data:`peer_workload.WARM`), the 30 rounds' wall time, the set-up
(launch to round 1), the whole process (launch to exit), for splitfl the time until its
end-of-run plots exist (``plots_ready_s``), the peak resident memory of the
process tree, and the CPU that other processes used meanwhile (``/proc/stat`` less the
tree's own: a run with more than ``--dirty`` cores of it is flagged). Accuracy per round and
the final model are compared with the plain loop's.

    python benchmarks/bench_peers.py --repeats 3 --json benchmarks/results/peers-<date>.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch
from peer_workload import (
    BATCH,
    LAUNCH_ENV,
    NUM_CLIENTS,
    OUT_ENV,
    PER_ROUND,
    ROUNDS,
    SEED,
    WARM,
    read_workload,
    write_workload,
)

import splitfl
from splitfl.core.seeding import derive_seed, rng_for
from splitfl.data.base import load_dataset
from splitfl.data.clients import client_partition
from splitfl.experiment.runner import as_config
from splitfl.roles.common import client_batches

HERE = Path(__file__).resolve().parent
VENVS = HERE / ".venvs"
#: framework → (runner script, python: None = this interpreter, else the venv's name)
RUNNERS = {
    "plain": ("peer_plain.py", None),
    "splitfl": ("peer_splitfl.py", None),
    "pfl": ("peer_pfl.py", "pfl"),
    "flwr": ("peer_flwr.py", "flwr"),
    # ``--splitfl-before SRC``: splitfl from another source tree (the code before a change)
    "splitfl_before": ("peer_splitfl.py", None),
    # splitfl with ``output.plots: false`` (what the end-of-run plots cost the whole process)
    "splitfl_noplots": ("peer_splitfl.py", None),
}
#: runner arguments after the workload folder
RUNNER_ARGS = {"splitfl_noplots": ["--no-plots"]}


def prepare(folder: Path) -> Path:
    """Write the workload file: splitfl's digits, its Dirichlet(0.5) partition of 100 clients
    (``min_samples`` 8) as writer ids, and each round's clients and the seeds of their
    shuffles, drawn as splitfl's FedAvg draws them (checked: the same mini-batches)."""
    data = {"dataset": "digits", "partition": "dirichlet", "alpha": 0.5}
    cfg = as_config({"seed": SEED, "data": {**data, "num_clients": NUM_CLIENTS, "min_samples": 8}})
    bundle = load_dataset("digits")
    parts = client_partition(cfg, bundle)
    writers = np.full(len(bundle.train), -1, dtype=np.int64)
    for c, idx in enumerate(parts):
        writers[idx] = c
    assert (writers >= 0).all(), "the partition leaves samples out"
    chosen, seeds = [], []
    for r in range(ROUNDS):
        rng = rng_for(SEED, "select", r)
        chosen.append(sorted(int(c) for c in rng.choice(NUM_CLIENTS, PER_ROUND, replace=False)))
        seeds.append([derive_seed(derive_seed(SEED, "b", r), c) for c in chosen[-1]])
    arrays = {
        "x": bundle.train.x.numpy(),
        "y": bundle.train.y.numpy(),
        "writers": writers,
        "x_test": bundle.test.x.numpy(),
        "y_test": bundle.test.y.numpy(),
    }
    path = write_workload(folder, arrays, chosen, seeds)
    w = read_workload(folder)  # the runners' batches are splitfl's
    for r, c in ((0, chosen[0][0]), (ROUNDS - 1, chosen[-1][-1])):
        steps = -(-len(parts[c]) // BATCH)
        seed = derive_seed(derive_seed(SEED, "b", r), c)
        ref = client_batches(parts[c], BATCH, steps, seed)
        assert all(torch.equal(a, b) for a, b in zip(w.batches(r, c), ref, strict=True))
    return path


def compile_sources(*folders: str | Path) -> None:
    """Byte-compile the runners and splitfl's sources (``folders``), as an installed package
    is: where
    ``PYTHONDONTWRITEBYTECODE`` is set (this machine's shells set it) a source tree is
    compiled anew by every process, ~0.5 s that the peers' installed packages do not pay."""
    import compileall

    compileall.compile_dir(str(HERE), maxlevels=0, quiet=1)  # the runners, not the venvs
    for folder in folders:
        compileall.compile_dir(str(folder), quiet=1)


def python_for(framework: str) -> Path | None:
    """The interpreter that runs ``framework`` (None: its venv is missing)."""
    venv = RUNNERS[framework][1]
    if venv is None:
        return Path(sys.executable)
    exe = VENVS / venv / "bin" / "python"
    return exe if exe.exists() else None


def busy_cpu_s() -> float:
    """CPU seconds the whole machine has been busy (``/proc/stat``: all but idle and
    iowait)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return [proc, *proc.children(recursive=True)]
    except psutil.Error:
        return []


def _sample(tree: list[psutil.Process], cpu: dict[int, float]) -> int:
    """The tree's resident memory now; each process's CPU time so far into ``cpu``."""
    rss = 0
    for p in tree:
        try:
            with p.oneshot():
                rss += p.memory_info().rss
                t = p.cpu_times()
                cpu[p.pid] = max(cpu.get(p.pid, 0.0), t.user + t.system)
        except psutil.Error:
            pass
    return rss


#: the runners whose run draws accuracy.png and loss.png
PLOTTING = ("splitfl", "splitfl_before")


def plots_ready(run_dir: Path, t0: float, timeout: float) -> float | None:
    """Seconds from launch until ``run_dir`` holds both end-of-run plots (drawn after the
    run's process has exited where a background process draws them), polled every 10 ms;
    None if they never appear. The next run starts only after this one's plots."""
    while time.perf_counter() - t0 < timeout:
        if (run_dir / "accuracy.png").is_file() and (run_dir / "loss.png").is_file():
            return time.perf_counter() - t0
        time.sleep(0.01)
    return None


def launch(framework: str, folder: Path, out: Path, timeout: float, src: str | None) -> dict:
    """Run ``framework``'s runner in a fresh process and measure it from outside: whole
    process, peak tree memory (sampled every 20 ms), the machine's other CPU use. ``src``: a
    splitfl source tree put first on the runner's path (``--splitfl-before``)."""
    script, _ = RUNNERS[framework]
    env = {**os.environ, OUT_ENV: str(out), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # bytecode as installed (see compile_sources)
    paths = (str(HERE), src, env.get("PYTHONPATH"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    busy0, env[LAUNCH_ENV] = busy_cpu_s(), repr(time.time())
    t0 = time.perf_counter()
    args = [str(python_for(framework)), str(HERE / script), str(folder)]
    proc = subprocess.Popen(
        args + RUNNER_ARGS.get(framework, []),
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    ps, peak, cpu = psutil.Process(proc.pid), 0, {}
    while proc.poll() is None and time.perf_counter() - t0 < timeout:
        peak = max(peak, _sample(_tree(ps), cpu))
        time.sleep(0.02)
    if proc.poll() is None:
        proc.kill()
    log = proc.communicate()[0]
    whole, busy = time.perf_counter() - t0, busy_cpu_s() - busy0
    ready = plots_ready(Path(str(out) + ".run"), t0, timeout) if framework in PLOTTING else None
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    own = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    own = max(own, sum(cpu.values()))
    if proc.returncode != 0 or not out.exists():
        return {"framework": framework, "error": log[-3000:], "returncode": proc.returncode}
    row = {**json.loads(out.read_text()), "framework": framework}
    steady, cpu = row["round_s"][WARM:], row.get("round_cpu_s")
    row.update(
        whole_s=whole,
        plots_ready_s=ready,
        peak_rss_mib=peak / 2**20,
        tree_cpu_s=own,
        other_cpu_cores=max(busy - own, 0.0) / whole,
        steady_round_s=statistics.median(steady),
        steady_round_cpu_s=statistics.median(cpu[WARM:]) if cpu else None,
    )
    row["final"] = torch.load(str(out) + ".pt", weights_only=True)
    return row


def compare(row: dict, plain: dict, n_test: int) -> dict:
    """How ``row``'s results differ from the plain loop's: per-round accuracy (identical?
    the first round that differs, the largest difference) and the final model."""
    acc, ref = np.asarray(row["acc"], dtype=float), np.asarray(plain["acc"], dtype=float)
    # the same number of test samples right (frameworks round the fraction differently)
    differs = np.flatnonzero(np.round(acc * n_test) != np.round(ref * n_test))
    final = {k: v.to(torch.float64) for k, v in row.pop("final").items()}
    keys = plain["final"].keys()
    same_keys = final.keys() == keys
    return {
        "acc_identical": not len(differs),
        "acc_first_differing_round": int(differs[0]) + 1 if len(differs) else None,
        "acc_max_abs_diff": float(np.abs(acc - ref).max()),
        "final_model_max_abs_diff": (
            max(float((final[k] - plain["final"][k].to(torch.float64)).abs().max()) for k in keys)
            if same_keys
            else None
        ),
    }


RATIOS = (
    "steady_round_s",
    "steady_round_cpu_s",
    "rounds_wall_s",
    "setup_s",
    "whole_s",
    "plots_ready_s",
    "peak_rss_mib",
)


def summarize(runs: list[dict], dirty: float) -> dict:
    """Per framework: each figure's per-repeat values, median, ratio to the plain loop of
    the same repeat (median and range); the runs flagged for other processes' CPU."""
    out: dict[str, dict] = {}
    plains = {r["repeat"]: r for r in runs if r["framework"] == "plain" and "error" not in r}
    for name in RUNNERS:
        rows = [r for r in runs if r["framework"] == name and "error" not in r]
        errors = [r["error"] for r in runs if r["framework"] == name and "error" in r]
        if not rows:
            if errors:
                out[name] = {"errors": errors}
            continue
        fig: dict = {"version": rows[0]["version"], "errors": errors}
        for key in RATIOS:
            keyed = [r for r in rows if r.get(key) is not None]
            if not keyed:
                continue
            vals = [r[key] for r in keyed]
            base = "whole_s" if key == "plots_ready_s" else key  # the plain loop's exit
            ratios = [r[key] / plains[r["repeat"]][base] for r in keyed if r["repeat"] in plains]
            fig[key] = {"values": vals, "median": statistics.median(vals)}
            if ratios:
                fig[key].update(ratio=ratios, ratio_median=statistics.median(ratios))
        fig["other_cpu_cores"] = [r["other_cpu_cores"] for r in rows]
        fig["flagged_repeats"] = [r["repeat"] for r in rows if r["other_cpu_cores"] > dirty]
        fig["vs_plain"] = [r["vs_plain"] for r in rows if "vs_plain" in r]
        out[name] = fig
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--frameworks", default="plain,splitfl,pfl,flwr", help="comma-separated")
    p.add_argument(
        "--dirty", type=float, default=0.25, help="flag runs with more other CPU (cores)"
    )
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per run")
    p.add_argument("--json", type=Path, help="write the raw figures here")
    p.add_argument("--splitfl-before", help="also run splitfl from this src/ (before a change)")
    args = p.parse_args()
    names = [n for n in args.frameworks.split(",") if n]
    if args.splitfl_before:
        names.insert(names.index("splitfl") if "splitfl" in names else 1, "splitfl_before")
    missing = {n: f"no {VENVS / RUNNERS[n][1]}" for n in names if python_for(n) is None}
    runs: list[dict] = []
    compile_sources(Path(splitfl.__file__).parent, *filter(None, [args.splitfl_before]))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "data"
        n_test = len(np.load(prepare(folder))["y_test"])
        for rep in range(args.repeats):
            plain = None
            for name in (n for n in names if n not in missing):
                src = args.splitfl_before if name == "splitfl_before" else None
                row = launch(name, folder, Path(tmp) / f"{name}-{rep}.json", args.timeout, src)
                row["repeat"] = rep
                if name == "plain" and "error" not in row:
                    plain = row
                elif plain is not None and "error" not in row:
                    row["vs_plain"] = compare(row, plain, n_test)
                runs.append(row)
                print(_line(row), flush=True)
            if plain is not None:
                plain.pop("final", None)
    summary = summarize(runs, args.dirty)
    out = {
        "workload": {
            "rounds": ROUNDS,
            "warm": WARM,
            "clients": NUM_CLIENTS,
            "per_round": PER_ROUND,
        },
        "missing": missing,
        "summary": summary,
        "runs": runs,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
        },
    }
    for name, fig in summary.items():
        if "steady_round_s" in fig:
            r = fig["steady_round_s"]
            whole = fig["whole_s"].get("ratio_median", 1)
            print(
                f"{name}: steady round {r['median'] * 1e3:.1f} ms, "
                f"x{r.get('ratio_median', 1):.2f} plain; whole process x{whole:.2f}"
            )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


def _line(row: dict) -> str:
    """One run, one line."""
    head = f"{row['framework']} (repeat {row['repeat']})"
    if "error" in row:
        return f"{head}: failed: {row['error'][-500:]}"
    cpu = row.get("steady_round_cpu_s")
    cpu = f" (CPU {cpu * 1e3:.1f} ms)" if cpu is not None else ""
    return (
        f"{head}: steady round {row['steady_round_s'] * 1e3:.1f} ms{cpu}, "
        f"30 rounds {row['rounds_wall_s']:.2f} s, set-up {row['setup_s']:.2f} s, "
        f"whole {row['whole_s']:.2f} s{_ready(row)}, peak {row['peak_rss_mib']:.0f} MiB, "
        f"other CPU {row['other_cpu_cores']:.2f} cores {row.get('vs_plain', '')}"
    )


def _ready(row: dict) -> str:
    ready = row.get("plots_ready_s")
    return f", plots at {ready:.2f} s" if ready is not None else ""


if __name__ == "__main__":
    main()

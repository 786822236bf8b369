"""How splitfl's cost grows with the data and the federation (issue 54).

Measurements, each in a fresh process (peak RSS is the process's own) and, for a before/after
ratio, interleaved: the tree under test is ``--src`` (default: this checkout's ``src``), so the
same script measures an older commit exported with ``git archive``.

* ``prep``: ``splitfl.experiment.runner.prepare`` (read the data, partition it, build the
  model and the algorithm) on a generated in-memory ``TensorDataset`` pair of ``n`` items of
  1x8x8 float32 (labels 0..9; test split 1,000), SplitFed V1 on a 64-input MLP, IID among
  ``clients`` clients. Reports seconds and peak RSS above the process with the data built.
* ``rounds``: ``splitfl.run`` of an algorithm with ``clients`` clients of 4 samples each,
  ``--per-round`` of them a round: the median round time after the first, and peak RSS.
* ``planning``: ParallelSFL's per-round planning (``plan_clusters``) on a random round of
  ``clients`` workers: seconds, candidate evaluations, the plan's digest.
* ``grouping``: S²FL's §3.2 grouping (``balanced_groups``) of ``clients`` devices in groups
  of 5, ``--restarts`` starts: seconds, swap steps, the groups' digest.
* ``images``: first-epoch images/s of the lazy ``image_folder`` path beside a plain PIL +
  ``DataLoader`` loop and (``--readers ... torchvision``, where it imports) torchvision's
  ``ImageFolder`` + ``DataLoader`` over the same ``--n`` PNGs.
* ``partition``: one partitioner (``iid``, ``dirichlet``, ``shards``, ``natural``,
  ``folders``) of ``n`` labels among ``clients`` clients, seconds.

    python benchmarks/bench_scale.py prep --sizes 10000 100000 1000000
    python benchmarks/bench_scale.py partition --n 1000000 --clients 100 10000 1000000
    python benchmarks/bench_scale.py prep --sizes 100000 --src /tmp/old/src   # the old code
    python benchmarks/bench_scale.py rounds --clients 100 10000 100000 --algorithms splitfed_v1
    python benchmarks/bench_scale.py rounds --executor timing --algorithms s2fl --clients 1000 \
        --per-round 100 --profile      # cProfile's top 40 by cumulative time, on stderr
    python benchmarks/bench_scale.py rounds --executor timing --algorithms pyramidfl ifca \
        --clients 100 1000 10000 100000 1000000 --per-round 10 100 > rounds.jsonl
    python benchmarks/bench_scale.py planning --clients 100 200 400 --src src /tmp/old/src
    python benchmarks/bench_scale.py grouping --clients 1000 10000 --src src /tmp/old/src
    python benchmarks/bench_scale.py grouping --clients 5000 --restarts 1 --profile
    python benchmarks/bench_scale.py images --n 5000
    python benchmarks/bench_scale.py plot rounds.jsonl benchmarks/results/scale-rounds.png
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
INPUT_SHAPE = (1, 8, 8)


def generated_pair():
    """The ``data.dataset`` of ``prep``: ``BENCH_SCALE_N`` training items (env), 1,000 test."""
    import torch
    from torch.utils.data import TensorDataset

    n = int(os.environ["BENCH_SCALE_N"])
    gen = torch.Generator().manual_seed(0)

    def split(size: int) -> TensorDataset:
        x = torch.rand(size, *INPUT_SHAPE, generator=gen)
        return TensorDataset(x, torch.randint(0, 10, (size,), generator=gen))

    return split(n), split(1000)


def _cpu_s() -> float:
    """This process's CPU seconds (user + system): less bent than wall time by other load."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def _profiled(fn, *args, sort: str, top: int, **kwargs):
    """``fn(*args, **kwargs)``; under ``--profile`` (``BENCH_SCALE_PROFILE``) in cProfile, its
    ``top`` functions by ``sort`` printed on stderr."""
    if not os.environ.get("BENCH_SCALE_PROFILE"):
        return fn(*args, **kwargs)
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    result = profiler.runcall(fn, *args, **kwargs)
    pstats.Stats(profiler, stream=sys.stderr).sort_stats(sort).print_stats(top)
    return result


def one_prep(n: int, clients: int) -> dict:
    """``prepare`` once (this process): seconds and peak RSS above the data's own."""
    from splitfl.experiment.runner import as_config, prepare
    from splitfl.testing import tiny_config

    os.environ["BENCH_SCALE_N"] = str(n)
    sys.path.insert(0, str(HERE))
    import bench_scale

    held = bench_scale.generated_pair()  # built (and counted) before the clock starts
    bench_scale.generated_pair = lambda: held
    config = tiny_config(
        algorithm="splitfed_v1",
        model="mlp",
        **{
            "data.dataset": "bench_scale:generated_pair",
            "data.partition": "iid",
            "data.num_clients": clients,
            "data.min_samples": 1,
            "train.clients_per_round": min(10, clients),
        },
    )
    config["import_dirs"] = [str(HERE)]
    before, cpu = _peak_mib(), _cpu_s()
    start = time.perf_counter()
    _profiled(prepare, as_config(config), sort="tottime", top=8)
    seconds = time.perf_counter() - start
    data_mib = n * (4 * 64 + 8) / 2**20
    return {
        "n": n,
        "clients": clients,
        "seconds": seconds,
        "cpu_s": _cpu_s() - cpu,
        "data_mib": data_mib,
        "peak_above_data_mib": _peak_mib() - before,
        "peak_mib": _peak_mib(),
    }


def one_rounds(
    algorithm: str,
    clients: int,
    per_round: int,
    rounds: int = 4,
    executor: str = "sequential",
    overrides: dict | None = None,
) -> dict:
    """``rounds`` rounds of ``algorithm`` with ``clients`` clients of 4 samples each (IID),
    ``per_round`` of them a round: the median time of a round after the first (the
    ``wall_time`` column's steps; every step in ``steps_s``), and the peak RSS. ``executor:
    timing`` trains nothing: the round is then the algorithm's selection, planning and
    bookkeeping, and the clock's. ``overrides``: more config keys (``--set``)."""
    import tempfile

    import splitfl
    from splitfl.testing import tiny_config

    n = 4 * clients
    os.environ["BENCH_SCALE_N"] = str(n)
    changes = {
        "algorithm": algorithm,
        "model": "mlp",
        "rounds": rounds,
        "data.dataset": "bench_scale:generated_pair",
        "data.partition": "iid",
        "data.num_clients": clients,
        "data.min_samples": 1,
        "train.clients_per_round": per_round,
        "import_dirs": [str(HERE)],
        "executor": executor,
        **(overrides or {}),
    }
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        config, run_dir = tiny_config(**changes), Path(folder) / "run"
        result = _profiled(splitfl.run, config, run_dir=run_dir, sort="cumtime", top=40)
        total = time.perf_counter() - start
        rows = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    walls = [r["wall_time"] for r in rows]
    in_order = [b - a for a, b in zip(walls, walls[1:], strict=False)]
    steps = sorted(in_order)
    return {
        "algorithm": algorithm,
        "clients": clients,
        "per_round": per_round,
        "executor": executor,
        "n": n,
        "round_s": steps[len(steps) // 2],
        "steps_s": in_order,
        "overrides": overrides or {},
        "run_s": total,
        "peak_mib": _peak_mib(),
    }


def one_partition(scheme: str, n: int, clients: int) -> dict:
    import numpy as np

    from splitfl.data.partition import partition_indices

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 10, size=n)
    writers = np.arange(n) % clients
    start, cpu = time.perf_counter(), _cpu_s()
    parts = partition_indices(
        scheme,
        labels,
        clients,
        np.random.default_rng(1),
        alpha=0.5,
        classes_per_client=2,
        writers=writers,
        min_samples=1,
    )
    seconds = time.perf_counter() - start
    assert sum(len(p) for p in parts) == n
    cpu = _cpu_s() - cpu
    return {"scheme": scheme, "n": n, "clients": clients, "seconds": seconds, "cpu_s": cpu}


def one_planning(n: int) -> dict:
    """ParallelSFL's Alg. 1 (``plan_clusters``, K-means, greedy, line 11's local search) on a
    random round of ``n`` workers (10 classes, Dirichlet(0.5) labels, uniform times and
    link times β, the instance of ``tests/algorithms/test_parallelsfl_control.py``): seconds,
    CPU seconds, passes of the swap sweep, ``_Evaluator._many`` calls (candidate-cluster
    evaluations) and a digest of the clusters (equal digests: the same plan)."""
    import hashlib

    import numpy as np

    from splitfl.algorithms.parallelsfl import clustering, finetune
    from splitfl.algorithms.parallelsfl.planner import plan_clusters
    from splitfl.algorithms.parallelsfl.problem import ClusterInputs

    clustering.load_kmeans()  # scikit-learn's import is not the planning's
    rng = np.random.default_rng(0)
    v = rng.dirichlet(np.full(10, 0.5), size=n)
    mu_b = rng.uniform(0.1, 2.0, n)
    beta = rng.uniform(0.01, 1.0, (n, n))
    beta = (beta + beta.T) / 2
    np.fill_diagonal(beta, 0.0)
    inputs = ClusterInputs(
        v, mu_b, mu_b * rng.uniform(0.05, 0.6, n), beta, rng.uniform(0.5, 8.0, n), 1.0
    )
    count = {"passes": 0, "evaluations": 0}
    many, swaps = finetune._Evaluator._many, finetune._Search.swaps

    def counted_many(self, candidates, top):
        count["evaluations"] += 1
        return many(self, candidates, top)

    def counted_swaps(self):
        count["passes"] += 1
        return swaps(self)

    finetune._Evaluator._many, finetune._Search.swaps = counted_many, counted_swaps
    start, cpu = time.perf_counter(), _cpu_s()
    clusters, _, info = plan_clusters(inputs, np.random.default_rng(1), tau=5)
    seconds, cpu = time.perf_counter() - start, _cpu_s() - cpu
    digest = hashlib.sha256(json.dumps([[t, list(m)] for t, m in clusters]).encode()).hexdigest()
    return {
        "planning": "parallelsfl",
        "n": n,
        "seconds": seconds,
        "cpu_s": cpu,
        **count,
        "sum_utility": info["sum_utility"],
        "clusters_sha256": digest[:16],
        "peak_mib": _peak_mib(),
    }


def one_grouping(n: int, restarts: int) -> dict:
    """S²FL's §3.2 grouping (``balanced_groups``) of ``n`` devices in groups of 5 (the
    default ``group_size``), ``restarts`` random starts: a warm-up round's grouping of its
    timed devices (``S2FL.warmup_groups``). Devices of the ``rounds`` workload: 4 IID samples
    of 10 classes each. Seconds, CPU seconds, swap steps, a digest of the groups."""
    import hashlib

    import numpy as np

    from splitfl.algorithms.s2fl import data_balance

    rng = np.random.default_rng(0)
    hist = np.zeros((n, 10))
    np.add.at(hist, (np.repeat(np.arange(n), 4), rng.integers(0, 10, 4 * n)), 1)
    count = {"steps": 0}
    best_swap = data_balance._best_swap

    def counted(*args):
        count["steps"] += 1
        return best_swap(*args)

    data_balance._best_swap = counted
    start, cpu = time.perf_counter(), _cpu_s()
    groups, _ = _profiled(
        data_balance.balanced_groups,
        hist,
        -(-n // 5),
        np.random.default_rng(1),
        restarts=restarts,
        sort="tottime",
        top=14,
    )
    seconds, cpu = time.perf_counter() - start, _cpu_s() - cpu
    digest = hashlib.sha256(json.dumps(groups).encode()).hexdigest()
    return {
        "planning": "s2fl_grouping",
        "n": n,
        "restarts": restarts,
        "seconds": seconds,
        "cpu_s": cpu,
        **count,
        "groups_sha256": digest[:16],
        "peak_mib": _peak_mib(),
    }


#: ``images`` readers: splitfl's lazy ``image_folder``, the written-out PIL loop, and
#: torchvision's own ``ImageFolder`` + ``ToTensor`` (where torchvision imports).
IMAGE_READERS = {
    "lazy": "splitfl lazy image_folder",
    "plain": "plain PIL + DataLoader",
    "torchvision": "torchvision ImageFolder + DataLoader",
}


def one_images(n: int, reader: str) -> dict:
    """First-epoch throughput over ``n`` 32x32 RGB PNGs (10 class folders, written by
    :func:`_write_images` into ``BENCH_SCALE_IMAGES``) by ``reader`` (:data:`IMAGE_READERS`):
    splitfl's lazy ``image_folder`` (``data.lazy: true``: listing, then shuffled batches of
    64 read through ``x[idx]``); ``plain``, a ``PIL`` + ``DataLoader`` loop over the same
    files (what torchvision's ``ImageFolder`` + ``ToTensor`` does: open, convert to RGB,
    scale to [0, 1]); ``torchvision``, that dataset itself. One process, ``num_workers=0``
    like splitfl's reader. Images per second and the first batch's sum."""
    import numpy as np
    import torch

    root = Path(os.environ["BENCH_SCALE_IMAGES"])
    order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    start, cpu = time.perf_counter(), _cpu_s()
    if reader == "torchvision":
        from torch.utils.data import DataLoader
        from torchvision.datasets import ImageFolder
        from torchvision.transforms import ToTensor

        folder = ImageFolder(str(root / "train"), transform=ToTensor())
        batches = (x for x, _ in DataLoader(folder, 64, sampler=order.tolist()))
    elif reader == "plain":
        from PIL import Image
        from torch.utils.data import DataLoader, Dataset

        files = sorted((root / "train").glob("*/*.png"))

        class Files(Dataset):
            def __len__(self):
                return len(files)

            def __getitem__(self, i):
                rgb = np.asarray(Image.open(files[i]).convert("RGB"), dtype=np.float32)
                return torch.from_numpy(rgb / 255.0).permute(2, 0, 1), 0

        batches = (x for x, _ in DataLoader(Files(), 64, sampler=order.tolist()))
    else:
        from splitfl.data.formats import ContainerOptions, load_container

        train = load_container("image_folder", root, "bench", ContainerOptions(lazy=True)).train
        batches = (train.x[order[i : i + 64]] for i in range(0, n, 64))
    first, seen = None, 0
    for x in batches:
        first = float(x.sum()) if first is None else first
        seen += len(x)
    seconds = time.perf_counter() - start
    return {
        "images": IMAGE_READERS[reader],
        "n": seen,
        "seconds": seconds,
        "cpu_s": _cpu_s() - cpu,
        "images_per_s": seen / seconds,
        "first_batch_sum": first,
    }


def _write_images(root: Path, n: int) -> None:
    """``n`` random 32x32 RGB PNGs in ``root/train/<class>/`` (10 classes), 20 in ``test``."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("test", 20)):
        for i in range(count):
            folder = root / split / f"c{i % 10}"
            folder.mkdir(parents=True, exist_ok=True)
            pixels = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / f"{i:07d}.png")


def plot_rounds(logs: list[str], png: Path) -> None:
    """Log–log plot of the ``rounds`` rows in ``logs`` (this script's JSON lines): the round
    time against the number of clients N, one line per (algorithm, clients per round K).
    Rows of a tree under ``/tmp/`` (an older commit exported for a before/after pair) are
    left out."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points: dict[tuple[str, int], dict[int, float]] = {}
    for log in logs:  # a later row of the same (algorithm, K, N) replaces an earlier one
        for line in Path(log).read_text().splitlines():
            row = json.loads(line) if line.startswith("{") else {}
            if "round_s" in row and not row.get("src", "").startswith("/tmp/"):
                key = (row["algorithm"], row["per_round"])  # /tmp/...: a "before" tree
                points.setdefault(key, {})[row["clients"]] = row["round_s"]
    curves = {key: list(by_n.items()) for key, by_n in points.items()}
    fig, ax = plt.subplots(figsize=(9, 4.5))
    colour = {a: f"C{i}" for i, a in enumerate(sorted({a for a, _ in curves}))}  # one each
    for (algorithm, k), points in sorted(curves.items()):
        xs, ys = zip(*sorted(points), strict=True)
        style = "-" if k <= 10 else "--"
        ax.loglog(
            xs,
            ys,
            marker="o",
            linestyle=style,
            color=colour[algorithm],
            label=f"{algorithm}, K={k}",
        )
    ax.set_xlabel("clients N")
    ax.set_ylabel("round time, executor: timing (s)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def _spawn(src: str, args: list[str], timeout: float) -> dict:
    env = {**os.environ, "PYTHONPATH": src}
    cmd = [sys.executable, str(Path(__file__).resolve()), "_one", *args]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"args": args, "timed_out_s": timeout}
    if out.returncode:
        return {"args": args, "error": out.stderr.strip().splitlines()[-1:]}
    if os.environ.get("BENCH_SCALE_PROFILE"):
        print(out.stderr, file=sys.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "what",
        choices=["prep", "partition", "rounds", "planning", "grouping", "images", "plot", "_one"],
    )
    parser.add_argument("--algorithms", nargs="+", default=["splitfed_v1"])
    parser.add_argument("--per-round", type=int, nargs="+", default=[10])
    parser.add_argument(
        "--executor", default="sequential", help="rounds: timing measures planning alone"
    )
    parser.add_argument("rest", nargs="*")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, nargs="+", default=[100, 10_000, 1_000_000])
    parser.add_argument(
        "--schemes", nargs="+", default=["iid", "dirichlet", "shards", "natural", "folders"]
    )
    parser.add_argument(
        "--src",
        nargs="+",
        default=[str(HERE.parent / "src")],
        help="trees to measure, interleaved (e.g. the old code's src)",
    )
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--restarts", type=int, default=8, help="grouping: random starts")
    parser.add_argument(
        "--readers", nargs="+", choices=sorted(IMAGE_READERS), help="images: default lazy plain"
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds: rounds a run")
    parser.add_argument("--set", nargs="*", default=[], help="rounds: KEY=JSON config overrides")
    parser.add_argument(
        "--profile", action="store_true", help="prep, rounds, grouping: cProfile's top, on stderr"
    )
    a = parser.parse_args(argv)
    if a.profile:
        os.environ["BENCH_SCALE_PROFILE"] = "1"
    if a.what == "plot":  # plot LOG... PNG: the rounds rows of earlier invocations' output
        plot_rounds(a.rest[:-1], Path(a.rest[-1]))
        return
    if a.what == "_one":
        kind, *values = a.rest
        if kind == "prep":
            row = one_prep(*map(int, values))
        elif kind == "planning":
            row = one_planning(int(values[0]))
        elif kind == "grouping":
            row = one_grouping(int(values[0]), int(values[1]))
        elif kind == "images":
            row = one_images(int(values[0]), values[1])
        elif kind == "rounds":
            alg, c, k, executor, rounds, sets = values
            row = one_rounds(alg, int(c), int(k), int(rounds), executor, json.loads(sets))
        else:
            row = one_partition(values[0], int(values[1]), int(values[2]))
        print(json.dumps(row))
        return
    if a.what == "prep":
        jobs = [["prep", str(n), str(a.clients[0])] for n in a.sizes]
    elif a.what == "rounds":
        sets = {k: json.loads(v) for k, v in (item.split("=", 1) for item in a.set)}
        jobs = [
            ["rounds", alg, str(c), str(k), a.executor, str(a.rounds), json.dumps(sets)]
            for alg in a.algorithms
            for k in a.per_round
            for c in a.clients
            if k <= c
        ]
    elif a.what == "planning":
        jobs = [["planning", str(c)] for c in a.clients]
    elif a.what == "grouping":
        jobs = [["grouping", str(c), str(a.restarts)] for c in a.clients]
    elif a.what == "images":  # interleaved: splitfl's lazy reader, the plain loop, again
        root = Path(os.environ.setdefault("BENCH_SCALE_IMAGES", "/tmp/bench-scale-images"))
        if not (root / "train").exists():
            _write_images(root, a.n)
        kinds = a.readers or ["lazy", "plain"]
        jobs = [["images", str(a.n), kind] for _ in range(3) for kind in kinds]
    else:
        jobs = [["partition", s, str(a.n), str(c)] for s in a.schemes for c in a.clients]
    for job in jobs:
        for src in a.src:  # interleaved: each tree right after the other
            row = _spawn(src, job, a.timeout)
            print(json.dumps({"src": src, **row}), flush=True)


if __name__ == "__main__":
    main()

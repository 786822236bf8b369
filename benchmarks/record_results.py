"""Identical results before and after a refactor: every registered algorithm, two cases.

For each algorithm of the registry (``splitfl list``'s algorithms without the aliases, which
are the same classes with other options) it runs

* ``quickstart``: ``configs/quickstart.yaml`` with that algorithm, cut to ``--rounds`` rounds
  (default 10 of the file's 40, so that the whole script stays within about six minutes on
  two CPU cores; rounds 1-10 also cover the file's checkpoint at round 10), and
* ``timing``: a paper preset with ``executor: timing``: the first setup of
  ``benchmarks/papers/timing_setups.py`` (``SETUPS``, in its order) that compares the
  algorithm, else the shared ``s2fl-table3`` setup (VGG-16 on CIFAR-10 shapes, 100 devices),
  cut to ``--timing-rounds`` rounds (default 5; the papers' setups run 2-60).

A few algorithms need an override to run these configs at all (``EXTRA``: CSE-FSL, FSL-SAGE
and RingSFL; each says why).

and records, per run: the SHA-256 of the run directory's ``model.pt``, the ``metrics.jsonl``
rows and ``summary.json``, without what depends on the host rather than on the code: the
wall-clock fields (``wall_time`` in every row and the summary, and any ``wall_s``,
``elapsed*``, ``written``, ``timestamp`` / ``time_stamp`` field) and versions, commits and
paths (none of which the rows or the summary hold today; ``version.json`` is not compared).
The model profiles are measured into a fresh cache folder (``SPLITFL_CACHE_DIR``), so an
entry cached by another tree cannot stand in for this one's measurement.

    python benchmarks/record_results.py --record benchmarks/results/identical-<commit>.json
    python benchmarks/record_results.py --compare benchmarks/results/identical-<commit>.json

``--compare`` prints a table algorithm × case (``identical``, or ``differs`` with the fields
that do) and exits 1 on any difference. ``--only a,b`` restricts either mode to some
algorithms (a comparison then checks those only). A run that raises records its one-line
error, which is compared like any other value.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import hashlib
import io
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "configs" / "quickstart.yaml"
FALLBACK_SETUP = "s2fl-table3"
#: keys dropped wherever they occur (rows, summary, nested): host time, versions, paths
DROP = {
    "wall_time",
    "wall_s",
    "written",
    "timestamp",
    "time_stamp",
    "splitfl_version",
    "torch_version",
    "python_version",
    "git_commit",
    "git_dirty",
    "run_dir",
    "path",
}
DROP_PREFIXES = ("elapsed",)
CASES = ("quickstart", "timing")
#: per-algorithm overrides without which the case stops: a turn of uploads longer than a
#: client's batches (CSE-FSL), FSL-SAGE's default ResNet-stage auxiliary model meeting a
#: one-sample batch in BatchNorm (round 4 of the quickstart; 5 alignment epochs instead of 100
#: for time), RingSFL's at most one client per model block (cnn_digits has 5)
EXTRA = {
    "quickstart": {
        "cse_fsl": ["options.cse_fsl.upload_every=1"],
        "fsl_sage": ["options.fsl_sage.aux_model=linear", "options.fsl_sage.align_epochs=5"],
        "ringsfl": ["data.num_clients=5", "train.clients_per_round=5"],
    },
    "timing": {"cse_fsl": ["options.cse_fsl.upload_every=1"]},
}


def clean(value: Any) -> Any:
    """``value`` without the host-dependent keys (recursively), floats kept exactly
    (NaN and infinities as strings, so the JSON stays strict)."""
    if isinstance(value, dict):
        return {
            k: clean(v)
            for k, v in value.items()
            if k not in DROP and not k.startswith(DROP_PREFIXES)
        }
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def algorithms() -> list[str]:
    """The registered algorithms, as ``splitfl list`` names them, without the aliases."""
    import splitfl
    from splitfl.algorithms import ALIASES

    return [name for name in splitfl.catalog()["algorithms"] if name not in ALIASES]


def timing_setup(algorithm: str):
    """The paper setup (``timing_setups.SETUPS``) the algorithm's timing case runs."""
    papers = str(ROOT / "benchmarks" / "papers")
    if papers not in sys.path:
        sys.path.insert(0, papers)
    from timing_setups import SETUPS

    for setup in SETUPS.values():
        if algorithm in setup.algorithms:
            return setup
    return SETUPS[FALLBACK_SETUP]


def configs(algorithm: str, rounds: int, timing_rounds: int) -> dict[str, tuple[Any, list]]:
    """case -> (config, overrides) for one algorithm."""
    setup = timing_setup(algorithm)
    base = copy.deepcopy(setup.base)
    base["output"] = {**base.get("output", {}), "progress": False}
    quick = [f"algorithm={algorithm}", f"rounds={rounds}", "output.progress=false"]
    timing = [f"algorithm={algorithm}", f"rounds={timing_rounds}"]
    return {
        "quickstart": (str(QUICKSTART), quick + EXTRA["quickstart"].get(algorithm, [])),
        "timing": (base, timing + EXTRA["timing"].get(algorithm, [])),
    }


def run_case(config: Any, overrides: list[str]) -> dict[str, Any]:
    """One run in a temporary folder: what is compared, and (not compared) its wall time."""
    import splitfl

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                splitfl.run(config, overrides, run_dir=run_dir, progress=False)
        except Exception as exc:  # noqa: BLE001 - a failure is a result too
            return {"error": f"{type(exc).__name__}: {exc}", "seconds": time.perf_counter() - t0}
        model = run_dir / "model.pt"
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        record = {
            "model_sha256": hashlib.sha256(model.read_bytes()).hexdigest()
            if model.exists()
            else None,
            "metrics": clean(rows),
            "summary": clean(json.loads((run_dir / "summary.json").read_text())),
        }
    return record | {"seconds": time.perf_counter() - t0}


def record(names: list[str], rounds: int, timing_rounds: int) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {}
    for name in names:
        results[name] = {}
        for case, (config, overrides) in configs(name, rounds, timing_rounds).items():
            res = run_case(config, overrides)
            if case == "timing":
                res["setup"] = timing_setup(name).name
            results[name][case] = res
            state = res.get("error", "ok")
            print(f"{name:18} {case:10} {res['seconds']:6.1f} s  {state}", flush=True)
    return {"rounds": rounds, "timing_rounds": timing_rounds, "results": results}


def differences(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted names of the fields that differ (rows as ``metrics[i].field``)."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            name = f"{prefix}.{key}" if prefix else key
            if key not in old or key not in new:
                out.append(name + (" (new)" if key not in old else " (gone)"))
            else:
                out += differences(old[key], new[key], name)
        return out
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        if prefix == "metrics":
            out = []
            for i, (a, b) in enumerate(zip(old, new, strict=True)):
                out += differences(a, b, f"metrics[{i}]")
            return out
        return [] if old == new else [prefix]
    return [] if old == new else [prefix]


def short(fields: list[str], limit: int = 6) -> str:
    """Differing fields, rows folded: ``metrics[*].test_acc`` once for all rows."""
    folded: list[str] = []
    for f in fields:
        name = f.split("]", 1)[-1].lstrip(".") if f.startswith("metrics[") else f
        name = f"metrics[*].{name}" if f.startswith("metrics[") else name
        if name not in folded:
            folded.append(name)
    more = f" (+{len(folded) - limit} more)" if len(folded) > limit else ""
    return ", ".join(folded[:limit]) + more


def compare(baseline: dict[str, Any], current: dict[str, Any]) -> int:
    width = max(len(n) for n in current["results"]) + 2
    print(f"{'algorithm':{width}}" + "".join(f"{case:34}" for case in CASES))
    bad = 0
    for name, cases in current["results"].items():
        cells = []
        for case in CASES:
            new = {k: v for k, v in cases[case].items() if k != "seconds"}
            old = baseline["results"].get(name, {}).get(case)
            if old is None:
                cells.append("missing from baseline")
                bad += 1
                continue
            old = {k: v for k, v in old.items() if k != "seconds"}
            diff = differences(old, new)
            cells.append("identical" if not diff else "differs: " + short(diff))
            bad += bool(diff)
        print(f"{name:{width}}" + "".join(f"{c:34}" for c in cells))
    missing = sorted(set(baseline["results"]) - set(current["results"]))
    if missing and current.get("complete", True):
        print(f"not run now (in the baseline): {', '.join(missing)}")
        bad += len(missing)
    print("all identical" if not bad else f"{bad} difference(s)")
    return 1 if bad else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", metavar="OUT.json", type=Path)
    mode.add_argument("--compare", metavar="OUT.json", type=Path)
    parser.add_argument("--only", help="comma-separated algorithms (default: every one)")
    parser.add_argument("--rounds", type=int, default=10, help="quickstart rounds")
    parser.add_argument("--timing-rounds", type=int, default=5, help="timing-case rounds")
    args = parser.parse_args(argv)

    baseline = json.loads(args.compare.read_text()) if args.compare else None
    rounds = baseline["rounds"] if baseline else args.rounds
    timing_rounds = baseline["timing_rounds"] if baseline else args.timing_rounds
    names = algorithms()
    if args.only:
        wanted = args.only.split(",")
        unknown = sorted(set(wanted) - set(names))
        if unknown:
            parser.error(f"unknown algorithm(s): {', '.join(unknown)}")
        names = [n for n in names if n in wanted]

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as cache:
        os.environ["SPLITFL_CACHE_DIR"] = cache
        current = record(names, rounds, timing_rounds)
    current["complete"] = not args.only
    print(f"{time.perf_counter() - t0:.0f} s in all", flush=True)
    if args.record:
        import splitfl

        current["splitfl"] = str(Path(splitfl.__file__).resolve().parent)
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(current, indent=1) + "\n")
        print(f"wrote {args.record}")
        return 0
    return compare(baseline, current)


if __name__ == "__main__":
    sys.exit(main())

"""Run a sweep's trials: one ordinary run directory per trial under one sweep directory.

Two trial executors share :func:`run_trial` (so their outputs are identical):

* ``local``: trials one after another in this process;
* ``ray``: one Ray task per trial with fractional CPU/GPU resources, on a local Ray instance
  (default) or an existing cluster (``address``); the index is updated as each finishes.

(Not to be confused with the config field ``executor``, the training engine each trial uses.)

The sweep directory holds ``sweep.yaml`` (the resolved sweep file), ``trials.json`` (trial
name → axis values, overrides, status ``pending|running|done|failed|diverged``, error) and
``<trial>/`` run directories (a failed trial's has ``error.json``). Running the same sweep
into the same directory again resumes it: finished and diverged trials are kept, trials with
a checkpoint resume from it, the others start afresh.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from splitfl.config import ConfigError, ExperimentConfig, from_dict, load_yaml
from splitfl.data.base import DatasetError
from splitfl.dirlock import hold_lock
from splitfl.executors import NonFiniteLossError
from splitfl.experiment import runner  # looked up per call (tests replace runner.run)
from splitfl.metrics.report import report as write_report
from splitfl.sweeps.spec import SweepSpec, Trial, expand, load_sweep

TRIAL_EXECUTORS = ("ray", "local")
FINAL = ("done", "diverged")  # not rerun on resume (a diverged trial diverges again)
INDEX = "trials.json"


@dataclass
class SweepResult:
    """What :func:`sweep` returns: the sweep directory and the index's trial entries."""

    out_dir: Path
    trials: list[dict[str, Any]]

    @property
    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.trials:
            out[t["status"]] = out.get(t["status"], 0) + 1
        return out

    @property
    def ok(self) -> bool:
        return all(t["status"] == "done" for t in self.trials)


# ----------------------------------------------------------------------------- one trial


def run_state(run_dir: Path, rounds: int) -> str:
    """``done``, ``diverged``, ``partial`` (a run directory to resume) or ``new``."""
    summary_path = run_dir / "summary.json"
    if summary_path.exists():
        status = json.loads(summary_path.read_text()).get("status", "")
        if status.startswith("diverged"):
            return "diverged"
        summary = json.loads(summary_path.read_text())
        if status == "ok" and summary.get("rounds") == rounds and (run_dir / "model.pt").exists():
            return "done"
    return "partial" if (run_dir / "config.yaml").exists() else "new"


def _write_error(run_dir: Path, status: str, err: BaseException | str) -> str:
    message = str(err).splitlines()[0] if str(err) else type(err).__name__
    record: dict[str, Any] = {"status": status, "error": message}
    if isinstance(err, BaseException):
        record["type"] = type(err).__name__
        record["traceback"] = "".join(traceback.format_exception(err))
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "error.json").write_text(json.dumps(record, indent=2))
    return message


def run_trial(config: dict[str, Any], run_dir: str) -> dict[str, Any]:
    """Run (or resume, or skip when finished) one trial into ``run_dir``.

    The same function runs in-process (``local``) and inside a Ray task. Trial failures do
    not raise: a diverged run or any exception is written to ``run_dir/error.json`` and
    returned as ``{"status": "diverged" | "failed", "error": ...}``.
    """
    path = Path(run_dir)
    cfg = from_dict(ExperimentConfig, config)
    state = run_state(path, cfg.rounds)
    start = time.perf_counter()
    if state in FINAL:
        summary = json.loads((path / "summary.json").read_text())
        return {"status": state, "action": "kept", "summary": summary, "error": None}
    try:
        if state == "partial":
            result = runner.resume(path, progress=False)
        else:
            if path.exists():  # stopped before its config was written
                shutil.rmtree(path)
            result = runner.run(cfg, run_dir=path, progress=False)
    except NonFiniteLossError as err:
        return {"status": "diverged", "action": state, "error": _write_error(path, "diverged", err)}
    except Exception as err:  # noqa: BLE001 - any trial failure is recorded, not raised
        return {"status": "failed", "action": state, "error": _write_error(path, "failed", err)}
    (path / "error.json").unlink(missing_ok=True)
    return {
        "status": "done",
        "action": "resumed" if state == "partial" else "ran",
        "summary": result.summary,
        "error": None,
        "seconds": time.perf_counter() - start,
    }


# ----------------------------------------------------------------------------- executors

Job = tuple[Trial, Path]
OnDone = Callable[[Trial, dict[str, Any]], None]


def run_local(jobs: list[Job], on_start: Callable[[Trial], None], on_done: OnDone) -> None:
    """Trials one after another in this process."""
    for trial, run_dir in jobs:
        on_start(trial)
        on_done(trial, run_trial(trial.config.to_dict(), str(run_dir)))


def import_ray() -> Any:
    """``ray``, or a one-line ConfigError saying how to get it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            "--executor",
            "ray is not installed: pip install 'splitfl[ray]', or use --executor local",
        ) from None
    return ray


def run_ray(
    jobs: list[Job],
    on_start: Callable[[Trial], None],
    on_done: OnDone,
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
) -> None:
    """One Ray task per trial (``num_cpus``/``num_gpus`` per task), gathered with
    ``ray.wait`` as they finish. Uses a running Ray instance if this process has one,
    else connects to ``address`` (``auto``, ``ray://host:10001``) or starts a local one."""
    ray = import_ray()
    started = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
        if address:
            kwargs["address"] = address
        else:
            kwargs["num_cpus"] = os.cpu_count()
        ray.init(**kwargs)
        started = True
    try:
        task = ray.remote(run_trial).options(
            num_cpus=cpus_per_trial, num_gpus=gpus_per_trial, max_retries=0
        )
        pending = {}
        for trial, run_dir in jobs:
            ref = task.remote(trial.config.to_dict(), str(run_dir.resolve()))
            pending[ref] = trial
            on_start(trial)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            trial = pending.pop(ready[0])
            try:
                outcome = ray.get(ready[0])
            except Exception as err:  # noqa: BLE001 - e.g. a worker that crashed
                outcome = {"status": "failed", "action": "ray", "error": f"ray: {err}"}
            on_done(trial, outcome)
    finally:
        if started:
            ray.shutdown()


# ----------------------------------------------------------------------------- the sweep


def _same_config(run_dir: Path, config: ExperimentConfig) -> bool:
    path = run_dir / "config.yaml"
    return not path.exists() or from_dict(ExperimentConfig, load_yaml(path.read_text())) == config


def check_data(trials: list[Trial], folder: Path | None = None) -> list[Trial]:
    """Data/model checks (``splitfl validate``) for each valid trial (skipping those already
    finished in ``folder``); a failing one comes back with its error and no config."""
    out = []
    for t in trials:
        finished = (
            folder is not None
            and t.config is not None
            and (run_state(folder / t.name, t.config.rounds) in FINAL)
        )
        if t.config is not None and not finished:
            try:
                runner.prepare(t.config)
            except (ConfigError, DatasetError) as err:
                t = Trial(t.index, t.name, t.values, None, str(err))
        out.append(t)
    return out


def _reject_invalid(trials: list[Trial]) -> None:
    bad = [t for t in trials if t.error]
    if bad:
        first = bad[0]
        field, _, message = first.error.partition(": ")
        raise ConfigError(
            field,
            f"{message} (trial {first.name}; {len(bad)} of {len(trials)} trials invalid: "
            f"{', '.join(t.name for t in bad[:5])}{', ...' if len(bad) > 5 else ''}; "
            "--keep-going records them as failed and runs the others)",
        )


#: What makes two sweeps the same one (not where their files were read from).
SAME_SWEEP_KEYS = ("name", "base", "overrides", "axes")


def check_same_sweep(folder: Path, spec: SweepSpec) -> None:
    """Refuse (one line) a sweep directory whose ``sweep.yaml`` holds a different sweep;
    the same sweep again is a resume."""
    path = folder / "sweep.yaml"
    if not path.is_file():
        return
    try:
        old = load_yaml(path.read_text()) or {}
    except yaml.YAMLError:
        old = {}
    new = load_yaml(yaml.safe_dump(spec.to_dict(), sort_keys=False))  # same round trip
    differ = [k for k in SAME_SWEEP_KEYS if not isinstance(old, dict) or old.get(k) != new[k]]
    if differ:
        raise ConfigError(
            "--out",
            f"{folder} holds a different config: another sweep (its sweep.yaml differs in "
            f"{', '.join(differ)}); use another --out, or --resume {folder} to continue it",
        )


def sweep_dir_for(spec: SweepSpec, out_dir: str | Path | None) -> Path:
    """``out_dir`` if given, else ``<sweep out_dir or runs>/<name>`` (stable, so running the
    same command again resumes)."""
    return Path(out_dir) if out_dir is not None else Path(spec.out_dir or "runs") / spec.name


class Index:
    """``trials.json``: one entry per trial, rewritten atomically on every change."""

    def __init__(self, folder: Path, spec: SweepSpec, trials: list[Trial]):
        self.path = folder / INDEX
        self.entries = {
            t.name: {
                "name": t.name,
                "dir": t.name,
                "values": t.values,
                "overrides": t.overrides,
                "status": "pending",
                "error": t.error,
            }
            for t in trials
        }
        self.header = {"name": spec.name, "axes": list(spec.axes)}

    def update(self, name: str, **fields: Any) -> None:
        self.entries[name].update(fields)
        self.save()

    def save(self) -> None:
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({**self.header, "trials": list(self.entries.values())}, indent=2))
        tmp.replace(self.path)


def _summary_fields(outcome: dict[str, Any]) -> dict[str, Any]:
    s = outcome.get("summary") or {}
    return {"final_acc": s.get("final_acc"), "best_acc": s.get("best_acc")}


def _progress_line(done: int, total: int, trial: Trial, outcome: dict[str, Any]) -> str:
    status = outcome["status"]
    if status == "done":
        acc = (outcome.get("summary") or {}).get("final_acc")
        detail = f"final acc {100 * acc:.2f} %" if acc is not None else "no evaluation"
        detail += f", {outcome['action']}"
        if "seconds" in outcome:
            detail += f" in {outcome['seconds']:.1f} s"
    else:
        detail = outcome.get("error") or ""
    return f"[{done}/{total}] {trial.name}: {status} ({detail})"


def sweep(
    spec: str | Path | dict[str, Any] | SweepSpec,
    out_dir: str | Path | None = None,
    executor: str = "ray",
    address: str | None = None,
    gpus_per_trial: float = 0.0,
    cpus_per_trial: float = 1.0,
    keep_going: bool = False,
    overrides: list[str] | None = None,
    progress: bool = True,
    report: bool = True,
) -> SweepResult:
    """Run every trial of a sweep (the Python twin of ``splitfl sweep``).

    Args:
        spec: A sweep file, a mapping of its fields, a :class:`SweepSpec`, or an existing
            sweep directory (resume it with its ``sweep.yaml``).
        out_dir: The sweep directory (default ``<out_dir of the sweep file or runs>/<name>``).
            If it already holds this sweep, the sweep resumes.
        executor: ``ray`` (default) or ``local`` (one trial after another, same outputs).
        address: Ray cluster address (``auto``, ``ray://host:10001``); default: local.
        gpus_per_trial, cpus_per_trial: Ray resources per trial (fractions allowed).
        keep_going: Record invalid trials as failed and run the others, instead of stopping
            before anything runs.
        overrides: ``key=value`` overrides for every trial, after the sweep file's own.
        progress: Print one line per finished trial.
        report: Write the report (``splitfl report``) into the sweep directory at the end.

    Raises:
        ConfigError: a malformed sweep file, invalid trials (without ``keep_going``), a
            missing Ray, or a sweep directory holding different configs.
    """
    if executor not in TRIAL_EXECUTORS:
        raise ConfigError("--executor", f"unknown {executor!r}; allowed: ray, local")
    if isinstance(spec, str | Path) and Path(spec).is_dir():
        out_dir = spec if out_dir is None else out_dir
        spec = Path(spec) / "sweep.yaml"
    if not isinstance(spec, SweepSpec):
        spec = load_sweep(spec, overrides)
    elif overrides:
        spec = SweepSpec(**{**spec.__dict__, "overrides": [*spec.overrides, *overrides]})
    if executor == "ray":
        import_ray()
    folder = sweep_dir_for(spec, out_dir)
    check_same_sweep(folder, spec)
    resources = (cpus_per_trial, gpus_per_trial)
    trials = check_data(expand(spec), folder)
    if not keep_going:
        _reject_invalid(trials)
    for t in trials:
        if t.config is not None and not _same_config(folder / t.name, t.config):
            raise ConfigError(
                f"trial {t.name}",
                f"{folder / t.name} holds a different config (sweep changed?); use another --out",
            )
    folder.mkdir(parents=True, exist_ok=True)
    with hold_lock(folder, "sweep"):
        check_same_sweep(folder, spec)  # again, now that no other process can write it
        index = _run_sweep(folder, spec, trials, executor, progress, address, resources)
        if report:
            write_report(folder)
    return SweepResult(folder, list(index.entries.values()))


def _run_sweep(
    folder: Path,
    spec: SweepSpec,
    trials: list[Trial],
    executor: str,
    progress: bool,
    address: str | None,
    resources: tuple[float, float],
) -> Index:
    """Write ``sweep.yaml`` and the index, then run the unfinished trials (under the lock)."""
    (folder / "sweep.yaml").write_text(yaml.safe_dump(spec.to_dict(), sort_keys=False))
    index = Index(folder, spec, trials)
    jobs: list[Job] = []
    for t in trials:
        run_dir = folder / t.name
        if t.config is None:
            index.entries[t.name].update(
                status="failed", error=_write_error(run_dir, "failed", t.error)
            )
            continue
        state = run_state(run_dir, t.config.rounds)
        if state in FINAL:
            summary = json.loads((run_dir / "summary.json").read_text())
            error = summary["status"] if state == "diverged" else None
            index.entries[t.name].update(
                status=state, error=error, **_summary_fields({"summary": summary})
            )
        else:
            jobs.append((t, run_dir))
    index.save()
    finished = [len(trials) - len(jobs)]
    log = print if progress else (lambda *_: None)
    if finished[0]:
        log(
            f"{finished[0]} of {len(trials)} trials already finished or invalid; {len(jobs)} to run"
        )

    def on_start(trial: Trial) -> None:
        index.update(trial.name, status="running", error=None)

    def on_done(trial: Trial, outcome: dict[str, Any]) -> None:
        finished[0] += 1
        index.update(
            trial.name,
            status=outcome["status"],
            error=outcome.get("error"),
            **_summary_fields(outcome),
        )
        log(_progress_line(finished[0], len(trials), trial, outcome))
        sys.stdout.flush()

    if executor == "local":
        run_local(jobs, on_start, on_done)
    else:
        run_ray(jobs, on_start, on_done, address, *resources)
    return index

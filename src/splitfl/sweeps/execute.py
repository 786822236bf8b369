"""Run a sweep: one ordinary run directory per trial under one sweep directory.

The trials run on a backend (:mod:`splitfl.sweeps.backends`: ``local`` or ``ray``), each by
:func:`~splitfl.sweeps.trial.run_trial`; the sweep directory and its index are
:mod:`splitfl.sweeps.directory`. Running the same sweep into the same directory again resumes
it: finished and diverged trials are kept, trials with a checkpoint resume from it, the others
start afresh.
"""

from __future__ import annotations

import math
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from splitfl.config import ConfigError, check_ray_address
from splitfl.core.atomic import naming, write_atomic
from splitfl.metrics.report import report as write_report
from splitfl.ray_cluster import reachable
from splitfl.rundir.lock import hold_lock
from splitfl.sweeps.backends import BACKENDS, Job, import_ray, run_local, run_ray
from splitfl.sweeps.directory import (
    Index,
    check_data,
    check_same_sweep,
    reject_invalid,
    same_config,
    sweep_dir_for,
)
from splitfl.sweeps.resources import reservation_note, trial_demand
from splitfl.sweeps.spec import SweepSpec, Trial, expand, load_sweep, narrow_axes
from splitfl.sweeps.trial import FINAL, read_summary, run_state, write_error


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


def grid_line(spec: SweepSpec, total: int, to_run: int, backend: str) -> str:
    """What a sweep is about to do, printed before its first trial starts: ``36 trials
    (algorithm 6 × alpha 2 × seed 3); 36 to run on ray``."""
    sizes = " × ".join(f"{k} {len(v)}" for k, v in spec.axes.items()) or "no axes"
    done = total - to_run
    kept = f"; {done} already finished or invalid" if done else ""
    noun = "trial" if total == 1 else "trials"
    return f"{total} {noun} ({sizes}){kept}; {to_run} to run on {backend}"


def resolve_backend(backend: str | None, executor: str | None) -> str:
    """The trial backend of :func:`sweep`: ``backend`` (default ``ray``), or ``executor``, its
    deprecated old name (it clashed with the config field ``executor``), with a
    :class:`DeprecationWarning`."""
    if executor is None:
        return "ray" if backend is None else backend
    if backend is not None and backend != executor:
        raise TypeError(f"sweep() got backend={backend!r} and executor={executor!r}; give one")
    warnings.warn(
        "sweep(executor=...) is deprecated; use backend=... (how trials run: ray or local)",
        DeprecationWarning,
        stacklevel=3,
    )
    return executor


def _resolve_spec(
    spec: str | Path | dict[str, Any] | SweepSpec,
    out_dir: str | Path | None,
    overrides: list[str] | None,
    imports: list[str] | None = None,
) -> tuple[SweepSpec, str | Path | None]:
    """The sweep (a file, a mapping, a :class:`SweepSpec` or a sweep directory to resume) with
    ``overrides`` applied and ``imports`` added to its base config's, and the sweep directory
    given (a resumed directory's own)."""
    if isinstance(spec, str | Path) and Path(spec).is_dir():
        out_dir = spec if out_dir is None else out_dir
        spec = Path(spec) / "sweep.yaml"
    if not isinstance(spec, SweepSpec):
        spec = load_sweep(spec, overrides)
    elif overrides:
        axes, extra = narrow_axes(spec.axes, overrides)
        spec = SweepSpec(**{**spec.__dict__, "axes": axes, "overrides": [*spec.overrides, *extra]})
    if imports:
        own = spec.base.get("imports") or []
        own = [own] if isinstance(own, str) else list(own)
        base = {**spec.base, "imports": list(dict.fromkeys([*own, *imports]))}
        spec = SweepSpec(**{**spec.__dict__, "base": base})
    return spec, out_dir


def _checked_trials(spec: SweepSpec, folder: Path, keep_going: bool) -> list[Trial]:
    """The trials after the data/model checks; raises for invalid trials (unless
    ``keep_going``) and for trial directories holding a different config."""
    trials = check_data(expand(spec), folder)
    if not keep_going:
        reject_invalid(trials)
    for t in trials:
        if t.config is not None and not same_config(folder / t.name, t.config):
            raise ConfigError(
                f"trial {t.name}",
                f"{folder / t.name} holds a different config (sweep changed?); use another --out",
            )
    return trials


def sweep(
    spec: str | Path | dict[str, Any] | SweepSpec,
    out_dir: str | Path | None = None,
    backend: str | None = None,
    address: str | None = None,
    gpus_per_trial: float = 0.0,
    cpus_per_trial: float = 1.0,
    keep_going: bool = False,
    overrides: list[str] | None = None,
    progress: bool = True,
    report: bool = True,
    *,
    executor: str | None = None,
    imports: list[str] | None = None,
) -> SweepResult:
    """Run every trial of a sweep (the Python twin of ``splitfl sweep``).

    Args:
        spec: A sweep file, a mapping of its fields, a :class:`SweepSpec`, or an existing
            sweep directory (resume it with its ``sweep.yaml``).
        out_dir: The sweep directory (default ``<out_dir of the sweep file or runs>/<name>``).
            If it already holds this sweep, the sweep resumes.
        backend: How trials run: ``ray`` (default) or ``local`` (one trial after another, same
            outputs). Not the training engine (the config field ``executor``).
        address: Ray cluster address (``auto``, ``ray://host:10001``); default: local.
        gpus_per_trial: Ray GPUs per trial (fractions allowed).
        cpus_per_trial: Ray CPUs per trial (fractions allowed).
        keep_going: Record invalid trials as failed and run the others, instead of stopping
            before anything runs.
        overrides: ``key=value`` overrides for every trial, after the sweep file's own.
        progress: Print one line per finished trial.
        report: Write the report (``splitfl report``) into the sweep directory at the end.
        executor: Deprecated name of ``backend`` (:class:`DeprecationWarning`).
        imports: Modules to import first (``--import``), added to the base config's
            ``imports``; every trial imports them, in this process or a Ray worker (which
            gets the ones not installed as its runtime environment's ``py_modules``).

    Raises:
        ConfigError: a malformed sweep file, invalid trials (without ``keep_going``), a
            missing Ray, or a sweep directory holding different configs.
    """
    backend = resolve_backend(backend, executor)
    if backend not in BACKENDS:
        raise ConfigError("--backend", f"unknown {backend!r}; allowed: ray, local")
    spec, out_dir = _resolve_spec(spec, out_dir, overrides, imports)
    if backend == "ray":
        import_ray()
    check_backend_flags(backend, address, cpus_per_trial, gpus_per_trial)
    folder = sweep_dir_for(spec, out_dir)
    check_same_sweep(folder, spec)
    resources = (cpus_per_trial, gpus_per_trial)
    trials = _checked_trials(spec, folder, keep_going)
    with naming(folder):
        folder.mkdir(parents=True, exist_ok=True)
    with hold_lock(folder, "sweep"):
        check_same_sweep(folder, spec)  # again, now that no other process can write it
        index = _run_sweep(folder, spec, trials, backend, progress, address, resources)
        if report:
            write_report(folder)
    return SweepResult(folder, list(index.entries.values()))


def check_backend_flags(backend: str, address: str | None, cpus: float, gpus: float) -> None:
    """One-line ConfigErrors for ``--address`` (a Ray address where something answers, with
    ``--backend ray`` only) and ``--cpus-per-trial``/``--gpus-per-trial`` (finite, >= 0)."""
    if address is not None and backend != "ray":
        raise ConfigError(
            "--address",
            "a Ray cluster address needs --backend ray (trials' parallel workers take "
            "parallel.address)",
        )
    check_ray_address(address, "--address")
    if address is not None and not import_ray().is_initialized():
        reachable(address, "--address")  # before the sweep directory is made
    for flag, value in (("--cpus-per-trial", cpus), ("--gpus-per-trial", gpus)):
        if not 0 <= value < math.inf:
            raise ConfigError(flag, f"must be a number >= 0 (got {value:g})")


def _start_index(folder: Path, spec: SweepSpec, trials: list[Trial]) -> tuple[Index, list[Job]]:
    """Write ``sweep.yaml`` and the index (invalid trials failed, finished ones as they are);
    returns it and the trials still to run."""
    write_atomic(folder / "sweep.yaml", yaml.safe_dump(spec.to_dict(), sort_keys=False))
    index = Index(folder, spec, trials)
    jobs: list[Job] = []
    for t in trials:
        run_dir = folder / t.name
        if t.config is None:
            index.entries[t.name].update(
                status="failed", error=write_error(run_dir, "failed", t.error)
            )
            continue
        state = run_state(run_dir, t.config.rounds)
        if state in FINAL:
            summary = read_summary(run_dir) or {}
            error = summary["status"] if state == "diverged" else None
            index.entries[t.name].update(
                status=state, error=error, **_summary_fields({"summary": summary})
            )
        else:
            jobs.append((t, run_dir))
    index.save()
    return index, jobs


def _run_sweep(
    folder: Path,
    spec: SweepSpec,
    trials: list[Trial],
    backend: str,
    progress: bool,
    address: str | None,
    resources: tuple[float, float],
) -> Index:
    """Start the index, then run the unfinished trials on ``backend`` (under the lock)."""
    index, jobs = _start_index(folder, spec, trials)
    finished = [len(trials) - len(jobs)]
    log = print if progress else (lambda *_: None)
    note = ""
    if backend == "ray":
        note = reservation_note([trial_demand(t.config, *resources) for t, _ in jobs])
    log(grid_line(spec, len(trials), len(jobs), backend) + note)
    sys.stdout.flush()

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

    if backend == "local":
        run_local(jobs, on_start, on_done)
    else:
        run_ray(jobs, on_start, on_done, address, *resources)
    return index

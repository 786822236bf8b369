"""One trial of a sweep: an ordinary run directory, run, resumed or kept as it is.

:func:`run_trial` is what every trial backend (:mod:`splitfl.sweeps.backends`) calls, in this
process or inside a Ray task, so their outputs are identical. A failed trial's directory holds
``error.json``; finished and diverged trials are kept when a sweep resumes.
"""

from __future__ import annotations

import json
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

from splitfl.config import ConfigError, ExperimentConfig, from_dict
from splitfl.core.atomic import error_line, write_atomic
from splitfl.executors import NonFiniteLossError
from splitfl.experiment import runner  # looked up per call (tests replace runner.run)
from splitfl.metrics.records import read_record
from splitfl.metrics.rundirs import read_rows
from splitfl.metrics.summary import BUDGET_STATUS as BUDGET
from splitfl.metrics.summary import is_ok

FINAL = ("done", "diverged")  # not rerun on resume (a diverged trial diverges again)


def read_summary(run_dir: Path) -> dict[str, Any] | None:
    """``run_dir/summary.json``, or None if it is missing or damaged (a damaged one is
    rewritten when the run is resumed)."""
    try:
        return read_record(run_dir / "summary.json")
    except ConfigError:
        return None


def run_state(run_dir: Path, rounds: int) -> str:
    """``done``, ``diverged``, ``partial`` (a run directory to resume) or ``new``.

    ``done`` needs ``summary.json`` saying ``ok`` for ``rounds`` rounds, ``model.pt`` (both
    written atomically, the model first: :mod:`splitfl.experiment.recorder`) and the rows of
    rounds ``1..rounds`` in ``metrics.jsonl``; a damaged one is resumed, which restores it
    from the checkpoint."""
    summary = read_summary(run_dir) or {}
    status = str(summary.get("status", ""))
    if status.startswith("diverged"):
        return "diverged"
    budget = status.startswith(BUDGET)
    finished = budget or (is_ok(status) and summary.get("rounds") == rounds)
    if finished and (run_dir / "model.pt").is_file():
        try:
            read_rows(run_dir / "metrics.jsonl", summary.get("rounds") if budget else rounds)
            return "done"
        except ConfigError:
            pass
    return "partial" if (run_dir / "config.yaml").is_file() else "new"


def write_error(run_dir: Path, status: str, err: BaseException | str) -> str:
    """Record a failed or diverged trial in ``run_dir/error.json``; returns the one-line
    message. Best effort: a trial directory that cannot be written (a full disk, a name too
    long) keeps no ``error.json``, and the sweep's index still records the failure."""
    message = error_line(err)
    record: dict[str, Any] = {"status": status, "error": message}
    if isinstance(err, BaseException):
        record["type"] = type(err).__name__
        record["traceback"] = "".join(traceback.format_exception(err))
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        write_atomic(run_dir / "error.json", json.dumps(record, indent=2))
    except OSError:
        pass
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
        summary = read_summary(path)
        return {"status": state, "action": "kept", "summary": summary, "error": None}
    try:
        if state == "partial":
            result = runner.resume(path, progress=False)
        else:
            if path.exists():  # stopped before its config was written
                shutil.rmtree(path)
            result = runner.run(cfg, run_dir=path, progress=False)
    except NonFiniteLossError as err:
        return {"status": "diverged", "action": state, "error": write_error(path, "diverged", err)}
    except Exception as err:  # noqa: BLE001 - any trial failure is recorded, not raised
        return {"status": "failed", "action": state, "error": write_error(path, "failed", err)}
    (path / "error.json").unlink(missing_ok=True)
    return {
        "status": "done",
        "action": "resumed" if state == "partial" else "ran",
        "summary": result.summary,
        "error": None,
        "seconds": time.perf_counter() - start,
    }

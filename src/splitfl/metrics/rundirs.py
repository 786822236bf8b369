"""Reading run, comparison and sweep directories for reports (:mod:`splitfl.metrics.report`).

A damaged file in one run directory (a truncated ``summary.json``, garbage in
``error.json``, a ``config.yaml`` that is not a mapping, a metrics row without a number the
report needs) makes that run ``damaged``, with one line naming the file, instead of breaking
the report of the others. A damaged sweep index (``trials.json``) is a one-line
:class:`~splitfl.config.ConfigError` for the whole report: ``splitfl sweep --resume DIR``
rewrites it from the trial directories.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from splitfl.config import ConfigError, ExperimentConfig, flatten, load_yaml
from splitfl.metrics.records import read_bytes, read_metrics, read_record
from splitfl.metrics.summary import BUDGET_STATUS as BUDGET
from splitfl.metrics.summary import check_target, is_ok

SWEEP_INDEX = "trials.json"

#: Numbers every metrics row must hold for a report, and those that may also be null.
ROW_NUMBERS = ("round", "sim_time", "avg_waiting", "traffic_total_cum")
ROW_NULLABLE = ("test_acc", "test_loss", "energy_j", "wall_time")

#: What a failed trial's ``error.json`` may say it is.
ERROR_STATUSES = ("failed", "diverged")


@dataclass
class RunRecord:
    """One run directory as the report sees it. ``status``: done, failed, diverged,
    incomplete (stopped before its last round) or damaged (a file in it is unreadable)."""

    name: str
    run_dir: Path
    values: dict[str, Any]
    config: dict[str, Any] | None
    rows: list[dict[str, Any]]
    status: str
    error: str | None = None
    summary: dict[str, Any] | None = None


def is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file() and (path / "metrics.jsonl").is_file()


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def read_rows(path: Path, rounds: int | None = None) -> list[dict[str, Any]]:
    """``metrics.jsonl``'s rows with :func:`check_rows`, and :func:`check_complete` for
    ``rounds`` rounds if given."""
    rows = read_metrics(path)
    check_rows(rows, path)
    if rounds is not None:
        check_complete(rows, rounds, path)
    return rows


def check_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """One-line ConfigError for a row without a finite :data:`ROW_NUMBERS` value, or with
    a :data:`ROW_NULLABLE` value that is neither null nor a finite number."""
    for i, row in enumerate(rows, 1):
        bad = [k for k in ROW_NUMBERS if not _number(row.get(k))]
        bad += [k for k in ROW_NULLABLE if row.get(k) is not None and not _number(row[k])]
        if bad or not isinstance(row["round"], int):
            field = bad[0] if bad else "round"
            raise ConfigError(str(path), f"row {i} has no valid {field!r} (damaged file?)")


def read_config(path: Path) -> dict[str, Any] | None:
    """A run's ``config.yaml`` as a mapping (None if missing); one-line ConfigError if it is
    unreadable, not a mapping, or its ``rounds`` is not a non-negative integer."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        text = read_bytes(path).decode()
    except UnicodeDecodeError:
        raise ConfigError(str(path), "not UTF-8 text (damaged file?)") from None
    config = load_yaml(text, str(path), str(path))
    if not isinstance(config, dict):
        raise ConfigError(str(path), "not a mapping of config fields (damaged file?)")
    rounds = config.get("rounds", ExperimentConfig.rounds)
    if not isinstance(rounds, int) or isinstance(rounds, bool) or rounds < 0:
        raise ConfigError(str(path), f"rounds must be an integer >= 0 (got {rounds!r})")
    evaluation = config.get("eval") or {}
    if not isinstance(evaluation, dict):
        raise ConfigError(str(path), "eval is not a mapping (damaged file?)")
    check_target(evaluation.get("target_accuracy"), f"{path}: eval.target_accuracy")
    return config


def read_run(path: Path, name: str | None = None, values: dict | None = None) -> RunRecord:
    """A run directory (or a failed trial's directory holding only ``error.json``); a
    damaged file makes it a ``damaged`` record whose error names the file."""
    record = RunRecord(name or path.name, path, dict(values or {}), None, [], "incomplete")
    try:
        _read_files(record)
    except ConfigError as err:
        record.status = "damaged"
        record.error = str(err).replace(f"{path}/", "", 1)  # the file's name in its run
    return record


def _read_files(record: RunRecord) -> None:
    path = record.run_dir
    record.config = read_config(path / "config.yaml")
    record.rows = read_rows(path / "metrics.jsonl")
    summary, error = read_record(path / "summary.json"), read_record(path / "error.json")
    if summary is not None and not (
        isinstance(summary.get("status"), str) and _done_rounds(summary) >= 0
    ):
        raise ConfigError(str(path / "summary.json"), "no status text or no rounds number")
    rounds = (record.config or {}).get("rounds", ExperimentConfig.rounds)
    status = str((summary or {}).get("status", ""))
    if error is not None:
        if error.get("status", "failed") not in ERROR_STATUSES:
            raise ConfigError(str(path / "error.json"), f"status must be one of {ERROR_STATUSES}")
        record.status, record.error = error.get("status", "failed"), str(error.get("error"))
    elif status.startswith("diverged"):
        record.status, record.error = "diverged", status
    elif (is_ok(status) and _done_rounds(summary) >= rounds) or status.startswith(BUDGET):
        check_complete(record.rows, _done_rounds(summary), path / "metrics.jsonl")
        record.status = "done"
    else:
        record.error = f"stopped after {len(record.rows)} of {rounds} rounds"


def chance_accuracy(run_dirs: list[Path]) -> float | None:
    """The highest chance accuracy (1 / number of classes, read from the label histograms
    in ``clients.json``) among ``run_dirs``; None where no such file can be read."""
    chances = []
    for path in run_dirs:
        try:
            clients = json.loads((Path(path) / "clients.json").read_bytes())["clients"]
            classes = len(clients[0]["label_histogram"])
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            continue
        if isinstance(classes, int) and classes > 0:
            chances.append(1 / classes)
    return max(chances, default=None)


def check_complete(rows: list[dict[str, Any]], rounds: int, path: Path) -> None:
    """A finished run's rows are rounds ``1..rounds`` (else ``metrics.jsonl`` lost rows)."""
    if [r["round"] for r in rows] != list(range(1, rounds + 1)):
        raise ConfigError(
            str(path), f"holds {len(rows)} rows, not rounds 1..{rounds} as summary.json says"
        )


def _done_rounds(summary: dict[str, Any] | None) -> int:
    rounds = (summary or {}).get("rounds")
    return rounds if isinstance(rounds, int) and not isinstance(rounds, bool) else -1


def varied_keys(records: list[RunRecord]) -> list[str]:
    """Config keys (outside ``output.*``) whose values differ between the runs."""
    flats = [flatten(r.config) for r in records if r.config is not None]
    keys: list[str] = []
    for flat in flats:
        keys += [k for k in flat if k not in keys and not k.startswith("output.")]
    text = lambda value: json.dumps(value, sort_keys=True, default=str)  # noqa: E731
    return [k for k in keys if len({text(f.get(k)) for f in flats}) > 1]


def read_index(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """A sweep index's trial entries and axes; one-line ConfigError if it is damaged."""
    index = read_record(path)
    trials, axes = index.get("trials"), index.get("axes")
    problem = None
    if not isinstance(trials, list) or not isinstance(axes, list):
        problem = "no list of trials and axes"
    elif not all(isinstance(a, str) for a in axes):
        problem = "an axis that is not a name"
    else:
        problem = next((p for p in map(_entry_problem, trials) if p), None)
    if problem:
        raise ConfigError(
            str(path),
            f"{problem} (damaged file?); splitfl sweep --resume {path.parent} rewrites it",
        )
    return trials, axes


def _entry_problem(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return "a trial entry that is not a mapping"
    name, folder = entry.get("name"), entry.get("dir")
    if not isinstance(name, str) or not isinstance(entry.get("values"), dict):
        return "a trial entry without a name or values"
    if not isinstance(folder, str) or folder in ("", ".", "..") or Path(folder).name != folder:
        return f"trial {name!r} has no folder name (dir)"
    return None


def load_runs(path: Path) -> tuple[str, list[RunRecord], list[str]]:
    """What ``path`` is (``sweep``, ``compare``, ``run`` or ``runs``), its runs and the
    settings that vary between them."""
    if (path / SWEEP_INDEX).exists():
        trials, axes = read_index(path / SWEEP_INDEX)
        records = [read_run(path / t["dir"], t["name"], t["values"]) for t in trials]
        for record, entry in zip(records, trials, strict=True):
            if record.status == "incomplete" and entry.get("status") == "failed":
                record.status, record.error = "failed", str(entry.get("error"))
        return "sweep", records, axes
    if is_run_dir(path):
        return "run", [read_run(path)], []
    subdirs = (
        sorted(
            p
            for p in path.iterdir()
            if p.is_dir() and (is_run_dir(p) or (p / "error.json").exists())
        )
        if path.is_dir()
        else []
    )
    if not subdirs:
        raise ConfigError("report", f"{path} holds no run, comparison or sweep directory")
    records = [read_run(p) for p in subdirs]
    axes = varied_keys(records)
    for r in records:
        flat = flatten(r.config) if r.config is not None else {}
        r.values = {k: flat.get(k) for k in axes}
    return ("compare" if (path / "comparison.md").exists() else "runs"), records, axes

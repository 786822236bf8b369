"""The sweep directory: ``sweep.yaml`` (the resolved sweep file), ``trials.json`` (the index:
trial name → axis values, overrides, status ``pending|running|done|failed|diverged``, error)
and one ``<trial>/`` run directory per trial; the checks made before anything runs in it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import yaml

from splitfl.config import ConfigError, ExperimentConfig, from_dict, load_yaml
from splitfl.core.atomic import write_atomic
from splitfl.data.base import DatasetError
from splitfl.experiment import runner  # looked up per call (tests replace runner.prepare)
from splitfl.experiment.validation import resolve_config
from splitfl.metrics.rundirs import read_config
from splitfl.sweeps.spec import SweepSpec, Trial
from splitfl.sweeps.trial import FINAL, run_state

INDEX = "trials.json"


def same_config(run_dir: Path, config: ExperimentConfig) -> bool:
    """Whether ``run_dir`` holds no config yet, or ``config`` itself (both resolved: a run
    directory holds its config resolved); a damaged ``config.yaml`` is a one-line ConfigError
    naming it."""
    data = read_config(run_dir / "config.yaml")
    if data is None:
        return True
    stored, wanted = resolve_config(from_dict(ExperimentConfig, data)), resolve_config(config)
    if wanted.train.drop_last == "auto" and stored.train.drop_last in (False, "single"):
        # what auto became for the model (the run's context resolves it: a directory holds
        # the result), so a rerun of the same sweep finds its own trials
        wanted = wanted.replace(
            train=dataclasses.replace(wanted.train, drop_last=stored.train.drop_last)
        )
    return stored == wanted


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


def reject_invalid(trials: list[Trial]) -> None:
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
    except (ConfigError, UnicodeDecodeError):  # damaged: not this sweep
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
        text = json.dumps({**self.header, "trials": list(self.entries.values())}, indent=2)
        write_atomic(self.path, text)

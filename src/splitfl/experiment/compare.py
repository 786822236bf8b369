"""Run several algorithms on one config — same seed, partition, devices and client selection —
and tabulate them (the Python twin of ``splitfl compare``)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from splitfl.config import ConfigError, ExperimentConfig
from splitfl.core.atomic import naming, write_atomic
from splitfl.experiment.runner import RunResult, as_config, prepare, run
from splitfl.metrics.plots import plot_accuracy, plot_loss, plot_waiting
from splitfl.metrics.rundirs import chance_accuracy
from splitfl.metrics.summary import DEFAULT_TARGET_FRACTION, comparison_table, summarize, target_for

__all__ = ["DEFAULT_TARGET_FRACTION", "CompareResult", "common_target", "compare", "safe_name"]


@dataclass
class CompareResult:
    out_dir: Path
    runs: dict[str, RunResult]
    summaries: dict[str, dict[str, Any]]
    table: str
    target: float | None


def safe_name(algorithm: str) -> str:
    """A directory name for an algorithm or alias (``s2fl+B`` → ``s2fl_plus_B``)."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", algorithm.replace("+", "_plus_"))


def common_target(runs: dict[str, RunResult], configured: float | None) -> float | None:
    chance = chance_accuracy([r.run_dir for r in runs.values()])
    return target_for([r.summary["best_acc"] for r in runs.values()], configured, chance)


def _names(algorithms: Any) -> list[str]:
    """``algorithms`` as a non-empty list of names; a string (``"fedavg,s2fl"``, which would be
    read letter by letter) or anything else is a one-line error."""
    if isinstance(algorithms, str):
        names = [a.strip() for a in algorithms.split(",") if a.strip()]
        raise ConfigError(
            "algorithms", f"expected a list of names, got the string {algorithms!r} (write {names})"
        )
    if not isinstance(algorithms, list | tuple) or not all(isinstance(a, str) for a in algorithms):
        raise ConfigError("algorithms", f"expected a list of algorithm names, got {algorithms!r}")
    if not algorithms:
        raise ConfigError("--algorithms", "name at least one algorithm")
    return [str(a) for a in algorithms]


def partition_label(data) -> str:  # noqa: ANN001 - a DataConfig
    """The partition with its parameter: ``dirichlet α=0.5`` (``p=…`` where given), ``shards
    (2 classes per client)``, else the scheme's name."""
    if data.partition == "dirichlet":
        return f"dirichlet p={data.p:g}" if data.p is not None else f"dirichlet α={data.alpha:g}"
    if data.partition == "shards":
        return f"shards ({data.classes_per_client} classes per client)"
    return data.partition


def compare(
    config: ExperimentConfig | str | Path | dict,
    algorithms: list[str],
    overrides: list[str] | None = None,
    out_dir: str | Path | None = None,
    progress: bool | None = None,
    imports: list[str] | None = None,
) -> CompareResult:
    """Run each of ``algorithms`` with ``config`` and write a comparison directory.

    Every configuration is validated (and its data checked) before the first run starts.
    ``imports``: modules to import first (``--import``), added to the config's ``imports``.
    """
    algorithms = _names(algorithms)
    base = as_config(config, overrides, imports)
    configs = {a: as_config(base.replace(algorithm=a)) for a in algorithms}
    for cfg in configs.values():
        prepare(cfg)
    folder = (
        Path(out_dir)
        if out_dir is not None
        else (
            Path(base.output.out_dir)
            / f"compare-{base.data.dataset.rpartition(':')[2]}-{datetime.now():%Y%m%d-%H%M%S}"
        )
    )
    with naming(folder):
        folder.mkdir(parents=True, exist_ok=True)
    runs = {
        a: run(cfg, run_dir=folder / safe_name(a), progress=progress) for a, cfg in configs.items()
    }
    target = common_target(runs, base.eval.target_accuracy)
    summaries = {a: summarize(r.metrics, target, r.summary["status"]) for a, r in runs.items()}
    table = comparison_table(summaries)
    write_atomic(folder / "comparison.md", table + "\n")
    write_atomic(folder / "summary.json", json.dumps(summaries, indent=2))
    title = f"{base.data.dataset} / {base.model} / {partition_label(base.data)}"
    plot_accuracy({a: r.metrics for a, r in runs.items()}, folder / "accuracy.png", title)
    plot_loss({a: r.metrics for a, r in runs.items()}, folder / "loss.png", title)
    plot_waiting(summaries, folder / "waiting.png")
    return CompareResult(folder, runs, summaries, table, target)

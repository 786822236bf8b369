"""Optional experiment tracking: per-round metrics to TensorBoard and/or MLflow.

Off by default (``output.tracking: []``). The run directory (``metrics.jsonl``) stays the
source of truth; trackers receive a copy of each round's metrics row. The packages are
extras ``tensorboard`` and ``mlflow`` (from a checkout: ``pip install -e '.[mlflow]'``); config
validation rejects a tracker whose package is missing before any work starts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from splitfl.config import flatten


class Tracker(Protocol):
    """Receives each round's metrics row; closed once at the end of the run."""

    def log_round(self, row: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalar_metrics(row: dict[str, Any]) -> dict[str, float]:
    """The numeric scalar entries of a metrics row (lists, strings and ``None`` are dropped)."""
    return {
        k: float(v)
        for k, v in row.items()
        if k != "round" and isinstance(v, int | float) and not isinstance(v, bool)
    }


def flat_params(data: dict[str, Any]) -> dict[str, str]:
    """A nested config mapping as dotted ``key: str(value)`` pairs (MLflow parameters)."""
    return {k: str(v)[:500] for k, v in flatten(data).items()}


class TensorBoardTracker:
    """Scalars under ``<run_dir>/tensorboard`` (``tensorboard --logdir RUN_DIR``)."""

    def __init__(self, run_dir: Path):
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

    def log_round(self, row: dict[str, Any]) -> None:
        for key, value in scalar_metrics(row).items():
            self.writer.add_scalar(key, value, global_step=row["round"])
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class MLflowTracker:
    """One MLflow run per splitfl run (named after the run directory), the config as
    parameters, per-round metrics with ``step = round``. Where it logs follows MLflow's own
    settings (``MLFLOW_TRACKING_URI``)."""

    def __init__(self, run_dir: Path, config: dict[str, Any]):
        import mlflow

        self.mlflow = mlflow
        mlflow.start_run(run_name=run_dir.name)
        mlflow.log_params(flat_params(config))
        mlflow.set_tag("splitfl.run_dir", str(run_dir.resolve()))

    def log_round(self, row: dict[str, Any]) -> None:
        self.mlflow.log_metrics(scalar_metrics(row), step=row["round"])

    def close(self) -> None:
        self.mlflow.end_run()


class Trackers:
    """Fans each call out to the configured trackers (none: every call is a no-op)."""

    def __init__(self, trackers: list[Tracker]):
        self.trackers = trackers

    def log_round(self, row: dict[str, Any]) -> None:
        for tracker in self.trackers:
            tracker.log_round(row)

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()


def make_trackers(config: Any, run_dir: Path) -> Trackers:
    """The trackers named in ``config.output.tracking`` for a run writing to ``run_dir``."""
    trackers: list[Tracker] = []
    for name in config.output.tracking:
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(run_dir))
        elif name == "mlflow":
            trackers.append(MLflowTracker(run_dir, config.to_dict()))
    return Trackers(trackers)

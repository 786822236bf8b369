"""splitfl: split federated learning on heterogeneous edge devices.

Python API (mirrors the CLI)::

    import splitfl
    result = splitfl.run("configs/quickstart.yaml", ["rounds=5"])      # splitfl run
    cmp = splitfl.compare("configs/quickstart.yaml", ["fedavg", "s2fl"])  # splitfl compare
    splitfl.resume(result.run_dir)                                     # splitfl run --resume
    splitfl.validate("configs/quickstart.yaml")                        # splitfl validate
    splitfl.catalog()                                                  # splitfl list
    splitfl.sweep("sweep.yaml", backend="local")                       # splitfl sweep
    splitfl.report("runs/my-sweep")                                    # splitfl report
    result.wait_plots()  # accuracy.png and loss.png, drawn by a background process

Your own model, data and algorithm (ARCHITECTURE.md, "Extension points"): a module that
calls ``splitfl.register_model`` / ``register_dataset`` / ``register_algorithm``, named in
the config's ``imports:`` (or ``--import``), or ``model: package.module:callable``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Public names and the module each comes from. They are imported on first use (PEP 562), so
#: ``import splitfl.net.device.agent`` on an edge device does not pull in the experiment layer and
#: its plotting/sweep dependencies (matplotlib, tqdm, Ray).
_API = {
    "catalog": "splitfl.listing",
    "ConfigError": "splitfl.config",
    "ExperimentConfig": "splitfl.config",
    "CompareResult": "splitfl.experiment",
    "RunResult": "splitfl.experiment",
    "compare": "splitfl.experiment",
    "resume": "splitfl.experiment",
    "run": "splitfl.experiment",
    "validate": "splitfl.experiment",
    "load_config": "splitfl.experiment.validation",
    "ReportResult": "splitfl.metrics.report",
    "report": "splitfl.metrics.report",
    "SweepResult": "splitfl.sweeps",
    "sweep": "splitfl.sweeps",
    "register_algorithm": "splitfl.algorithms",
    "register_dataset": "splitfl.data.base",
    "register_model": "splitfl.models.registry",
    "BlockModel": "splitfl.models.base",
    "DatasetBundle": "splitfl.data.base",
    "ArrayDataset": "splitfl.data.base",
    "wait_plots": "splitfl.metrics.background",
}

if TYPE_CHECKING:
    from splitfl.algorithms import register_algorithm
    from splitfl.config import ConfigError, ExperimentConfig
    from splitfl.data.base import ArrayDataset, DatasetBundle, register_dataset
    from splitfl.experiment import CompareResult, RunResult, compare, resume, run, validate
    from splitfl.experiment.validation import load_config
    from splitfl.listing import catalog
    from splitfl.metrics.background import wait_plots
    from splitfl.metrics.report import ReportResult, report
    from splitfl.models.base import BlockModel
    from splitfl.models.registry import register_model
    from splitfl.sweeps import SweepResult, sweep

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'splitfl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API too (imported lazily, so not yet in the module's namespace)."""
    return sorted({*globals(), *_API})


__all__ = [
    "ArrayDataset",
    "BlockModel",
    "DatasetBundle",
    "CompareResult",
    "ConfigError",
    "ExperimentConfig",
    "ReportResult",
    "RunResult",
    "SweepResult",
    "compare",
    "load_config",
    "resume",
    "run",
    "catalog",
    "register_algorithm",
    "register_dataset",
    "register_model",
    "report",
    "sweep",
    "validate",
    "wait_plots",
]

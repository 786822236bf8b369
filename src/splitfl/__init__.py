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
"""

from splitfl.catalog import catalog
from splitfl.config import ConfigError, ExperimentConfig
from splitfl.experiment import CompareResult, RunResult, compare, resume, run, validate
from splitfl.experiment.validation import load_config
from splitfl.metrics.report import ReportResult, report
from splitfl.sweeps import SweepResult, sweep

__version__ = "0.1.0"

__all__ = [
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
    "report",
    "sweep",
    "validate",
]

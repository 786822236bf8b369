"""Execution: run context, executors (the per-batch loop), the round loop and comparisons."""

from splitfl.experiment.compare import CompareResult, compare
from splitfl.experiment.runner import RunResult, prepare, resume, run, validate

__all__ = ["CompareResult", "RunResult", "compare", "prepare", "resume", "run", "validate"]

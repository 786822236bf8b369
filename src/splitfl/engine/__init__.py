"""Execution: run context, executors (the per-batch loop), the round loop and comparisons."""

from splitfl.engine.compare import CompareResult, compare
from splitfl.engine.runner import RunResult, prepare, resume, run, validate

__all__ = ["CompareResult", "RunResult", "compare", "prepare", "resume", "run", "validate"]

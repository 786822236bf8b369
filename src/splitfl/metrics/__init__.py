"""Run metrics: summaries, comparison tables and plots.

The names below are imported on first use (PEP 562), so that the background plot process
(:mod:`splitfl.metrics.background`) imports matplotlib and not torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_API = {
    "read_metrics": "splitfl.metrics.records",
    "comparison_table": "splitfl.metrics.summary",
    "summarize": "splitfl.metrics.summary",
    "to_target": "splitfl.metrics.summary",
}

if TYPE_CHECKING:
    from splitfl.metrics.records import read_metrics
    from splitfl.metrics.summary import comparison_table, summarize, to_target


def __getattr__(name: str) -> Any:
    if name not in _API:
        raise AttributeError(f"module 'splitfl.metrics' has no attribute {name!r}")
    value = getattr(importlib.import_module(_API[name]), name)
    globals()[name] = value
    return value


__all__ = ["comparison_table", "read_metrics", "summarize", "to_target"]

"""Run metrics: summaries, comparison tables and plots."""

from splitfl.metrics.records import read_metrics
from splitfl.metrics.summary import comparison_table, summarize, to_target

__all__ = ["comparison_table", "read_metrics", "summarize", "to_target"]

"""Run metrics: summaries, comparison tables and plots."""

from splitfl.metrics.summary import comparison_table, read_metrics, summarize, to_target

__all__ = ["comparison_table", "read_metrics", "summarize", "to_target"]

"""Recording a run: ``metrics.jsonl``, trackers, checkpoints, ``summary.json`` and the plot.

The checkpoint holds the metric rows up to its round and is the source of truth on resume
(:mod:`splitfl.experiment.checkpoint`): a restored run rewrites ``metrics.jsonl`` from it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from splitfl.algorithms import Algorithm
from splitfl.config import ExperimentConfig
from splitfl.experiment.checkpoint import save_checkpoint
from splitfl.experiment.round_step import LoopState
from splitfl.metrics.plots import plot_accuracy
from splitfl.metrics.summary import summarize
from splitfl.metrics.tracking import make_trackers


class Recorder:
    """The run directory's records of a run: rows (as dicts and as written lines), trackers
    (``output.tracking``) and the round of the last checkpoint."""

    def __init__(self, run_dir: Path, lines: list[str], rows: list[dict], checkpoint_round: int):
        self.run_dir = run_dir
        self.lines = lines  # rows as written to metrics.jsonl (the checkpoint keeps the same text)
        self.rows = rows
        self.checkpoint_round = checkpoint_round
        self.trackers = None
        (run_dir / "metrics.jsonl").write_text("".join(lines))

    @classmethod
    def restored(cls, run_dir: Path, start: dict[str, Any]) -> Recorder:
        """The recorder of a resumed run: the checkpoint's rows replace ``metrics.jsonl``."""
        lines = str(start["metrics"]).splitlines(keepends=True)
        _note_restored(run_dir / "metrics.jsonl", lines)
        return cls(run_dir, lines, start["rows"], start["round"])

    def open_trackers(self, config: ExperimentConfig) -> None:
        self.trackers = make_trackers(config, self.run_dir)  # output.tracking (none by default)

    def record(self, row: dict[str, Any]) -> None:
        """Append a round's row to ``metrics.jsonl`` and the trackers."""
        line = json.dumps(row) + "\n"
        self.rows.append(row)
        self.lines.append(line)
        with open(self.run_dir / "metrics.jsonl", "a") as fh:
            fh.write(line)

    def log(self, row: dict[str, Any]) -> None:
        if self.trackers is not None:
            self.trackers.log_round(row)

    def checkpoint(self, st: LoopState, algorithm: Algorithm) -> None:
        """Checkpoint after the last recorded round (rows and model agree)."""
        done = len(self.rows)
        save_checkpoint(
            self.run_dir,
            {
                "round": done,
                "global_state": st.global_state,
                "algorithm": algorithm.state_dict(),
                "clock": st.clock.now,
                "traffic": st.cum.to_dict(),
                "initial_loss": st.initial_loss,
                "metrics": "".join(self.lines),
                "seed_rule": "streams derived from (seed, purpose, round)",
            },
        )
        self.checkpoint_round = done

    def finish(self, config: ExperimentConfig, status: str) -> dict[str, Any]:
        """Close the trackers, write ``summary.json`` and ``accuracy.png`` (when something was
        evaluated); returns the summary."""
        if self.trackers is not None:
            self.trackers.close()
        summary = summarize(self.rows, config.eval.target_accuracy, status, config.rounds)
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if any(r.get("test_acc") is not None for r in self.rows):  # none: executor: timing
            name = config.algorithm
            plot_accuracy({name: self.rows}, self.run_dir / "accuracy.png", name)
        return summary


def _note_restored(path: Path, lines: list[str]) -> None:
    """Say so when ``metrics.jsonl`` lost rows the checkpoint has (they are restored)."""
    old = path.read_text().splitlines(keepends=True) if path.exists() else []
    if old[: len(lines)] != lines:
        print(
            f"note: {path} disagreed with the checkpoint (missing, truncated or damaged rows); "
            f"restored its {len(lines)} rows from the checkpoint",
            file=sys.stderr,
        )

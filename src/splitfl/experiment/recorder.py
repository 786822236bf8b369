"""Recording a run: ``metrics.jsonl``, trackers, checkpoints, ``model.pt``, ``summary.json``
and the plots (drawn after ``summary.json`` by a background process started with the
recorder, :mod:`splitfl.metrics.background`).

The checkpoint holds the metric rows up to its round and the run's identity, and is the
source of truth on resume (:mod:`splitfl.experiment.checkpoint`): a restored run rewrites
``metrics.jsonl`` from it. Every file but the appended ``metrics.jsonl`` is written
atomically (:mod:`splitfl.core.atomic`), and ``summary.json`` is written last: when it says
``ok``, ``model.pt`` is complete.
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path
from typing import Any

import torch

from splitfl.algorithms import Algorithm
from splitfl.config import ExperimentConfig
from splitfl.core.atomic import append_text, write_atomic
from splitfl.experiment.checkpoint import identity_record, save_atomic, save_checkpoint
from splitfl.experiment.round_step import LoopState
from splitfl.metrics.background import Plotter, start_plotter
from splitfl.metrics.summary import summarize
from splitfl.metrics.tracking import make_trackers
from splitfl.training import restrict_state, row_key


class Recorder:
    """The run directory's records of a run: rows (as dicts and as written lines), trackers
    (``output.tracking``) and the round of the last checkpoint."""

    def __init__(
        self,
        run_dir: Path,
        config: ExperimentConfig,
        lines: list[str],
        rows: list[dict],
        checkpoint_round: int,
    ):
        self.run_dir = run_dir
        self.config = config
        self.lines = lines  # rows as written to metrics.jsonl (the checkpoint keeps the same text)
        self.rows = rows
        self.checkpoint_round = checkpoint_round
        #: the model keys a checkpoint holds (None: all; a LoRA model's frozen base is rebuilt
        #: from the model's own files on resume, :func:`~splitfl.models.base.moving_state`)
        self.state_keys: set[str] | None = None
        #: the data the run read (:mod:`~splitfl.experiment.fingerprint`); None: not taken
        self.data_fingerprint: dict[str, str] | None = None
        #: the test accuracy of a guess, 1 / classes (None: not a classifier; set by the loop)
        self.chance: float | None = None
        #: the state after the last recorded round (:meth:`remember`)
        self.last: dict[str, Any] | None = None
        self.consistent = True  # False while a round has changed the state but is not recorded
        self.trackers = None
        self.summary: dict[str, Any] | None = None  # set once summary.json is written
        self._identity_of: ExperimentConfig | None = None  # the config of _identity_record
        self._identity_record: dict[str, str] = {}
        (run_dir / "summary.json").unlink(missing_ok=True)  # rewritten when this process ends
        write_atomic(run_dir / "metrics.jsonl", "".join(lines))
        #: draws the plots once summary.json is written (imports matplotlib meanwhile)
        self.plotter: Plotter | None = None
        if config.output.plots:
            metric = next((m for m in config.eval.metrics if m != "loss"), "loss")
            spec = {"name": config.algorithm, "metric": metric, "key": row_key(metric)}
            self.plotter = start_plotter(run_dir, spec)

    @classmethod
    def restored(cls, run_dir: Path, config: ExperimentConfig, start: dict[str, Any]) -> Recorder:
        """The recorder of a resumed run: the checkpoint's rows replace ``metrics.jsonl``."""
        lines = str(start["metrics"]).splitlines(keepends=True)
        _note_restored(run_dir / "metrics.jsonl", lines)
        return cls(run_dir, config, lines, start["rows"], start["round"])

    def open_trackers(self) -> None:
        self.trackers = make_trackers(self.config, self.run_dir)  # output.tracking (default none)

    def record(self, row: dict[str, Any]) -> None:
        """Append a round's row to ``metrics.jsonl`` and the trackers (strict JSON: a
        non-finite number is written as null, with a warning naming it)."""
        try:  # the common case: every number finite, nothing to replace
            line = json.dumps(row, allow_nan=False) + "\n"
        except ValueError:
            row = finite_json(row, f"round {row.get('round')}")
            line = json.dumps(row, allow_nan=False) + "\n"
        self.rows.append(json.loads(line))  # what metrics.jsonl holds (string keys, nulls)
        self.lines.append(line)
        append_text(self.run_dir / "metrics.jsonl", line)

    def log(self, row: dict[str, Any]) -> None:
        if self.trackers is not None:
            self.trackers.log_round(row)

    def remember(self, st: LoopState, algorithm: Algorithm) -> None:
        """Keep the state after the last recorded round (the model by reference: a round
        replaces it, never writes into it), so that an interrupt in the middle of the next
        round can still checkpoint every finished one (:meth:`checkpoint_last`). Only what
        changes from round to round is kept; the rest of the checkpoint is added when one is
        written."""
        self.last = self._round_state(st, snapshot(algorithm.state_dict()))

    def checkpoint(self, st: LoopState, algorithm: Algorithm) -> None:
        """Checkpoint after the last recorded round (rows and model agree)."""
        self._write(self._round_state(st, algorithm.state_dict()))

    def checkpoint_last(self) -> None:
        """Checkpoint the state :meth:`remember` kept, if newer than the last checkpoint."""
        if self.last is not None and self.last["round"] > self.checkpoint_round:
            self._write(self.last)

    def _round_state(self, st: LoopState, algo_state: dict) -> dict:
        """The checkpoint's fields that change from round to round (after ``len(rows)``)."""
        return {
            "round": len(self.rows),
            "global_state": {
                k: v
                for k, v in st.global_state.items()
                if self.state_keys is None or k in self.state_keys
            },
            "algorithm": algo_state,
            "server_optimizer": restrict_state(st.server_opt, self.state_keys),
            "clock": st.clock.now,
            "traffic": st.cum.to_dict(),
            "initial_loss": st.initial_loss,
            **({} if st.executor is None else {"executor": st.executor}),
        }

    def _write(self, state: dict) -> None:
        """Write the checkpoint of ``state`` (:meth:`_round_state`): with the metric rows up
        to its round, the seed rule, the run's identity and its data's fingerprint."""
        snapshot = {
            **state,
            "metrics": "".join(self.lines[: state["round"]]),
            "seed_rule": "streams derived from (seed, purpose, round)",
            "identity": self._identity(),
            "data": self.data_fingerprint,
        }
        save_checkpoint(self.run_dir, snapshot)
        self.checkpoint_round = state["round"]

    def _identity(self) -> dict[str, str]:
        """The run's identity record (:func:`identity_record`), computed once per config."""
        if self._identity_of is not self.config:
            self._identity_of, self._identity_record = self.config, identity_record(self.config)
        return self._identity_record

    def finish(self, status: str, final_state: dict[str, torch.Tensor] | None = None) -> dict:
        """Close the trackers and write ``model.pt`` (``final_state``, a finished run only,
        under the user's own parameter names: :func:`~splitfl.models.base.user_state_dict`)
        and, last, ``summary.json``; then tells the plotter to draw ``accuracy.png`` and
        ``loss.png`` (:func:`~splitfl.metrics.background.wait_plots` waits for them); returns
        the summary."""
        if self.trackers is not None:
            trackers, self.trackers = self.trackers, None
            trackers.close()
        config = self.config
        collapse = (config.eval.collapse_share, config.eval.collapse_from)
        chance = (self.chance, config.eval.chance_margin)
        summary = summarize(
            self.rows, config.eval.target_accuracy, status, config.rounds, collapse, chance
        )
        try:
            if final_state is not None:
                save_atomic(final_state, self.run_dir / "model.pt")
            summary = finite_json(summary, "summary.json")
            text = json.dumps(summary, indent=2, allow_nan=False)
            write_atomic(self.run_dir / "summary.json", text)
        except BaseException:  # a full disk: no summary, nothing to draw
            if self.plotter is not None:
                self.plotter.cancel()
            raise
        self.summary = summary
        if self.plotter is not None:
            self.plotter.draw()
        return summary


#: values a deep copy returns as they are (immutable)
ATOMIC = frozenset({int, float, bool, str, bytes, type(None)})


def snapshot(value: Any) -> Any:
    """``copy.deepcopy(value)`` for an algorithm's state, without a Python step per element
    of a list that holds only immutable values (an idle client's entry of a per-client
    table): such a list is copied with ``list()``, as deepcopy would return it, element for
    element. Dicts, lists and tuples of other values recurse; anything else is deep-copied.
    A deepcopy of the whole state took one Python call per client per round (issue 54:
    ~0.5 s a round at 10⁵ clients)."""
    kind = type(value)
    if kind in ATOMIC:
        return value
    if kind is list or kind is tuple:
        if set(map(type, value)) <= ATOMIC:
            return kind(value)
        return kind(snapshot(v) for v in value)
    if kind is dict:
        return {k: snapshot(v) for k, v in value.items()}
    return copy.deepcopy(value)


def finite_json(value: Any, where: str, path: str = "") -> Any:
    """``value`` with every non-finite float (NaN, ±inf) replaced by None — strict JSON, which
    readers other than Python's accept — and one warning line on stderr per replaced field."""
    if isinstance(value, float) and not math.isfinite(value):
        print(f"warning: {where}: {path or 'value'} is {value}; written as null", file=sys.stderr)
        return None
    if isinstance(value, dict):
        return {
            k: finite_json(v, where, f"{path}.{k}" if path else str(k)) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [finite_json(v, where, f"{path}[{i}]") for i, v in enumerate(value)]
    return value


def _note_restored(path: Path, lines: list[str]) -> None:
    """Say so when ``metrics.jsonl`` lost rows the checkpoint has (they are restored)."""
    old = path.read_text().splitlines(keepends=True) if path.exists() else []
    if old[: len(lines)] != lines:
        print(
            f"note: {path} disagreed with the checkpoint (missing, truncated or damaged rows); "
            f"restored its {len(lines)} rows from the checkpoint",
            file=sys.stderr,
        )

"""What a run prints while its rounds play (``output.progress``): a tqdm bar on a terminal, one
line per round where stderr is not a terminal (a log file, CI, ``nohup``), so logs hold
readable lines instead of the carriage-return frames of a bar."""

from __future__ import annotations

import sys
from typing import Any, TextIO

from splitfl.config import ExperimentConfig
from splitfl.metrics.summary import format_value


class RoundLines:
    """The rounds ``first..total-1`` as an iterable printing ``<desc>: round k/N acc=...``
    to ``stream`` after each round (when :meth:`set_postfix` gives the round's figures)."""

    def __init__(self, first: int, total: int, desc: str, stream: TextIO):
        self.first, self.total, self.desc, self.stream = first, total, desc, stream
        self.done = first

    def __iter__(self):
        for r in range(self.first, self.total):
            yield r
            self.done = r + 1

    def set_postfix(self, **figures: str) -> None:
        """Print the line of the round just played (``done`` counts it once it is yielded
        back, so the line names round ``done + 1``)."""
        shown = " ".join(f"{k}={v}" for k, v in figures.items())
        print(f"{self.desc}: round {self.done + 1}/{self.total} {shown}", file=self.stream)
        self.stream.flush()

    def close(self) -> None:
        pass


def round_progress(
    config: ExperimentConfig, first: int, progress: bool | None, stream: TextIO | None = None
) -> Any:
    """The rounds with their progress display (``progress`` None: ``output.progress``):
    a tqdm bar named after the algorithm (and ``executor: parallel``'s workers:
    ``s2fl [2 workers, ray]``) when ``stream`` (stderr) is a terminal, else
    :class:`RoundLines`."""
    from tqdm import tqdm  # imported when a run starts (tqdm is not needed to import splitfl)

    stream = stream or sys.stderr
    show = config.output.progress if progress is None else progress
    desc = config.algorithm
    if config.executor == "parallel":
        desc += f" [{config.parallel.workers} workers, {config.parallel.backend}]"
    if show and not stream.isatty():
        return RoundLines(first, config.rounds, desc, stream)
    return tqdm(
        range(first, config.rounds),
        initial=first,
        total=config.rounds,
        desc=desc,
        disable=not show,
        leave=False,
        dynamic_ncols=True,
        file=stream,
    )


def round_figures(row: dict[str, Any], sim_time: float) -> dict[str, str]:
    """A round's figures for the display: test accuracy where evaluated, else the test loss
    (regression, language models), else the training loss; and the simulated time."""
    figures = {}
    for key, name in (("test_acc", "acc"), ("test_loss", "loss"), ("train_loss", "train_loss")):
        if row.get(key) is not None:
            figures[name] = f"{row[key]:.4g}" if key != "test_acc" else f"{row[key]:.3f}"
            break
    figures["sim"] = format_value(sim_time, "time")
    return figures

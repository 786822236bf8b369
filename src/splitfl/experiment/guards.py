"""Run guards: the loss explosion check (exit code 3 like NaN/inf) and interrupts.

Ctrl-C raises KeyboardInterrupt; :func:`sigterm_as_interrupt` turns SIGTERM into the same
path, so either records ``interrupted at round k`` in ``summary.json`` (see
:mod:`splitfl.experiment.runner`) and the CLI exits with code 130.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from splitfl.executors import NonFiniteLossError

__all__ = ["LossExplosionError", "RunInterrupted", "check_explosion", "sigterm_as_interrupt"]


class LossExplosionError(NonFiniteLossError):
    """The training loss stayed above ``train.explode_factor`` × the initial loss for
    ``train.explode_rounds`` rounds in a row: the run diverged without reaching NaN/inf."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a run; the message says where and how to resume it."""


def check_explosion(rows: list[dict[str, Any]], initial_loss: float | None, train) -> None:
    """Stop a run whose training loss exploded without becoming NaN/inf.

    Raises :class:`LossExplosionError` when the last ``train.explode_rounds`` rows all have
    ``train_loss > train.explode_factor * initial_loss``, where ``initial_loss`` is the test
    loss of the initial global model. (Not the first round's training loss: with a huge
    learning rate that is already exploded, e.g. 1.6e24 with ``lr=1e6`` on the quickstart.)
    ``explode_factor`` or ``explode_rounds`` 0/null disables the check.
    """
    factor, k = train.explode_factor, train.explode_rounds
    if not factor or not k or initial_loss is None or len(rows) < k:
        return
    limit = factor * initial_loss
    if all(r["train_loss"] > limit for r in rows[-k:]):
        raise LossExplosionError(
            f"train loss {rows[-1]['train_loss']:.3g} > {factor:g} x initial loss "
            f"{initial_loss:.3g} for {k} rounds (train.explode_factor, train.explode_rounds)"
        )


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt (the Ctrl-C path) while the body runs; signal
    handlers can only be set in the main thread, elsewhere nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

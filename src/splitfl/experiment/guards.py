"""Run guards: the loss explosion check (exit code 3 like NaN/inf) and interrupts.

Ctrl-C raises KeyboardInterrupt; :func:`sigterm_as_interrupt` turns SIGTERM into the same
path, so either records ``interrupted at round k`` in ``summary.json`` (see
:mod:`splitfl.experiment.runner`) and the CLI exits with code 130.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from splitfl.executors import NonFiniteLossError

__all__ = ["LossExplosionError", "RunInterrupted", "check_explosion", "sigterm_as_interrupt"]


class LossExplosionError(NonFiniteLossError):
    """The training loss exploded without becoming NaN/inf: it stayed above
    ``train.explode_factor`` × the initial loss for ``train.explode_rounds`` rounds in a row, or
    it went above that once and did not come back below ``train.explode_recovery`` × the
    initial loss within ``train.explode_rounds`` rounds."""


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM stopped a run; the message says where and how to resume it."""


def check_explosion(rows: list[dict[str, Any]], initial_loss: float | None, train) -> None:
    """Stop a run whose training loss exploded without becoming NaN/inf.

    With ``L0`` the test loss of the initial global model (not the first round's training
    loss: with a huge learning rate that is already exploded, e.g. 1.6e24 with ``lr=1e6`` on
    the quickstart), raises :class:`LossExplosionError` when

    * the last ``train.explode_rounds`` rows all have a training loss ``> explode_factor · L0``,
      or
    * a row had a training loss ``> explode_factor · L0`` and the ``explode_rounds`` rows after it
      all stayed above ``explode_recovery · L0``: the model blew up and stayed broken (e.g.
      ``lr=300`` on the quickstart: 1e20, 2e23, then 40–75 × L0 at chance accuracy). A model
      that comes back after a spike retrains from about ``L0``, far below that.

    The training loss of a row is the lower median of its clients' mean losses
    (``train_loss_median``): a device reporting maximal losses cannot stop a run that trains
    well (issue 35, item 5); a real explosion raises every client's loss, and the median with
    it. ``explode_factor`` or ``explode_rounds`` 0/null disables both; ``explode_recovery``
    0/null the second.
    """
    factor, k, recovery = train.explode_factor, train.explode_rounds, train.explode_recovery
    if not factor or not k or initial_loss is None or len(rows) < k:
        return
    # the lower median of the clients' losses (a device reporting huge losses moves it no
    # more than its rank: it takes half the clients); rows from before it: the mean. A round
    # every client was dropped from has no training loss (null): it counts as not exploded
    losses = [_robust_loss(r) for r in rows]
    limit = factor * initial_loss
    if all(loss > limit for loss in losses[-k:]):
        raise LossExplosionError(
            f"train loss {losses[-1]:.3g} > {factor:g} x initial loss "
            f"{initial_loss:.3g} for {k} rounds (train.explode_factor, train.explode_rounds)"
        )
    blown = [i for i, loss in enumerate(losses) if loss > limit]
    after = losses[blown[-1] + 1 :] if blown else []
    if recovery and len(after) >= k and all(loss > recovery * initial_loss for loss in after):
        raise LossExplosionError(
            f"train loss went above {factor:g} x initial loss {initial_loss:.3g} in round "
            f"{blown[-1] + 1} and stayed above {recovery:g} x for {len(after)} rounds (now "
            f"{losses[-1]:.3g}; train.explode_factor, train.explode_recovery, "
            "train.explode_rounds)"
        )


def _robust_loss(row: dict[str, Any]) -> float:
    loss = row.get("train_loss_median", row["train_loss"])
    return -math.inf if loss is None else loss


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

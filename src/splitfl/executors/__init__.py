"""Executors: the per-batch SFL loop that runs a :class:`~splitfl.core.plan.RoundPlan`.

Every executor has ``run_round(ctx, global_state, plan, round_seed) -> RoundResult`` and must
return the same result for the same plan: :class:`SequentialExecutor` is the reference,
:class:`VectorizedExecutor` batches the clients of a step into one computation.
:class:`TimingExecutor` trains nothing: it returns the plan's sample counts so that the clock
prices the round (time, traffic, waiting) in seconds at any model size.
:class:`ParallelExecutor` deals a round's independent units (its groups) to worker processes or
Ray actors and returns what the sequential executor returns, bit for bit. Executors
import the round contract (:mod:`splitfl.core.plan`), the models and the system layer, never an
algorithm or the experiment.
"""

from __future__ import annotations

from splitfl.executors.parallel import ParallelExecutor
from splitfl.executors.pools import WorkersLostError
from splitfl.executors.sequential import SequentialExecutor
from splitfl.executors.timing import TimingExecutor
from splitfl.executors.vectorized import VectorizedExecutor
from splitfl.roles.common import PRECISIONS, NonFiniteLossError, evaluate

#: ``executor`` values: the reference loop, the batched one (``executors/vectorized.py``), the
#: clock alone, no training (``executors/timing.py``), and units on workers
#: (``executors/parallel.py``; the experiment passes it the config's ``parallel`` section).
EXECUTORS = {
    "sequential": SequentialExecutor,
    "vectorized": VectorizedExecutor,
    "timing": TimingExecutor,
    "parallel": ParallelExecutor,
}


def make_executor(
    name: str, device: str = "cpu", precision: str = "fp32", channels_last: bool = False
):
    """The executor named by the config's ``executor`` on ``device``."""
    return EXECUTORS[name](device, precision, channels_last)


__all__ = [
    "EXECUTORS",
    "PRECISIONS",
    "NonFiniteLossError",
    "ParallelExecutor",
    "SequentialExecutor",
    "TimingExecutor",
    "VectorizedExecutor",
    "WorkersLostError",
    "evaluate",
    "make_executor",
]

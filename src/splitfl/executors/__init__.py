"""Executors: the per-batch SFL loop that runs a :class:`~splitfl.core.plan.RoundPlan`.

Every executor has ``run_round(ctx, global_state, plan, round_seed) -> RoundResult`` and must
return the same result for the same plan: :class:`SequentialExecutor` is the reference,
:class:`VectorizedExecutor` batches the clients of a step into one computation.
:class:`TimingExecutor` trains nothing: it returns the plan's sample counts so that the clock
prices the round (time, traffic, waiting) in seconds at any model size.
:class:`ParallelExecutor` deals a round's independent units (its groups) to worker processes or
Ray actors and returns what the sequential executor returns, bit for bit. Executors
import the round contract (:mod:`splitfl.core.plan`), the models and the system layer, never an
algorithm or the experiment. The one table of every ``executor`` value, the networked one
included, is :data:`splitfl.experiment.runtimes.RUNTIMES`.
"""

from __future__ import annotations

from splitfl.executors.parallel import ParallelExecutor
from splitfl.executors.pools import WorkersLostError
from splitfl.executors.sequential import SequentialExecutor
from splitfl.executors.timing import TimingExecutor
from splitfl.executors.vectorized import VectorizedExecutor
from splitfl.roles.common import PRECISIONS, NonFiniteLossError, evaluate

__all__ = [
    "PRECISIONS",
    "NonFiniteLossError",
    "ParallelExecutor",
    "SequentialExecutor",
    "TimingExecutor",
    "VectorizedExecutor",
    "WorkersLostError",
    "evaluate",
]

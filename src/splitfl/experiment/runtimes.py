"""The one registry of runtimes: every value of the config's ``executor``, what it is, and how
a run builds it.

In-process executors live in :mod:`splitfl.executors`, the networked one in
:mod:`splitfl.net.server.executor`; this registry sits above both (the experiment layer), so
validation, ``splitfl list`` and the round loop read one table and no caller names a runtime by
hand.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from splitfl.config import ExperimentConfig
from splitfl.executors import (
    ParallelExecutor,
    SequentialExecutor,
    TimingExecutor,
    VectorizedExecutor,
)
from splitfl.net.server.executor import NetworkedExecutor


@dataclass(frozen=True)
class Runtime:
    """One ``executor`` value.

    ``build(config, device)`` makes the executor; ``trains_here`` is true for the runtimes
    whose training runs in this process (their optimisers are imported up front);
    ``description`` is the line ``splitfl list`` prints.
    """

    description: str
    build: Callable[[ExperimentConfig, str], object]
    trains_here: bool


def _local(cls: type) -> Callable[[ExperimentConfig, str], object]:
    """The builder of an in-process executor that takes ``(device, precision, channels_last)``."""
    return lambda config, device: cls(device, config.precision, config.channels_last)


RUNTIMES: dict[str, Runtime] = {
    "sequential": Runtime(
        "reference loop: one client after another (the papers' own code)",
        _local(SequentialExecutor),
        trains_here=True,
    ),
    "vectorized": Runtime(
        "clients batched as rows of stacked parameters (vmap on GPUs; the reference loop on "
        "CPU unless forced); same results",
        _local(VectorizedExecutor),
        trains_here=True,
    ),
    "networked": Runtime(
        "a server process and device processes over gRPC (splitfl server / device / launch); "
        "parameter-server algorithms; measured time and bytes",
        NetworkedExecutor,
        trains_here=False,
    ),
    "timing": Runtime(
        "no training: the clock prices each round's plan (time, traffic, waiting) at any "
        "model size in seconds; no accuracy",
        _local(TimingExecutor),
        trains_here=False,
    ),
    "parallel": Runtime(
        "a round's groups dealt to persistent workers (processes or Ray actors; "
        "parallel: {workers, backend, ...}); same results as sequential",
        lambda config, device: ParallelExecutor(
            device, config.precision, config.channels_last, config.parallel
        ),
        trains_here=False,
    ),
}


def build_runtime(config: ExperimentConfig, device: str):
    """The executor named by ``config.executor`` (validated against :data:`RUNTIMES`)."""
    return RUNTIMES[config.executor].build(config, device)

"""What an algorithm reads of the federation: a small typed view of the run.

An algorithm is built with ``(options, view)``; the experiment hands it its run context
(:class:`~splitfl.experiment.context.RunContext`), which has every member below, and an
algorithm reads nothing else of it (``tests/test_architecture.py`` checks each ``ctx.<name>``
an algorithm module reads against this protocol). Algorithms never import the experiment.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import numpy as np

from splitfl.config import ExperimentConfig
from splitfl.data.base import DatasetBundle
from splitfl.models import BlockModel
from splitfl.models.profile import ModelProfile
from splitfl.system.devices import Population


class FederationView(Protocol):
    """The run as an algorithm sees it."""

    #: The validated experiment config (``train``, ``devices``, ``seed``, options).
    config: ExperimentConfig
    #: The data (input shape, classes, the train samples in-process).
    bundle: DatasetBundle
    #: Each client's sample positions in ``bundle.train``.
    client_indices: list[np.ndarray]
    #: Each client's label histogram (clients × classes).
    label_hist: np.ndarray
    #: The devices' profiles by round, and the server's.
    population: Population
    #: The run's model (cut points, default cut, blocks).
    model: BlockModel
    #: The model's per-block costs (FLOPs, bytes).
    profile: ModelProfile
    #: Where computations on a client's own samples run (networked: on its device; None:
    #: this process).
    client_compute: Any
    #: Networked runs: the clients whose device is connected now (None: every client).
    reachable: Callable[[], set[int]] | None

    @property
    def num_clients(self) -> int: ...

    @property
    def num_blocks(self) -> int: ...

    @property
    def cut_points(self) -> tuple[int, ...]: ...

    @property
    def data_sizes(self) -> np.ndarray: ...

    def local_steps(self, client: int, batch_size: int | None = None) -> int: ...

    def lr_at(self, round_idx: int) -> float: ...

    def round_samples(self, client: int, batch_size: int, steps: int) -> int: ...

    def resolve_cut(self, cut: int | None, algorithm: str) -> int: ...


#: The members of :class:`FederationView` (what ``tests/test_architecture.py`` allows).
VIEW_MEMBERS = frozenset(
    {name for name in FederationView.__annotations__}
    | {name for name in vars(FederationView) if not name.startswith("_")}
)

"""The peer benchmark's workload, shared by every runner (``bench_peers.py``).

It imports only torch and numpy, so each framework's own virtual environment runs it: the
model (:func:`build_model`), the workload file (data, partition and the round schedule,
written once by ``bench_peers.py`` from splitfl's seeded streams: each round's clients and
the seeds of their shuffles), and what a runner reports
(:class:`Report`: set-up time, each round's time and test accuracy, the final model).

The workload: scikit-learn digits (splitfl's ``digits`` tensors), 100 clients from a
Dirichlet α = 0.5 split, 10 per round, batch 16, one local epoch, SGD lr 0.05, test
evaluation every round, 30 rounds, one torch thread; a small CNN (conv 1→16, conv 16→32,
max-pool, linear 512→10) whose initial weights come from a fixed seed, identical wherever it
is built.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

SEED, ROUNDS, NUM_CLIENTS, PER_ROUND, BATCH, LR = 0, 30, 100, 10, 16, 0.05
#: rounds left out of the steady-state median (the first rounds pay one-off costs)
WARM = 5
#: the workload file's name in the data folder
FILE = "workload.npz"
#: environment: the launch time (``time.time()`` in the parent) and the report's path
LAUNCH_ENV, OUT_ENV = "PEERS_LAUNCH", "PEERS_OUT"


def build_model(input_shape: tuple[int, ...] = (1, 8, 8), num_classes: int = 10) -> nn.Sequential:
    """conv 1→16, conv 16→32, max-pool, linear 512→10, initialised from torch's stream
    seeded with :data:`SEED` (forked: the caller's stream is left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(SEED)
        return nn.Sequential(
            nn.Conv2d(input_shape[0], 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * (input_shape[1] // 2) * (input_shape[2] // 2), num_classes),
        )


@dataclass
class Workload:
    """The data (train: ``x``, ``y``, ``writers`` = the client of each sample; test) and the
    schedule: ``chosen[r]`` the clients of round ``r``, ``seeds[r][i]`` the seed of client
    ``chosen[r][i]``'s shuffle in round ``r``."""

    x: torch.Tensor
    y: torch.Tensor
    writers: np.ndarray
    x_test: torch.Tensor
    y_test: torch.Tensor
    chosen: list[list[int]]
    seeds: list[list[int]]
    parts: list[torch.Tensor] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.parts = [
            torch.from_numpy(np.flatnonzero(self.writers == c)) for c in range(NUM_CLIENTS)
        ]

    def batches(self, r: int, c: int) -> list[torch.Tensor]:
        """Client ``c``'s mini-batches in round ``r``: its samples shuffled by a generator
        seeded with its seed (as splitfl's ``client_batches`` shuffles), in :data:`BATCH`s."""
        seed = self.seeds[r][self.chosen[r].index(c)]
        idx = self.parts[c]
        gen = torch.Generator().manual_seed(seed)
        return list(idx[torch.randperm(len(idx), generator=gen)].split(BATCH))

    def client_rounds(self, r: int) -> list[tuple[int, list[torch.Tensor]]]:
        """Round ``r`` for :func:`plain_loop.fedavg_rounds`: (|D_c|, batches) per client."""
        return [(len(self.parts[c]), self.batches(r, c)) for c in self.chosen[r]]


def write_workload(folder: Path, arrays: dict[str, np.ndarray], chosen, seeds) -> Path:  # noqa: ANN001
    """Write the workload file: ``arrays`` (x, y, writers, x_test, y_test), the rounds'
    clients ``chosen[r]`` and their shuffles' seeds ``seeds[r]``."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / FILE
    np.savez(path, chosen=np.asarray(chosen), seeds=np.asarray(seeds, dtype=np.int64), **arrays)
    return path


def read_workload(folder: Path) -> Workload:
    """The workload written by :func:`write_workload` into ``folder``."""
    with np.load(Path(folder) / FILE) as f:
        return Workload(
            torch.from_numpy(f["x"]),
            torch.from_numpy(f["y"]),
            f["writers"],
            torch.from_numpy(f["x_test"]),
            torch.from_numpy(f["y_test"]),
            f["chosen"].tolist(),
            f["seeds"].tolist(),
        )


@dataclass
class Report:
    """What a runner measures, written as JSON to ``$PEERS_OUT``: the set-up (launch to the
    start of round 1), each round's time and test accuracy, the 30 rounds' wall time."""

    framework: str
    version: str
    start: float | None = None
    round_s: list[float] = field(default_factory=list)
    #: each round's CPU time of this process (``time.process_time``): less sensitive to other
    #: processes on a shared machine than wall time; None where the work runs in other
    #: processes (Flower's Ray actor)
    round_cpu_s: list[float] | None = field(default_factory=list)
    acc: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)
    _last: tuple[float, float] = (0.0, 0.0)

    def rounds_begin(self) -> None:
        """Round 1 starts now."""
        self.start = time.time()
        self._last = (time.perf_counter(), time.process_time())

    def round_end(self, acc: float) -> None:
        """A round ended now with test accuracy ``acc``: its wall and CPU time."""
        now = (time.perf_counter(), time.process_time())
        self.round_s.append(now[0] - self._last[0])
        if self.round_cpu_s is not None:
            self.round_cpu_s.append(now[1] - self._last[1])
        self.acc.append(acc)
        self._last = now

    def write(self, end: float | None = None) -> None:
        """Write the report (``end``: when the last round ended; default now)."""
        end = time.time() if end is None else end
        launched = float(os.environ.get(LAUNCH_ENV, self.start or end))
        out = {
            "framework": self.framework,
            "version": self.version,
            "torch": torch.__version__,
            "setup_s": (self.start or end) - launched,
            "rounds_wall_s": end - (self.start or end),
            "round_s": self.round_s,
            "round_cpu_s": self.round_cpu_s,
            "acc": self.acc,
            **self.extra,
        }
        Path(os.environ[OUT_ENV]).write_text(json.dumps(out) + "\n")


def save_final(state: dict[str, torch.Tensor]) -> None:
    """The final model beside the report (``$PEERS_OUT`` with ``.pt``), under the keys of
    :func:`build_model`'s state dict."""
    torch.save({k: v.detach().clone() for k, v in state.items()}, os.environ[OUT_ENV] + ".pt")

"""Trial backends: how a sweep's trials run. Both call :func:`~splitfl.sweeps.trial.run_trial`
(so their outputs are identical):

* ``local``: trials one after another in this process;
* ``ray``: one Ray task per trial with fractional CPU/GPU resources, on a local Ray instance
  (default) or an existing cluster (``address``); the index is updated as each finishes.

(Not to be confused with the config field ``executor``, the training engine each trial uses.)
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from splitfl.ray_cluster import import_ray, join_ray
from splitfl.sweeps.spec import Trial
from splitfl.sweeps.trial import run_trial

#: The trial backends (``splitfl sweep --backend``).
BACKENDS = ("ray", "local")

Job = tuple[Trial, Path]
OnDone = Callable[[Trial, dict[str, Any]], None]


def run_local(jobs: list[Job], on_start: Callable[[Trial], None], on_done: OnDone) -> None:
    """Trials one after another in this process."""
    for trial, run_dir in jobs:
        on_start(trial)
        on_done(trial, run_trial(trial.config.to_dict(), str(run_dir)))


def run_ray(
    jobs: list[Job],
    on_start: Callable[[Trial], None],
    on_done: OnDone,
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
) -> None:
    """One Ray task per trial (``num_cpus``/``num_gpus`` per task), gathered with
    ``ray.wait`` as they finish. Uses a running Ray instance if this process has one,
    else connects to ``address`` (``auto``, ``ray://host:10001``) or starts a local one."""
    ray = import_ray()
    started = join_ray(ray, address)
    try:
        task = ray.remote(run_trial).options(
            num_cpus=cpus_per_trial, num_gpus=gpus_per_trial, max_retries=0
        )
        pending = {}
        for trial, run_dir in jobs:
            ref = task.remote(trial.config.to_dict(), str(run_dir.resolve()))
            pending[ref] = trial
            on_start(trial)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            trial = pending.pop(ready[0])
            try:
                outcome = ray.get(ready[0])
            except Exception as err:  # noqa: BLE001 - e.g. a worker that crashed
                outcome = {"status": "failed", "action": "ray", "error": f"ray: {err}"}
            on_done(trial, outcome)
    finally:
        if started:
            ray.shutdown()

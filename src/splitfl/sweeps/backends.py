"""Trial backends: how a sweep's trials run. Both call :func:`~splitfl.sweeps.trial.run_trial`
(so their outputs are identical):

* ``local``: trials one after another in this process;
* ``ray``: one Ray task per trial with fractional CPU/GPU resources (and a trial's parallel
  workers reserved with it: :mod:`splitfl.sweeps.resources`), on a local Ray instance
  (default) or an existing cluster (``address``); the index is updated as each finishes.

(Not to be confused with the config field ``executor``, the training engine each trial uses.)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from splitfl.extensions import modules_to_ship
from splitfl.ray_cluster import import_ray, join_ray
from splitfl.sweeps.resources import check_fits, cluster_nodes, reserve, trial_demand
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


def runtime_env(jobs: list[Job]) -> dict[str, Any] | None:
    """The Ray runtime environment of the trials: the user modules their configs import that
    are not installed packages (:func:`~splitfl.extensions.modules_to_ship`), shipped as
    ``py_modules`` so a worker on any machine imports them (each trial imports its config's
    modules before it is checked); None when there are none. It is the job's environment
    (``ray.init``: Ray uploads local paths only there); a Ray instance started before the
    sweep keeps its own (workers on this machine still find the modules through the
    config's ``import_dirs``; elsewhere pass ``runtime_env={"py_modules": [...]}`` to
    ``ray.init``)."""
    configs = [trial.config for trial, _ in jobs if trial.config is not None]
    modules = list(dict.fromkeys(path for cfg in configs for path in modules_to_ship(cfg)))
    return {"py_modules": modules} if modules else None


def run_ray(
    jobs: list[Job],
    on_start: Callable[[Trial], None],
    on_done: OnDone,
    address: str | None = None,
    cpus_per_trial: float = 1.0,
    gpus_per_trial: float = 0.0,
) -> None:
    """One Ray task per trial, reserving what the trial needs (its driver's
    ``num_cpus``/``num_gpus``, and its workers with ``executor: parallel``:
    :mod:`splitfl.sweeps.resources`), gathered with ``ray.wait`` as they finish. Uses a
    running Ray instance if this process has one, else connects to ``address`` (``auto``,
    ``ray://host:10001``) or starts a local one. A trial that cannot fit the cluster is a
    one-line ConfigError before any trial starts."""
    ray = import_ray()
    started = join_ray(ray, address, runtime_env(jobs), field="--address")
    groups = []
    try:
        demands = [trial_demand(t.config, cpus_per_trial, gpus_per_trial) for t, _ in jobs]
        nodes = cluster_nodes(ray)
        for (trial, _), demand in zip(jobs, demands, strict=True):
            check_fits(nodes, demand, trial.name)
        task = ray.remote(run_trial)
        pending = {}
        for (trial, run_dir), demand in zip(jobs, demands, strict=True):
            options, group = reserve(ray, demand)
            ref = task.options(max_retries=0, **options).remote(
                trial.config.to_dict(), str(run_dir.resolve())
            )
            pending[ref] = (trial, group)
            groups.append(group)
            on_start(trial)
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            trial, group = pending.pop(ready[0])
            try:
                outcome = ray.get(ready[0])
            except Exception as err:  # noqa: BLE001 - e.g. a worker that crashed
                outcome = {"status": "failed", "action": "ray", "error": f"ray: {err}"}
            release(ray, group)
            on_done(trial, outcome)
    finally:
        for group in groups:
            release(ray, group)
        if started:
            ray.shutdown()


def release(ray: Any, group: Any) -> None:
    """Remove a trial's placement group (None: it has none; removing twice is harmless)."""
    if group is not None:
        with contextlib.suppress(Exception):
            ray.util.remove_placement_group(group)

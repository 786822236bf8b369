"""What a sweep trial reserves on Ray, so that trials holding workers neither oversubscribe
the cluster nor wait for each other's workers forever.

A trial's Ray task runs its driver (the experiment loop) with ``--cpus-per-trial`` CPUs and
``--gpus-per-trial`` GPUs. A trial with ``executor: parallel`` reserves its workers together
with its driver, all at once, so it starts only when every one of its workers has room:

* ``parallel.backend: local``: the worker processes run inside the trial's task, whose request
  grows by ``workers × threads`` CPUs and ``workers × gpus_per_worker`` GPUs;
* ``parallel.backend: ray``: the trial reserves a placement group — one bundle for its driver,
  one per worker actor (``threads`` CPUs, ``gpus_per_worker`` GPUs) — and its task runs in
  the group, which captures the actors the task starts; they are on the sweep's cluster
  (:func:`~splitfl.ray_cluster.join_ray` uses the Ray instance the task runs in, whatever
  ``parallel.address`` says).

Reserving only the driver is not enough: Ray lends a task's CPUs out while it waits, so two
trials holding one CPU each of two could each place one of their two worker actors and wait
for the second until ``parallel.timeout_s``. The driver waits while its workers train, so a
small ``--cpus-per-trial`` (0.5) is enough for a parallel trial. A trial that needs more than
the cluster has can never start: :func:`check_fits` refuses it in one line before any trial
runs (on an autoscaling cluster, start the nodes first).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from splitfl.config import ConfigError, ExperimentConfig

Bundle = dict[str, float]


@dataclass(frozen=True)
class Demand:
    """A trial's reservation: its task's ``driver`` resources (with a local pool's workers)
    and one bundle per Ray worker actor."""

    driver: Bundle
    workers: list[Bundle] = field(default_factory=list)
    why: str = ""  # how the CPUs add up, for messages

    def total(self) -> Counter:
        out: Counter = Counter(self.driver)
        for bundle in self.workers:
            out.update(bundle)
        return out


def bundle(cpus: float, gpus: float) -> Bundle:
    """Ray resources, zeros left out; GPUs above one rounded up to whole GPUs (Ray takes
    fractions of one GPU only)."""
    gpus = math.ceil(gpus) if gpus > 1 else gpus
    return {k: v for k, v in (("CPU", cpus), ("GPU", gpus)) if v > 0}


def trial_demand(config: ExperimentConfig, cpus: float, gpus: float) -> Demand:
    """What a trial of ``config`` reserves, its driver getting ``cpus`` CPUs and ``gpus``
    GPUs (``--cpus-per-trial``, ``--gpus-per-trial``)."""
    if config.executor != "parallel":
        return Demand(bundle(cpus, gpus))
    p = config.parallel
    why = f"{cpus:g} for its driver + {p.workers} workers × {p.threads}"
    if p.backend == "local":
        driver = bundle(cpus + p.workers * p.threads, gpus + p.workers * p.gpus_per_worker)
        return Demand(driver, why=why)
    return Demand(bundle(cpus, gpus), [bundle(p.threads, p.gpus_per_worker)] * p.workers, why)


def reservation_note(demands: list[Demand]) -> str:
    """What the sweep's first line adds where trials hold workers: ``; a parallel trial
    reserves 3 CPUs (1 for its driver + 2 workers × 1)`` ("" where none does)."""
    notes = dict.fromkeys(f"{d.total()['CPU']:g} CPUs ({d.why})" for d in demands if d.why)
    return f"; a parallel trial reserves {' or '.join(notes)}" if notes else ""


def check_fits(nodes: list[Bundle], demand: Demand, trial: str) -> None:
    """One-line ConfigError unless ``demand`` fits the cluster whose live nodes have the
    resources ``nodes``: in all (the placement group may span nodes) and bundle by bundle
    (a bundle is on one node)."""
    have: Counter = Counter()
    for node in nodes:
        have.update({k: node.get(k, 0.0) for k in ("CPU", "GPU")})
    for kind, need in sorted(demand.total().items()):
        flag = "--cpus-per-trial" if kind == "CPU" else "--gpus-per-trial"
        why = f" ({demand.why})" if demand.why and kind == "CPU" else ""
        if need > have[kind] + 1e-9:
            raise ConfigError(
                flag,
                f"trial {trial} needs {need:g} {kind}s{why} but the Ray cluster has "
                f"{have[kind]:g}; lower {flag}, parallel.workers or parallel.threads",
            )
    for one in [demand.driver, *demand.workers]:
        if one and not any(all(n.get(k, 0.0) >= v for k, v in one.items()) for n in nodes):
            raise ConfigError("--cpus-per-trial", f"trial {trial}: no Ray node has {one}")


def cluster_nodes(ray: Any) -> list[Bundle]:
    """The resources of the cluster's live nodes."""
    return [dict(n["Resources"]) for n in ray.nodes() if n.get("Alive", True)]


def reserve(ray: Any, demand: Demand) -> tuple[dict[str, Any], Any]:
    """The Ray task options of a trial and its placement group (None without Ray workers):
    the driver's bundle first, the task in it (or anywhere in the group if it asks for
    nothing), the actors it starts captured into the group."""
    options: dict[str, Any] = {
        "num_cpus": demand.driver.get("CPU", 0),
        "num_gpus": demand.driver.get("GPU", 0),
    }
    if not demand.workers:
        return options, None
    bundles = [demand.driver, *demand.workers] if demand.driver else demand.workers
    group = ray.util.placement_group(bundles, strategy="PACK")
    in_group = ray.util.scheduling_strategies.PlacementGroupSchedulingStrategy
    options["scheduling_strategy"] = in_group(
        group,
        placement_group_bundle_index=0 if demand.driver else -1,
        placement_group_capture_child_tasks=True,
    )
    return options, group

"""The clients' data view of a run (``clients.json``) and, with ``data.source: devices``, its
adoption from what the devices announced when they joined (``devices.json``).

With the devices' own data the server knows a client's data only by its device's announcement:
sample count and label histogram (validated by :mod:`splitfl.net.transport.announce`). Once the
networked executor has every client's announcement, :func:`adopt_device_data` puts them into
the run's context — every sample-weighted aggregation, S²FL's data-balance grouping and
MergeSFL's / ParallelSFL's KL terms read ``ctx.data_sizes`` / ``ctx.label_hist`` — and
rebuilds the algorithm on them. A resumed run keeps the view it started with: the devices
must announce the same sample counts (the plan's step counts depend on them).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from splitfl.config import ConfigError, ExperimentConfig
from splitfl.core.atomic import write_atomic
from splitfl.data.base import DatasetWarning
from splitfl.net.transport.announce import capped_counts, scaled_histogram

if TYPE_CHECKING:
    from splitfl.experiment.context import Prepared, RunContext


def write_clients(ctx: RunContext, path: Path) -> None:
    """``clients.json``: each client's sample count, label histogram and device profile."""
    clients = [
        {
            "client": c,
            "samples": int(ctx.data_sizes[c]),
            "label_histogram": ctx.label_hist[c].tolist(),
            "device": ctx.population.devices[c].to_dict(),
        }
        for c in range(ctx.num_clients)
    ]
    write_atomic(path, json.dumps({"server": ctx.population.server.to_dict(), "clients": clients}))


def adopt_device_data(prep: Prepared, executor, run_dir: Path, resuming: bool) -> None:
    """``data.source: devices``: the announced sample counts and histograms become the run's
    data view (``clients.json``), the algorithm is rebuilt on them, and ``devices.json``
    records which device provided which clients. Resuming, the recorded view stays."""
    if prep.config.data.source != "devices":
        return
    announced = executor.announced()  # client -> Announced, every client present
    n = prep.ctx.num_clients
    sizes, capped = _capped(prep.config, announced)
    hist = np.array(  # a capped client's histogram scaled down with it; others as announced
        [
            scaled_histogram(a.histogram, sizes[c]) if c in capped else list(a.histogram)
            for c, a in ((c, announced[c]) for c in range(n))
        ],
        dtype=np.int64,
    )
    for c, note in capped.items():
        warnings.warn(DatasetWarning(f"client {c} ({announced[c].device}): {note}"), stacklevel=2)
    if resuming:
        sizes, hist = _recorded(run_dir / "clients.json", sizes, hist)
    prep.ctx.adopt_announced(sizes, hist)
    prep.algorithm = type(prep.algorithm)(prep.algorithm.options, prep.ctx)
    write_clients(prep.ctx, run_dir / "clients.json")
    write_devices(prep.config, executor, run_dir, [])


def write_devices(config: ExperimentConfig, executor, run_dir: Path, rows: list[dict]) -> None:
    """``data.source: devices``: ``devices.json`` — which device provides which clients
    (their latest announcements) and, per round, which device trained which client (the
    rows' ``measured_device``): a device that took over another's clients shows from the
    round it trained them. Rewritten after every round (the rows are the checkpoint's, so a
    resumed run keeps the history)."""
    if config.data.source != "devices":
        return
    announced = executor.announced()
    record = _record(announced, _capped(config, announced)[1])
    record["rounds"] = [
        {"round": row.get("round", r), "trained": _trainers(row)}
        for r, row in enumerate(rows)
        if row.get("measured_device")
    ]
    write_atomic(run_dir / "devices.json", json.dumps(record, indent=1) + "\n")


def _capped(config: ExperimentConfig, announced: dict) -> tuple[list[int], dict[int, str]]:
    """The announced sample counts (clients 0..n-1) capped against their median
    (``network.bounds.peer_samples_factor``:
    :func:`~splitfl.net.transport.announce.capped_counts`)."""
    sizes = [announced[c].samples for c in range(len(announced))]
    return capped_counts(sizes, config.network.bounds.peer_samples_factor)


def _trainers(row: dict) -> dict[str, list[int]]:
    """A metrics row's device name → the clients it trained that round."""
    out: dict[str, list[int]] = {}
    for c, device in zip(row["clients"], row["measured_device"], strict=True):
        if device is not None:
            out.setdefault(device, []).append(c)
    return dict(sorted(out.items()))


def _record(announced: dict, capped: dict[int, str]) -> dict:
    """``devices.json``: device name → its clients with what it announced (and, for a count
    capped against the others', why)."""
    devices: dict[str, list[dict]] = {}
    for c, a in sorted(announced.items()):
        entry = {"client": c, "samples": a.samples, "label_histogram": list(a.histogram)}
        entry["histogram_epsilon"] = a.epsilon
        if c in capped:
            entry["capped"] = capped[c]
        devices.setdefault(a.device, []).append(entry)
    return {"devices": [{"name": k, "clients": v} for k, v in sorted(devices.items())]}


def _recorded(path: Path, sizes: list[int], hist: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The view the run started with (its ``clients.json``), if the announced sample counts
    still match it; a one-line ConfigError otherwise."""
    try:
        rows = json.loads(path.read_text())["clients"]
        old = [int(r["samples"]) for r in rows]
        old_hist = np.array([r["label_histogram"] for r in rows], dtype=np.int64)
    except (OSError, ValueError, KeyError, TypeError):
        return sizes, hist  # stopped before its first round: a fresh view
    if old_hist.shape != hist.shape:
        raise ConfigError("--resume", f"{path}: {old_hist.shape} histograms, not {hist.shape}")
    if old != sizes:
        diff = next(c for c in range(len(sizes)) if old[c] != sizes[c])
        got = old[diff]
        raise ConfigError(
            "--resume",
            f"client {diff}'s device announced {sizes[diff]} samples; the run started with "
            f"{got} (resume with the same devices and data)",
        )
    return sizes, old_hist

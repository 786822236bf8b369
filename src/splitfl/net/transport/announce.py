"""What a device with its own data announces when it joins (``data.source: devices``), and how
the server checks it.

After the server's welcome (which names the model's input shape and class count), a device
running with ``--data`` sends, in its ``ready`` message, ``data``::

    {"input_shape": [1, 8, 8], "epsilon": null | ε,
     "clients": [{"client": 3, "samples": 120, "histogram": [12, 0, ..., 9]}, ...]}

one entry per hosted client, the histogram of length ``num_classes``. Nothing else of its
data leaves the device until training (smashed data and labels, model parts). The server
validates every value before use (:func:`check_announcement`): JSON types, the input shape
against its model's, one entry per hosted client, counts that are non-negative integers
below :data:`MAX_SAMPLES`, histograms of exactly the model's class count (summing to the
sample count when exact). A device whose data does not fit the model says so in one line
(:func:`data_mismatch`) and exits 2; the server logs the same line.

Histogram noise (``network.histogram_epsilon`` or the device's ``--histogram-epsilon``; the
smaller ε wins): each count gets Laplace noise of scale 1/ε, then is rounded and clamped at 0
(:func:`noisy_histogram`). One sample changes one count by 1 (L1 sensitivity 1), so the
announced histogram is ε-differentially private with respect to adding or removing one of the
device's samples (rounding and clamping are post-processing). The sample count itself is sent
exactly — the server needs it to plan step counts and weight aggregation. The noise is drawn
from the device's own seed (``--noise-seed``, else fresh OS entropy): a seed the server knew
would let it subtract the noise.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from splitfl.core.seeding import derive_seed

#: Largest sample count (and histogram entry) a device may announce for one client.
MAX_SAMPLES = 10**9


class AnnouncementError(ValueError):
    """An announcement the server refuses; ``str(err)`` is one line."""


@dataclass(frozen=True)
class Announced:
    """One client's announced data, as the server keeps it."""

    device: str
    samples: int
    histogram: tuple[int, ...]
    epsilon: float | None


def label_histogram(y: np.ndarray, num_classes: int) -> np.ndarray:
    """Per-class sample counts of labels ``y`` (every label < ``num_classes``)."""
    return np.bincount(np.asarray(y, dtype=np.int64), minlength=num_classes)


def noisy_histogram(hist: np.ndarray, epsilon: float, seed: int) -> np.ndarray:
    """``hist`` + Laplace(0, 1/ε) per count, rounded and clamped at 0 (ε-DP, sensitivity 1);
    the same ``seed`` gives the same noise."""
    rng = np.random.default_rng(seed)
    noise = rng.laplace(0.0, 1.0 / epsilon, size=len(hist))
    return np.maximum(np.rint(np.asarray(hist, dtype=np.float64) + noise), 0).astype(np.int64)


def effective_epsilon(server: float | None, device: float | None) -> float | None:
    """The ε a device applies: the smaller (more private) of the server's and its own."""
    given = [e for e in (server, device) if e is not None]
    return min(given) if given else None


def data_mismatch(input_shape: Sequence[int], labels_max: int, spec: dict) -> str | None:
    """What makes a device's data unfit for the server's model (one line), or None."""
    want, classes = tuple(spec["input_shape"]), int(spec["num_classes"])
    if tuple(input_shape) != want:
        return f"input shape {list(input_shape)} does not fit the model's {list(want)}"
    if labels_max >= classes:
        return f"label {labels_max} does not fit the model's {classes} classes"
    return None


def build_announcement(
    data: dict[int, tuple], spec: dict, epsilon: float | None, seed: int
) -> dict:
    """The ``data`` field of a device's ``ready``: client → (x, y) tensors summarised."""
    classes = int(spec["num_classes"])
    entries = []
    for c, (_, y) in sorted(data.items()):
        hist = label_histogram(y.numpy(), classes)
        if epsilon is not None:
            hist = noisy_histogram(hist, epsilon, derive_seed(seed, "histogram-noise", c))
        entries.append({"client": c, "samples": len(y), "histogram": hist.tolist()})
    first = next(iter(data.values()))[0]
    return {"input_shape": list(first.shape[1:]), "epsilon": epsilon, "clients": entries}


def _count(value, what: str) -> int:
    if type(value) is not int or not 0 <= value <= MAX_SAMPLES:
        raise AnnouncementError(f"{what} must be an integer in [0, {MAX_SAMPLES}]")
    return value


def check_announcement(
    data, device: str, clients: Sequence[int], spec: dict
) -> dict[int, Announced]:
    """The validated announcement of ``device`` hosting ``clients``, or AnnouncementError."""
    if not isinstance(data, dict):
        raise AnnouncementError("no data announcement (start the device with --data)")
    shape, eps, entries = data.get("input_shape"), data.get("epsilon"), data.get("clients")
    if not isinstance(shape, list) or len(shape) > 8 or any(type(s) is not int for s in shape):
        raise AnnouncementError("input_shape must be a list of at most 8 integers")
    problem = data_mismatch(shape, -1, spec)
    if problem:
        raise AnnouncementError(problem)
    if eps is not None and (type(eps) not in (int, float) or not 0 < eps < math.inf):
        raise AnnouncementError("epsilon must be a positive number or null")
    if not isinstance(entries, list) or len(entries) != len(clients):
        raise AnnouncementError(f"expected one entry per hosted client {sorted(clients)}")
    classes = int(spec["num_classes"])
    out: dict[int, Announced] = {}
    for entry in entries:
        c = entry.get("client") if isinstance(entry, dict) else None
        if type(c) is not int or c not in clients:
            raise AnnouncementError(f"entry for a client not hosted here: {str(entry)[:60]}")
        if c in out:
            raise AnnouncementError(f"client {c} announced twice")
        samples = _count(entry.get("samples"), f"client {c}: samples")
        hist = entry.get("histogram")
        if not isinstance(hist, list) or len(hist) != classes:
            raise AnnouncementError(
                f"client {c}: histogram must list {classes} class counts (the model's classes)"
            )
        counts = tuple(_count(h, f"client {c}: histogram entries") for h in hist)
        if samples < 1 or (eps is None and sum(counts) != samples):
            raise AnnouncementError(
                f"client {c}: {samples} samples, histogram sums to {sum(counts)}"
            )
        out[c] = Announced(device, samples, counts, None if eps is None else float(eps))
    return out


def ready_problem(kind: str, fields: dict, spec: dict | None, link) -> tuple[str | None, dict]:
    """Why a device's ``ready`` (or its own ``refuse`` of a data mismatch) is refused, or
    None, and its valid announcement by client (empty without one). ``spec``: the server's
    data spec (``own``: the devices bring their data); ``link``: the device (``name``,
    ``clients``)."""
    if kind == "refuse":
        return str(fields.get("reason"))[:300], {}
    data = fields.get("data")
    if spec is None or (not spec.get("own") and data is None):
        return None, {}
    if not spec.get("own"):
        why = "this server partitions its own dataset (data.source: partition); start the "
        return why + "device without --data", {}
    try:
        return None, check_announcement(data, link.name, link.clients, spec)
    except AnnouncementError as err:
        return f"data announcement: {err}", {}


def capped_counts(sizes: list[int], factor: float) -> tuple[list[int], dict[int, str]]:
    """Announced sample counts with each above ``factor`` × their median capped there, and
    why per capped client (``network.bounds.peer_samples_factor``): a device cannot take a
    sample-weighted aggregation, S²FL's grouping or the plan's step counts by announcing
    more samples than it holds; an honest large client keeps up to ``factor`` × the median's
    weight. The median stands while fewer than half the clients lie."""
    ordered = sorted(sizes)
    n = len(ordered)
    if n < 3:
        return list(sizes), {}
    median = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    cap = max(1, int(factor * median))
    notes = {
        c: f"announced {s} samples, {s / median:.0f}x the median {median:g}; weight capped at {cap}"
        for c, s in enumerate(sizes)
        if s > cap
    }
    return [min(s, cap) for s in sizes], notes


def scaled_histogram(hist: Sequence[int], samples: int) -> list[int]:
    """``hist`` scaled to sum to ``samples`` (largest remainders), for a capped count."""
    total = sum(hist)
    if total == samples or total == 0:
        return list(hist)
    exact = [h * samples / total for h in hist]
    out = [math.floor(v) for v in exact]
    by_remainder = sorted(range(len(hist)), key=lambda k: out[k] - exact[k])
    for k in by_remainder[: samples - sum(out)]:
        out[k] += 1
    return out


def keep_announced(announced: dict, got: dict) -> str | None:
    """Record a device's valid announcement in ``announced`` (client → :class:`Announced`):
    a client's first announcement stands, a later one must repeat its sample count (else
    the refusal, and nothing is recorded)."""
    for c, a in got.items():
        first = announced.get(c, a)
        if first.samples != a.samples:
            return f"client {c}: {a.samples} samples, {first.samples} at its first join"
    for c, a in got.items():
        announced.setdefault(c, a)
    return None

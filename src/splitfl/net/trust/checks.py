"""Validation of what crosses a trust boundary: everything a device (or a peer) sends is
checked for type, shape and magnitude here before the server — or a top worker — uses it.

A check returns what is wrong (a short reason for the run's ``dropped_reasons``) or None; the
caller drops the client for the round (:class:`~splitfl.core.plan.RoundResult` ``dropped``), never
the run. The magnitude bounds (``network.bounds``, :class:`~splitfl.config.BoundsConfig`) are
relative to the current model, so they scale with any model and need no tuning:

* a model part (device part, auxiliary model, ParallelSFL's top part, RingSFL's model) may lie at
  most ``update_norm_factor × ‖sent‖ + update_norm_abs`` from the part the server sent (L2
  norm over its floating-point tensors); integer buffers (BatchNorm's batch counter) may only
  grow, by at most :data:`COUNTER_SLACK` per local step. An honest round moves a part by a
  few learning-rate-sized steps, a fraction of its own norm (factor 10); what passes keeps
  every weighted sum finite (values stay within ~11 × the global norm, nowhere near
  float32's 3.4e38).
* smashed data may be at most ``activation_factor × a + activation_abs`` in absolute value,
  ``a`` the largest activation of the round's global device part on the server's reference
  samples, computed as training computes it (:func:`activation_scale`); local training
  changes a part's activations by a small factor within a round (factor 100).
* a reported loss is finite, non-negative and at most ``loss_max`` per sample; times and byte
  counts are finite, non-negative and bounded (:func:`bounded`).

One concept over ~450 lines: every bound a received tensor or number is held to, with the
peer windows those bounds read (:class:`PeerScale`, :class:`PeerHistory`) and their strict-JSON
state for a resume, kept beside the checks that use them.
"""

from __future__ import annotations

import collections
import copy
import math
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

import torch

from splitfl.config import BoundsConfig
from splitfl.core.activations import leaves
from splitfl.net.transport.wire import all_finite, extremes

State = dict[str, torch.Tensor]
Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]

#: How much an integer buffer may grow per local step (BatchNorm's ``num_batches_tracked``
#: counts one per training forward; an auxiliary model or mixup adds at most one more).
COUNTER_SLACK = 4
#: Samples the activation scale is measured on (:func:`activation_scale`).
REFERENCE_SAMPLES = 64
#: Largest byte count a device may report (2**53: exact in a float).
MAX_BYTES = 2**53


def state_specs(state: State) -> Specs:
    """Name → (shape, dtype) of a model part's tensors (what :func:`check_state` expects)."""
    return {k: (tuple(v.shape), v.dtype) for k, v in state.items()}


def check_state(
    state: State,
    specs: Specs,
    sent: State | None = None,
    bounds: BoundsConfig | None = None,
    steps: int = 1,
) -> str | None:
    """What is wrong with a model part a device sent (names, shapes, dtypes, finite values
    against ``specs``: name → (shape, dtype); with ``sent``, its distance from the part the
    server sent, :func:`update_problem`), or None."""
    if set(state) != set(specs):
        return "tensor names differ from the model part's"
    for name, (shape, dtype) in specs.items():
        t = state[name]
        if tuple(t.shape) != shape or t.dtype != dtype:
            return f"{name}: {tuple(t.shape)} {t.dtype}"
        if not all_finite(t):
            return f"{name}: non-finite values"
    if sent is None:
        return None
    return update_problem(state, sent, bounds or BoundsConfig(), steps)


def state_norm(state: State) -> float:
    """L2 norm over the floating-point tensors of ``state`` (float64)."""
    return math.sqrt(
        sum(float(t.double().pow(2).sum()) for t in state.values() if t.is_floating_point())
    )


def update_problem(state: State, sent: State, bounds: BoundsConfig, steps: int) -> str | None:
    """The norm bound of a checked part (module docstring), or None. ``steps``: the client's
    local steps this round (integer buffers grow by at most :data:`COUNTER_SLACK` each)."""
    for name, t in state.items():
        if t.is_floating_point() or t.dtype == torch.bool or not t.numel():
            continue
        moved = t.long() - sent[name].long()
        lo, hi = int(moved.min()), int(moved.max())
        if lo < 0 or hi > COUNTER_SLACK * max(steps, 1):
            return f"{name}: counter moved by {lo if lo < 0 else hi} in {steps} steps"
    distance = update_distance(state, sent)
    limit = bounds.update_norm_factor * state_norm(sent)
    limit += bounds.update_norm_abs
    if distance > limit:
        return (
            f"update norm {distance:.3g} above {limit:.3g} (network.bounds.update_norm_factor "
            f"x the global part's norm + update_norm_abs)"
        )
    return None


@dataclass(frozen=True)
class TensorSpec:
    """What one tensor crossing a cut must be: its per-sample ``shape``, ``dtype`` and the
    largest absolute value allowed (``limit``; for integer tensors too — a range, not a
    float magnitude; bool tensors have none)."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    limit: float = math.inf


def activation_scale(part: torch.nn.Module, sample: torch.Tensor) -> list[float]:
    """Largest absolute value of each tensor ``part`` sends on ``sample``, as local training
    computes it: train mode (BatchNorm normalises by the batch's own statistics, as
    on the device), on a copy (the model's running statistics stay as they are) and with the
    random state restored afterwards (dropout in the probe draws nothing from the run's
    seeded streams)."""
    probe = copy.deepcopy(part).train()
    devices = [sample.device.index or 0] if sample.is_cuda else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        out = probe(sample)
    return [
        float(t.abs().max()) if t.numel() and t.dtype != torch.bool else 0.0 for t in leaves(out)
    ]


def smashed_problem(
    fx,
    y,
    specs: Sequence[TensorSpec],
    batch_size: int,
    classes: int,
    target: tuple[torch.dtype, tuple[int, ...]] = (torch.int64, ()),
) -> str | None:
    """What is wrong with one batch of smashed data (one tensor, or a tuple where several
    cross the cut, each against its :class:`TensorSpec`: dtype, shape, finite values,
    magnitude or range) and targets (dtype, per-sample shape ``target[1]``, class labels in
    range), or None. ``target``: the targets' dtype and per-sample shape (int64 class labels,
    or float targets for ``train.loss`` mse/bce_logits)."""
    if fx is None or y is None or any(t is None for t in leaves(fx)):
        return "missing tensor"
    got = leaves(fx)
    if len(got) != len(specs) or not all(isinstance(t, torch.Tensor) for t in got):
        return f"{len(got)} tensors for {len(specs)}"
    if y.dtype != target[0] or any(t.dtype != s.dtype for t, s in zip(got, specs, strict=True)):
        return f"dtype {'/'.join(str(t.dtype) for t in got)}/{y.dtype}"
    n = y.shape[0] if y.dim() >= 1 and tuple(y.shape[1:]) == target[1] else -1
    shapes = [tuple(t.shape) for t in got]
    if not 1 <= n <= batch_size or any(
        sh != (n, *s.shape) for sh, s in zip(shapes, specs, strict=True)
    ):
        return f"shape {'/'.join(str(sh) for sh in shapes)}/{tuple(y.shape)}"
    for t, spec in zip(got, specs, strict=True):
        problem = _value_problem(t, spec.limit)
        if problem:
            return problem
    if y.is_floating_point() and not all_finite(y):
        return "non-finite values"
    if not y.is_floating_point():
        low, high = extremes(y)
        if low < 0 or high >= classes:
            return "label out of range"
    return None


def _value_problem(t: torch.Tensor, limit: float) -> str | None:
    """Non-finite values, or a magnitude (an integer tensor's range) above ``limit``."""
    if t.dtype == torch.bool or not t.numel():
        return None
    low, high = extremes(t)  # one pass: NaN propagates to both, infinities show
    if not (math.isfinite(low) and math.isfinite(high)):
        return "non-finite values"
    peak = max(-low, high)
    if peak > limit:
        what = "activation" if t.is_floating_point() else "integer value"
        return (
            f"{what} {peak:.3g} above {limit:.3g} (network.bounds.activation_factor x "
            f"the global part's + activation_abs)"
        )
    return None


def rms(t: torch.Tensor) -> float:
    """Root-mean-square of a tensor's values (float64)."""
    return float(t.double().pow(2).mean().sqrt())


class PeerScale:
    """The accepted smashed data of the run's recent rounds, as the RMS of each floating
    tensor of each batch, per (cut, tensor, local step), to hold a client's batch against its
    peers' at the same step: a batch whose RMS is above ``factor`` × the median of the last
    :attr:`WINDOW` accepted batches of that step (this round's and earlier rounds') from at
    least two other clients, + ``abs_``, is refused; before two other clients have been seen
    at a step (early in the first round) a batch is held to the model-relative bounds only.
    A scaled copy of honest activations passes the peak bound relative to the model; next to
    its peers' it does not. By step, because honest activations grow within a round as the
    parts train (Adam: ×10 per step over the first steps in the tests), alike on every
    client. Shared by the round's groups (threads): locked. The windows outlive the server
    process (:meth:`state_dict`, checkpointed with each round by the networked executor), so a
    resumed run judges its first batches as the uninterrupted run would."""

    WINDOW = 64

    def __init__(self, factor: float, abs_: float):
        self.factor, self.abs = factor, abs_
        self.values: dict[tuple, collections.deque] = {}
        self.clients: dict[tuple, set[int]] = {}
        self.lock = threading.Lock()

    def problem(self, key: tuple, step: int, client: int, value: float) -> str | None:
        """Why ``value`` (a batch's RMS for ``key`` at local ``step``) is out of line, or
        None; an accepted value joins its step's window."""
        with self.lock:
            median = self._median(key, step, client)
            top = None if median is None else self.factor * median + self.abs
            if top is not None and value > top:
                return (
                    f"activation RMS {value:.3g} above {top:.3g} (network.bounds."
                    f"activation_rms_factor {self.factor:g} x its peers' median {median:.3g})"
                )
            at = (*key, step)
            self.values.setdefault(at, collections.deque(maxlen=self.WINDOW)).append(value)
            self.clients.setdefault(at, set()).add(client)
        return None

    def _median(self, key: tuple, step: int, client: int) -> float | None:
        at = (*key, step)
        if len(self.clients.get(at, set()) - {client}) < 2:
            return None  # no peers at this step yet (the first round's first arrivals)
        ordered = sorted(self.values[at])
        n = len(ordered)
        return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2

    def state_dict(self) -> list[dict]:
        """The windows as strict JSON: one entry per (cut, tensor, step) — ``at`` its key as a
        list of ints, ``values`` its window's RMS values oldest first, ``clients`` the clients
        seen there (sorted)."""
        with self.lock:
            return [
                {
                    "at": [int(k) for k in at],
                    "values": [float(v) for v in window],
                    "clients": sorted(int(c) for c in self.clients[at]),
                }
                for at, window in self.values.items()
            ]

    def load_state_dict(self, state: list) -> None:
        """Replace the windows by what :meth:`state_dict` returned (a checkpoint's).

        Raises:
            ValueError: one line naming the malformed field (``peer_scale[i].values``...): keys
            not lists of ints, values not finite numbers ≥ 0 or more than :attr:`WINDOW`,
            clients not distinct ints ≥ 0, a key twice."""
        values, clients = {}, {}
        for i, entry in enumerate(_entries(state, "peer_scale", ("at", "values", "clients"))):
            at = tuple(_ints(entry["at"], f"peer_scale[{i}].at"))
            if at in values:
                raise ValueError(f"peer_scale[{i}].at: {list(at)} twice")
            window = _window(entry["values"], f"peer_scale[{i}].values", self.WINDOW)
            seen = _ints(entry["clients"], f"peer_scale[{i}].clients", unique=True)
            values[at] = collections.deque(window, maxlen=self.WINDOW)
            clients[at] = set(seen)
        with self.lock:
            self.values, self.clients = values, clients


def peer_outliers(
    distances: dict[int, float], factor: float, what: str = "model update", floor: float = 0.0
) -> dict[int, str]:
    """Keys (clients; or a ParallelSFL round's clusters, :mod:`splitfl.net.server.clusters`) whose
    update distance (from the part they were sent) is above ``factor`` × the median of the round's
    distances (at least ``floor``: ``network.bounds.peer_update_floor``), with the reason to
    record (``what`` names the part); none with fewer than 3 updates or a zero median (nothing
    moved)."""
    if len(distances) < 3:
        return {}
    ordered = sorted(distances.values())
    n = len(ordered)
    median = (ordered[(n - 1) // 2] + ordered[n // 2]) / 2
    return _above(distances, *_floored(median, floor, "round's median"), factor, what)


def _floored(median: float, floor: float, whose: str) -> tuple[float, str]:
    """``median`` at least ``floor``, and what the reason calls it."""
    if floor > median:
        return floor, f"floor (network.bounds.peer_update_floor x the part's norm, above {whose})"
    return median, whose


def _above(
    distances: dict[int, float], median: float, whose: str, factor: float, what: str
) -> dict[int, str]:
    """The keys whose distance is above ``factor`` × ``median``, with their reasons."""
    if median <= 0:
        return {}
    return {
        c: (
            f"rejected {what}: norm {d:.3g} is {d / median:.1f}x the {whose} "
            f"{median:.3g} (network.bounds.peer_update_factor {factor:g})"
        )
        for c, d in distances.items()
        if d > factor * median
    }


class PeerHistory:
    """:func:`peer_outliers` across rounds: the accepted distances (per local step) of the
    last ``keep`` updates of the same kind stand in for the round's median when a round has
    fewer than 3 of that kind (a ParallelSFL round of one or two clusters, a round of two
    clients, an S²FL cut only one or two clients train), once 3 were accepted; before that,
    the server's own step on its held samples (``reference``). A kind is what the updates
    hold (:meth:`~splitfl.net.trust.spread.RoundMoves.outliers` passes the tensor names):
    S²FL's cuts differ in kind, and one history of all cuts held a lone client of a larger
    cut to a median of smaller cuts' parts (issue 51 item 3: an honest update dropped at
    13.4× "the median").
    The history outlives the server process (:meth:`state_dict`, checkpointed with each round
    by the networked executor, as :class:`PeerScale`'s windows)."""

    def __init__(self, factor: float, keep: int = 32):
        self.factor, self.keep = factor, keep
        self.kinds: dict[object, collections.deque[float]] = {}

    @property
    def accepted(self) -> collections.deque[float]:
        """The accepted distances of updates of no stated kind (``kind=None``)."""
        return self._of(None)

    def _of(self, kind: object) -> collections.deque[float]:
        return self.kinds.setdefault(kind, collections.deque(maxlen=self.keep))

    def outliers(
        self,
        distances: dict[int, float],
        what: str = "model update",
        reference: Callable[[], float] | None = None,
        rejected: Collection[int] = (),
        kind: object = None,
        floor: float = 0.0,
    ) -> dict[int, str]:
        """The round's outliers (its own median, else the earlier rounds' of ``kind``, else
        — before 3 were accepted — ``reference``: the server's own step per local step,
        :class:`~splitfl.net.trust.reference.ServerStep`); records the rest but ``rejected``
        (keys another check refused: the spread, :mod:`splitfl.net.trust.spread`); each median
        at least ``floor`` (:func:`peer_outliers`)."""
        found = peer_outliers(distances, self.factor, what, floor)
        accepted = self._of(kind)
        if len(distances) < 3 and len(accepted) >= 3:
            earlier = sorted(accepted)[(len(accepted) - 1) // 2]  # the lower median
            earlier, whose = _floored(earlier, floor, "earlier rounds' median")
            found = _above(distances, earlier, whose, self.factor, what)
        elif len(distances) < 3 and distances and reference is not None:
            own, whose = _floored(reference(), floor, "server's own step")
            found = _above(distances, own, whose, self.factor, what)
        accepted.extend(d for c, d in distances.items() if c not in found and c not in rejected)
        return found

    def state_dict(self) -> list[dict]:
        """The history as strict JSON: one entry per kind — ``kind`` null (no stated kind) or
        its tensor names as a list, ``distances`` oldest first."""
        return [
            {
                "kind": None if kind is None else [str(n) for n in kind],
                "distances": [float(d) for d in window],
            }
            for kind, window in self.kinds.items()
        ]

    def load_state_dict(self, state: list, field: str = "peer_history") -> None:
        """Replace the history by what :meth:`state_dict` returned (a checkpoint's).

        Raises:
            ValueError: one line naming the malformed field (``field[i].distances``...): a
            kind neither null nor a list of strings, or twice; distances not finite numbers
            ≥ 0 or more than ``keep``."""
        kinds: dict[object, collections.deque[float]] = {}
        for i, entry in enumerate(_entries(state, field, ("kind", "distances"))):
            names = entry["kind"]
            if names is not None and (
                not isinstance(names, list) or not all(isinstance(n, str) for n in names)
            ):
                raise ValueError(f"{field}[{i}].kind: not null or a list of tensor names")
            kind = None if names is None else tuple(names)
            if kind in kinds:
                raise ValueError(f"{field}[{i}].kind: {names} twice")
            window = _window(entry["distances"], f"{field}[{i}].distances", self.keep)
            kinds[kind] = collections.deque(window, maxlen=self.keep)
        self.kinds = kinds


def _entries(state, field: str, keys: tuple[str, ...]) -> list[dict]:
    """``state`` as a list of dicts with exactly ``keys``, else a ValueError naming ``field``."""
    if not isinstance(state, list):
        raise ValueError(f"{field}: not a list")
    for i, entry in enumerate(state):
        if not isinstance(entry, dict) or set(entry) != set(keys):
            raise ValueError(f"{field}[{i}]: not an entry of {', '.join(keys)}")
    return state


def _window(values, field: str, size: int) -> list[float]:
    """``values`` as floats: a list of at most ``size`` finite numbers ≥ 0, else a
    ValueError naming ``field``."""
    if not isinstance(values, list) or len(values) > size:
        raise ValueError(f"{field}: not a list of at most {size} values")
    if not all(is_number(v) and v >= 0 for v in values):
        raise ValueError(f"{field}: values must be finite numbers >= 0")
    return [float(v) for v in values]


def _ints(values, field: str, unique: bool = False) -> list[int]:
    """``values``: a list of ints ≥ 0 (not bools; distinct with ``unique``), else a
    ValueError naming ``field``."""
    if not isinstance(values, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    ):
        raise ValueError(f"{field}: not a list of integers >= 0")
    if unique and len(set(values)) != len(values):
        raise ValueError(f"{field}: a value twice")
    return values


def update_distance(state: State, sent: State) -> float:
    """L2 distance over the floating-point tensors of ``state`` from ``sent``."""
    return math.sqrt(
        sum(
            float((t.double() - sent[k].double()).pow(2).sum())
            for k, t in state.items()
            if t.is_floating_point()
        )
    )


def is_number(x) -> bool:
    """A JSON number (not a bool) that is finite."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def bounded(x, hi: float, lo: float = 0.0) -> bool:
    """``x`` is a finite number in ``[lo, hi]``."""
    return is_number(x) and lo <= x <= hi


def loss_problem(loss_sum, samples, most_samples: int, bounds: BoundsConfig) -> str | None:
    """What is wrong with a reported (loss sum, samples) pair, or None: samples an integer in
    ``[1, most_samples]``, the loss finite, non-negative and at most ``loss_max`` per sample."""
    problem = samples_problem(samples, most_samples)
    if problem:
        return problem
    if not bounded(loss_sum, bounds.loss_max * samples):
        return f"loss {str(loss_sum)[:40]} (network.bounds.loss_max: {bounds.loss_max:g}/sample)"
    return None


def samples_problem(samples, most_samples: int) -> str | None:
    """What is wrong with a reported sample count, or None: an integer in ``[1, most_samples]``
    (a mini-batch holds at most the task's batch size)."""
    if isinstance(samples, bool) or not isinstance(samples, int):
        return f"samples {str(samples)[:40]!r}"
    if not 1 <= samples <= most_samples:
        return f"{samples} samples (at most {most_samples})"
    return None

"""A round's training pattern as typed data: a :class:`~splitfl.core.plan.RoundPlan`'s *topology*.

An algorithm says how its round trains by the payload it puts in ``RoundPlan.topology``, and
how devices update their part by ``RoundPlan.device_update``; every runtime looks the payload's
type up once (:func:`splitfl.topologies.family_of`) and runs that family's schedule. The
payloads are frozen, keyword-only and checked on construction (a bad value is a ValueError
naming the field), so a plan that exists is one a runtime can run.

========================  ===============================================================
payload                   who plans it
========================  ===============================================================
``Star()``                SplitFed V1, AdaSFL, FedAvg/IFCA/PyramidFL/AdaSampling (no cut),
                          S²FL, MergeSFL, SplitFed-RingSFL, CSE-FSL, FSL-SAGE, LocFedMix-SL
``Turns(order, mode)``    SplitFed V2, vanilla SL (``chain``), SplitLoRA (``round_robin``)
``Ring(spec)``            RingSFL
``Clusters(hosts)``       ParallelSFL
``UShaped(tails)``        U-shaped split learning (labels and head stay on the device)
========================  ===============================================================

A topology defined outside the tree subclasses :class:`Topology` and registers its family
(:func:`splitfl.topologies.register`), which also registers the payload with the plan codec.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

#: ``ServerSpec.group_loss`` readings of S²FL Eq. (3) (and RingSFL's SplitFed baseline).
GROUP_LOSSES = ("mean", "sum", "member_mean")
#: ``ServerSpec.device_grad``: S²FL Eq. (4) as printed, or rescaled to the member's own loss.
DEVICE_GRADS = ("union", "own")
#: ``ServerSpec.forward``: one server forward per member, or one per cut point on the
#: concatenated smashed data (MergeSFL Eq. 16).
GROUP_FORWARDS = ("separate", "concat")
#: ``Ring.pipeline``: how the clock times a ring round (RingSFL §3.3, or the makespan).
RING_PIPELINES = ("ideal", "schedule", "arrival")
#: ``Turns.mode``: members served one after another for all their steps (SplitFed V2), or one
#: step each in turn (SplitLoRA's released code).
TURN_MODES = ("sequential", "round_robin")


def _one_of(owner: str, name: str, value: Any, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{owner}.{name} must be one of {', '.join(allowed)} (got {value!r})")


def _positive(owner: str, name: str, value: Any, *, optional: bool = False, zero: bool = False):
    if optional and value is None:
        return
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not math.isfinite(value) or value < 0 or (value == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise ValueError(f"{owner}.{name} must be a finite number {bound} (got {value!r})")


@dataclass(frozen=True)
class AuxSpec:
    """The auxiliary model of a plan, as data: ``model`` is a name registered in
    :mod:`splitfl.models.aux_heads` or an import path ``package.module:callable``; it maps a
    batch of smashed data (``input_shape`` per sample) to ``num_classes`` logits."""

    model: str
    input_shape: tuple[int, ...]
    num_classes: int


@dataclass(frozen=True)
class AlignSpec:
    """FSL-SAGE's alignment (FSL-SAGE repo, ``models/aux_models/__init__.py``: ``refresh_data``
    and ``GradScalarAuxiliaryModel.align``; defaults ``hydra_config/model/auxiliary/
    base_auxiliary.yaml``): the server keeps each client's last ``memory`` uploaded smashed
    samples; at an alignment it computes their true cut-layer gradients with its current model
    and fits the client's auxiliary model to them for ``epochs`` epochs of Adam (``lr``) on the
    summed squared error, in shuffled batches of ``batch_size``."""

    epochs: int = 100
    batch_size: int = 1000
    lr: float = 1e-3
    memory: int = 1000


@dataclass(frozen=True, kw_only=True)
class ServerSpec:
    """How a group's server copy steps on its members' smashed data.

    ``group_loss``: ``mean`` over the union of the members' samples, ``sum`` of the member
    means (S²FL Eq. 3's two readings) or ``member_mean`` (the mean of the member means:
    RingSFL's SplitFed baseline). ``device_grad``: ``union`` = ∂(group loss)/∂fx_i (S²FL Eq. 4
    as printed); ``own`` = rescaled to the gradient of the member's own mean loss. ``forward``:
    ``separate`` or ``concat`` (one forward per cut point on the members' concatenated smashed
    data, MergeSFL Eq. 16). ``lr``: the server copies' learning rate (None: the first task's).
    ``mixup``: LocFedMix-SL's α — the server also trains on mixup of random member pairs'
    smashed data, λ ~ Beta(α, α)."""

    group_loss: str = "mean"
    device_grad: str = "union"
    forward: str = "separate"
    lr: float | None = None
    mixup: float | None = None

    def __post_init__(self) -> None:
        _one_of("ServerSpec", "group_loss", self.group_loss, GROUP_LOSSES)
        _one_of("ServerSpec", "device_grad", self.device_grad, DEVICE_GRADS)
        _one_of("ServerSpec", "forward", self.forward, GROUP_FORWARDS)
        _positive("ServerSpec", "lr", self.lr, optional=True, zero=True)  # 0: a frozen server
        _positive("ServerSpec", "mixup", self.mixup, optional=True)


class Topology:
    """Base of the topology payloads. Each subclass is a frozen, keyword-only dataclass; a
    runtime finds the family that runs it by its type (:mod:`splitfl.topologies`)."""

    #: The group server spec every member of a server-side group is stepped with (None: the
    #: topology has no server copies of that kind, e.g. a ring).
    server: ServerSpec | None = None


@dataclass(frozen=True, kw_only=True)
class Star(Topology):
    """Every member of a group talks to the group's server copy at every step (SplitFed V1,
    S²FL Alg. 1; a whole-model task, cut = all blocks, trains on its device alone).
    ``barrier``: the clock holds each group's members in lock-step, every iteration waiting
    for the group's slowest member (S²FL's ``lockstep_barrier``, a sensitivity beyond Eq. 1)."""

    server: ServerSpec = field(default_factory=ServerSpec)
    barrier: bool = False


@dataclass(frozen=True, kw_only=True)
class Turns(Topology):
    """Members of a group take turns with its one server copy, in ``order``: ``sequential`` —
    each for all its steps (SplitFed V2); ``round_robin`` — one step each in turn (SplitLoRA).
    ``chain`` (sequential only): each member starts from the device part the previous one
    trained (vanilla split learning), and transfers never overlap on the clock."""

    order: tuple[int, ...]
    mode: str
    chain: bool = False
    server: ServerSpec = field(default_factory=ServerSpec)

    def __post_init__(self) -> None:
        _one_of("Turns", "mode", self.mode, TURN_MODES)
        if self.chain and self.mode != "sequential":
            raise ValueError("Turns.chain needs mode sequential")
        if len(set(self.order)) != len(self.order):
            raise ValueError("Turns.order names a client twice")


@dataclass
class RingSpec:
    """RingSFL's ring for a round: client order, propagation lengths L_i (blocks), weights
    a_i, and whether overlapping blocks use the dynamic learning rate (v2, Eq. 7)."""

    order: list[int]
    lengths: dict[int, int]
    weights: dict[int, float]
    dynamic_lr: bool = False

    def segments(self, start: int) -> list[tuple[int, int, int]]:
        """RingSFL Alg. 2 lines 2–6 for client ``start``'s batch: [(client, first block,
        stop block), …] around the ring from ``start``."""
        pos = list(self.order).index(start)
        out, lo = [], 0
        for k in range(len(self.order)):
            client = self.order[(pos + k) % len(self.order)]
            out.append((client, lo, lo + self.lengths[client]))
            lo += self.lengths[client]
        return out

    def member(self, start: int, hop: int) -> int:
        """Who runs hop ``hop`` of client ``start``'s batch (hop N, the loss: ``start``)."""
        pos = list(self.order).index(start)
        return self.order[(pos + hop) % len(self.order)]

    def overlap_counts(
        self, num_blocks: int, starts: Sequence[int] | None = None
    ) -> dict[int, list[int]]:
        """RingSFL Eq. (7)'s |U_j,(k)|: for every client j and block k, how many of the
        ``starts`` clients' batches (default: all) pass through it."""
        counts = {c: [0] * num_blocks for c in self.order}
        for start in self.order if starts is None else starts:
            for client, lo, hi in self.segments(start):
                for k in range(lo, hi):
                    counts[client][k] += 1
        return counts


@dataclass(frozen=True, kw_only=True)
class Ring(Topology):
    """RingSFL (Alg. 1–2): every client's batch goes around the ring of devices, each running
    its propagation length of blocks; no server copy (tasks hold full models). ``pipeline``:
    the round time on the clock — ``ideal`` (§3.3: the most loaded member's busy time),
    ``schedule`` or ``arrival`` (the ring's makespan with jobs in a fixed or arrival order)."""

    spec: RingSpec
    pipeline: str = "ideal"

    def __post_init__(self) -> None:
        _one_of("Ring", "pipeline", self.pipeline, RING_PIPELINES)


@dataclass(frozen=True, kw_only=True)
class Clusters(Topology):
    """Star groups whose server part runs on a member's *device* (ParallelSFL's top workers,
    reached over device-to-device links): ``hosts`` maps group → hosting client; groups not
    named run on the parameter server. The arithmetic is a star group's wherever it runs."""

    hosts: dict[int, int]
    server: ServerSpec = field(default_factory=ServerSpec)


@dataclass(frozen=True, kw_only=True)
class UShaped(Topology):
    """U-shaped split learning (Vepakomma et al., "Split learning for health", 2018, U-shaped
    configuration): each client's device runs the front (blocks ``[0, cut)``) and the head
    (blocks ``[tails[client], n)``, with the loss and the labels); the group's server copy runs
    the middle ``[cut, tail)``. Per step: front forward → server middle → device head and loss
    → the middle output's gradient back to the server → the front output's gradient back to
    the device. Labels never leave the device. ``lr``: the middle copies' learning rate (None:
    the group's first task's)."""

    tails: dict[int, int]
    lr: float | None = None

    def __post_init__(self) -> None:
        _positive("UShaped", "lr", self.lr, optional=True, zero=True)
        for client, tail in self.tails.items():
            if not isinstance(tail, int) or isinstance(tail, bool) or tail < 1:
                raise ValueError(f"UShaped.tails[{client}] must be a block index >= 1")


class DeviceUpdate:
    """Base of the device update rules (``RoundPlan.device_update``; None: devices step with
    the server's activation gradient, split learning proper)."""

    aux: AuxSpec
    upload_every: int = 1
    upload_phase: int = 0
    align: AlignSpec | None = None

    def uploads(self, step: int) -> bool:
        """Whether step ``step``'s smashed data go to the server (CSE-FSL's period h)."""
        return step % self.upload_every == self.upload_phase

    def _check(self) -> None:
        name = type(self).__name__
        if not isinstance(self.upload_every, int) or self.upload_every < 1:
            raise ValueError(f"{name}.upload_every must be an int >= 1")
        if not 0 <= self.upload_phase < self.upload_every:
            raise ValueError(f"{name}.upload_phase must be in [0, upload_every)")


@dataclass(frozen=True, kw_only=True)
class LocalLoss(DeviceUpdate):
    """Devices step on their auxiliary model's loss (CSE-FSL, LocFedMix-SL; the auxiliary
    model trains with it); smashed data reach the server at steps ``s`` with ``s %
    upload_every == upload_phase`` and no gradient comes back — unless ``server_gradient``:
    then, at an upload step, the server's activation gradient comes back too and the device
    steps on the sum of both (LocFedMix-SL's ``device_update: local+server``; wire name
    ``local+server``)."""

    aux: AuxSpec
    upload_every: int = 1
    upload_phase: int = 0
    server_gradient: bool = False

    def __post_init__(self) -> None:
        self._check()
        if not isinstance(self.server_gradient, bool):
            raise ValueError("LocalLoss.server_gradient must be a bool")


@dataclass(frozen=True, kw_only=True)
class Estimate(DeviceUpdate):
    """Devices step with the auxiliary model's estimate of the server's cut-layer gradient
    (FSL-SAGE); the auxiliary model changes only when aligned (``align``, for tasks with
    ``align`` set)."""

    aux: AuxSpec
    upload_every: int = 1
    upload_phase: int = 0
    align: AlignSpec | None = None

    def __post_init__(self) -> None:
        self._check()


#: The topology payloads and update rules of the tree (the plan codec's closed set, extended by
#: :func:`splitfl.topologies.register` for a payload defined elsewhere).
PAYLOADS: tuple[type, ...] = (Star, Turns, Ring, Clusters, UShaped, LocalLoss, Estimate)
SPECS: tuple[type, ...] = (ServerSpec, RingSpec, AuxSpec, AlignSpec)


__all__ = [
    "AlignSpec",
    "AuxSpec",
    "Clusters",
    "DeviceUpdate",
    "Estimate",
    "LocalLoss",
    "Ring",
    "RingSpec",
    "ServerSpec",
    "Star",
    "Topology",
    "Turns",
    "UShaped",
]

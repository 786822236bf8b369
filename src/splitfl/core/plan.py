"""The round contract between algorithms and executors (a leaf module: torch only).

An algorithm's :meth:`~splitfl.algorithms.base.Algorithm.plan_round` returns a
:class:`RoundPlan` (one :class:`ClientTask` per participant plus how the server side runs);
an executor (:mod:`splitfl.executors`) runs it and returns a :class:`RoundResult`
(:class:`ClientUpdate` per client, each group's server-side state, optionally measured time
and bytes); the experiment turns the work into simulated time and hands the algorithm a
:class:`RoundReport`. Both sides import this module; it imports neither.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from splitfl.system.cost import ClientCost

#: How the server trains a group's copy: ``per_step`` = every iteration, the losses of all
#: active members are combined into one loss (S²FL Eq. 3; a group of one is SplitFed V1);
#: ``sequential`` = members are served one after another, each for all its steps (SplitFed V2);
#: ``round_robin`` = members take turns, one step each, in ``order`` (SplitLoRA's released code:
#: each client's batch meets the server model its predecessor's batch just updated).
SERVER_MODES = ("per_step", "sequential", "round_robin")
#: How a ``per_step`` group's server part is run on its members' smashed data: ``concat`` =
#: one forward/backward on the concatenation of the active members that share a cut point
#: (MergeSFL Eq. 16's mixed feature sequence; S²FL's "larger batches"), so layers that couple
#: samples (BatchNorm) see the merged batch; ``separate`` = one forward per member.
GROUP_FORWARDS = ("concat", "separate")
#: How devices update their part (:attr:`RoundPlan.device_loss`): ``server`` — with the
#: activation gradient the server sends back; ``local`` — through the auxiliary model's loss
#: on the device (LocFedMix-SL, CSE-FSL; the auxiliary model is trained with it); ``estimate``
#: — with the auxiliary model's estimate of the server's cut-layer gradient, the gradient of
#: its loss w.r.t. the smashed data (FSL-SAGE; the auxiliary model changes only when aligned).
DEVICE_LOSSES = ("server", "local", "estimate")
#: Field metadata of a plan field that stays with the process that made the plan: the plan's
#: encoding (:mod:`splitfl.core.plan_codec`) leaves it out and the receiver has its default.
NOT_CARRIED = {"carried": False}


@dataclass(frozen=True)
class AuxSpec:
    """The auxiliary model of a plan, as data: ``model`` is a name registered in
    :mod:`splitfl.models.aux` or an import path ``package.module:callable``; it maps a batch of
    smashed data (``input_shape`` per sample) to ``num_classes`` logits."""

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


@dataclass
class ClientTask:
    """One participant's work in a round.

    ``init_state`` (device-part state to start from instead of the global model) and
    ``aux_state`` (the client's auxiliary model, :attr:`RoundPlan.aux`; required when the plan
    has one) serve algorithms whose clients keep models between aggregations;
    ``download_model``/``upload_model`` tell the cost model whether the device part crosses the
    network this round. ``align``: the server aligns this client's auxiliary model at its first
    step (:class:`AlignSpec`), on ``aux_memory`` (the smashed data — every tensor that crossed
    the cut — and labels it kept from the client's earlier uploads) plus what the client
    uploads meanwhile.
    """

    client: int
    cut: int
    group: int = 0
    batch_size: int = 32
    steps: int = 1
    lr: float = 0.01
    init_state: dict[str, torch.Tensor] | None = None
    aux_state: dict[str, torch.Tensor] | None = None
    download_model: bool = True
    upload_model: bool = True
    align: bool = False
    aux_memory: tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor] | None = None


#: The drop reason of the RingSFL member whose failure abandoned a networked ring round (its
#: device lost or silent, or a hop or report of it rejected) starts with this; the other
#: members' read ``ring round abandoned: client <k> failed: ...``. RingSFL leaves that member
#: out of the next rounds' ring (``options.ringsfl.exclude_rounds``).
RING_MEMBER_FAILED = "ring member failed"


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


@dataclass
class RoundPlan:
    """What the executor must run this round.

    Attributes:
        tasks: One task per participant.
        server_mode: One of :data:`SERVER_MODES`.
        group_loss: ``mean`` (every sample of the group's union weighs the same), ``sum``
            (sum of the members' own mean losses) — S²FL Eq. (3) — or ``member_mean`` (the
            mean of the members' mean losses: the server's gradient is the sum of theirs
            scaled 1/N, RingSFL's SplitFed baseline).
        device_grad: ``union`` = each device receives ∂loss/∂fx_i of the group loss (Eq. 4 as
            printed); ``own`` = rescaled to the gradient of its own mean loss.
        order: Order in which ``sequential`` and ``round_robin`` modes serve clients.
        server_lr: Learning rate of the server-side copies (default: the first task's).
        device_loss: One of :data:`DEVICE_LOSSES`; with ``local``/``estimate`` no gradient is
            sent back and ``aux`` names the auxiliary model.
        aux: The auxiliary model (:class:`AuxSpec`) of ``local``/``estimate`` plans.
        upload_every, upload_phase: Devices of an auxiliary plan send their smashed data to the
            server only at steps ``s`` with ``s % upload_every == upload_phase`` (CSE-FSL's
            upload period h); the server trains on each upload.
        align: FSL-SAGE's alignment (:class:`AlignSpec`) for tasks with ``align`` set.
        mixup_alpha: If set, the server also trains on mixup of the smashed data of random
            pairs of a group's members (λ ~ Beta(α, α)), as LocFedMix-SL.
        chain_devices: In ``sequential`` mode, each client starts from the device part the
            previous client trained (vanilla split learning) instead of the global one.
        ring: If set, the round is RingSFL's ring training (tasks hold full models).
        info: Algorithm-specific facts logged with the round's metrics (the planner's own:
            not carried to other processes, :data:`NOT_CARRIED`).
        group_forward: One of :data:`GROUP_FORWARDS`. With ``concat``, members with different
            cut points cannot share a server input: each cut point's members form their own
            merged batch (one forward per distinct cut, in member order). The per-member
            losses are slices of the merged output, so ``group_loss``/``device_grad`` apply
            unchanged; without sample-coupling layers both choices compute the same.
    """

    tasks: list[ClientTask]
    server_mode: str = "per_step"
    group_loss: str = "mean"
    device_grad: str = "union"
    order: list[int] = field(default_factory=list)
    server_lr: float | None = None
    device_loss: str = "server"
    aux: AuxSpec | None = None
    upload_every: int = 1
    upload_phase: int = 0
    align: AlignSpec | None = None
    mixup_alpha: float | None = None
    chain_devices: bool = False
    ring: RingSpec | None = None
    info: dict[str, Any] = field(default_factory=dict, metadata=NOT_CARRIED)
    group_forward: str = "separate"
    #: Where each group's server part runs, as data: group → the client whose *device* runs
    #: it (ParallelSFL's top workers, which reach their members over device-to-device links).
    #: Groups not named run on the parameter server. The arithmetic is the same wherever it
    #: runs; the networked executor places the work accordingly.
    hosts: dict[int, int] = field(default_factory=dict)
    #: The round this plan is for (set by the experiment after planning; executors that
    #: emulate time-varying devices read it).
    round_idx: int | None = None

    def uploads(self, step: int) -> bool:
        """Whether step ``step``'s smashed data go to the server (every step but in auxiliary
        plans with an upload period)."""
        return step % self.upload_every == self.upload_phase

    def groups(self) -> dict[int, list[ClientTask]]:
        out: dict[int, list[ClientTask]] = {}
        for task in self.tasks:
            out.setdefault(task.group, []).append(task)
        return out


@dataclass
class ClientUpdate:
    """What a client hands back: its trained device part and how much it processed.

    ``uploaded``: samples whose smashed data reached the server (None: all ``samples``; fewer
    under an upload period); ``loss_sum`` is the server's loss over those. ``aux_memory``: the
    smashed data and labels the server keeps for this client's alignment (FSL-SAGE)."""

    client: int
    cut: int
    group: int
    samples: int
    steps: int
    state: dict[str, torch.Tensor]
    loss_sum: float
    aux_state: dict[str, torch.Tensor] | None = None
    uploaded: int | None = None
    aux_memory: tuple[torch.Tensor | tuple[torch.Tensor, ...], torch.Tensor] | None = None

    @property
    def loss_samples(self) -> int:
        """Samples ``loss_sum`` is summed over."""
        return self.samples if self.uploaded is None else self.uploaded


@dataclass
class RoundResult:
    """Executor output: client updates and each group's trained server-side copy."""

    updates: list[ClientUpdate]
    server_states: dict[int, dict[str, torch.Tensor]]
    #: Wall-clock seconds each client took, where an executor measured it (a networked one);
    #: None for the simulated executors, whose time is the cost model's.
    measured_time: dict[int, float] | None = None
    #: Bytes each client sent and received over a real transport, where measured; else None.
    measured_bytes: dict[int, int] | None = None
    #: Per client, the measured breakdown (compute, upload, download, server, wait seconds;
    #: wire and payload bytes), where measured.
    measured: dict[int, dict[str, float]] | None = None
    #: Clients that did not complete the round (device lost, stalled or rejected) and why;
    #: they have no update, and the algorithm observes and aggregates the others only.
    dropped: dict[int, str] = field(default_factory=dict)
    #: Wall-clock seconds of the round where measured.
    measured_round_time: float | None = None
    #: The device (its name) that trained each completed client, where there are devices.
    devices: dict[int, str] | None = None
    #: What the executor recovered from this round (a parallel worker lost and replaced, its
    #: units dealt again), one line each; recorded as the row's ``executor_events``.
    events: list[str] = field(default_factory=list)

    @property
    def train_loss(self) -> float:
        samples = sum(u.loss_samples for u in self.updates)
        return sum(u.loss_sum for u in self.updates) / max(samples, 1)


@dataclass
class RoundReport:
    """What the simulated clock measured in a round, as the algorithm's state estimation
    would see it: each participant's time (after jitter) and cost breakdown."""

    times: dict[int, float]
    costs: dict[int, ClientCost]
    jitter: dict[int, float]
    samples: dict[int, int]
    losses: dict[int, float]
    round_time: float
    #: The executor's measured per-client time and bytes (``RoundResult.measured_*``), if any.
    measured_time: dict[int, float] | None = None
    measured_bytes: dict[int, int] | None = None

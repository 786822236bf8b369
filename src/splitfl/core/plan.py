"""The round contract between algorithms and executors (a leaf module: torch only).

An algorithm's :meth:`~splitfl.algorithms.base.Algorithm.plan_round` returns a
:class:`RoundPlan` (one :class:`ClientTask` per participant plus how the server side runs);
an executor (:mod:`splitfl.executors`) runs it and returns a :class:`RoundResult`
(:class:`ClientUpdate` per client, each group's server-side state, optionally measured time
and bytes); the experiment turns the work into simulated time and hands the algorithm a
:class:`RoundReport`. Both sides import this module; it imports neither.
"""

from __future__ import annotations

from dataclasses import KW_ONLY, dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from splitfl.core.topology import (
    AuxSpec,
    DeviceUpdate,
    Estimate,
    LocalLoss,
    Star,
    Topology,
)

if TYPE_CHECKING:
    from splitfl.system.cost import ClientCost

#: Field metadata of a plan field that stays with the process that made the plan: the plan's
#: encoding (:mod:`splitfl.core.plan_codec`) leaves it out and the receiver has its default.
NOT_CARRIED = {"carried": False}


@dataclass(frozen=True)
class Charge:
    """What a task costs beyond its split round, as data the clock adds (the topology family's
    price, :mod:`splitfl.topologies.split`). Inside Eq. (1), with an auxiliary update rule:
    ``aux_flops`` (the auxiliary model's forward + backward per trained sample, on the
    device), ``aux_down``/``aux_up`` (its bytes, with the device part's) and ``server_flops``
    (the server's extra work for the client: FSL-SAGE's alignment). After Eq. (1), in this
    order: ``extra_down`` bytes more downloaded (IFCA's K−1 more models), ``extra_up`` bytes
    more uploaded (negative: tensors not sent, PyramidFL's dropout), ``extra_exchanges``
    message exchanges (each ``devices.exchange_latency_s``), ``extra_device_flops`` on the
    device (IFCA's K forward passes)."""

    aux_flops: float = 0.0
    aux_down: float = 0.0
    aux_up: float = 0.0
    server_flops: float = 0.0
    extra_down: float = 0.0
    extra_up: float = 0.0
    extra_exchanges: int = 0
    extra_device_flops: float = 0.0


@dataclass(frozen=True)
class IdleUpload:
    """A non-participant's upload this round (LocFedMix-SL's earlier clients sending their
    device parts at an aggregation round): its device part at ``cut`` and ``aux_up`` bytes of
    auxiliary model; priced as traffic on the clock, sharing the server link with the round."""

    cut: int
    aux_up: float = 0.0


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
    #: What the task costs beyond its split round (:class:`Charge`; None: nothing more).
    charge: Charge | None = None


#: The drop reason of the RingSFL member whose failure abandoned a networked ring round (its
#: device lost or silent, or a hop or report of it rejected) starts with this; the other
#: members' read ``ring round abandoned: client <k> failed: ...``. RingSFL leaves that member
#: out of the next rounds' ring (``options.ringsfl.exclude_rounds``).
RING_MEMBER_FAILED = "ring member failed"

#: In a :data:`RING_MEMBER_FAILED` reason: the member acknowledged its ring command, then was
#: silent past the server's abort (``timeout_s`` more) while its device stayed connected —
#: hung or hostile, not a lost link. RingSFL leaves it out for the rest of the run
#: (``options.ringsfl.exclude_stalled``; issue 51 item 6: the doubling bench let it back to
#: abandon 2 of 3 rings).
RING_MEMBER_STALLED = "stalled after acknowledging its command"


@dataclass
class RoundPlan:
    """What the executor must run this round: the tasks and, as typed data, the training
    pattern (:mod:`splitfl.core.topology`).

    Attributes:
        tasks: One task per participant.
        topology: The round's training pattern (:class:`~splitfl.core.topology.Star`,
            ``Turns``, ``Ring``, ``Clusters``, ``UShaped`` or a registered payload of one's
            own); every runtime runs it through its family (:mod:`splitfl.topologies`).
        device_update: How devices update their part: None = with the activation gradient the
            server sends back; :class:`~splitfl.core.topology.LocalLoss` or
            :class:`~splitfl.core.topology.Estimate` = from an auxiliary model, no gradient
            sent back.
        info: Algorithm-specific facts logged with the round's metrics (the planner's own:
            not carried to other processes, :data:`NOT_CARRIED`); logged only, never read back.
        control: What the planning algorithm needs back in its own ``observe``/``aggregate``
            (a frozen dataclass of its own, e.g. IFCA's cluster choice; keyed by client, so it
            holds for the plan restricted to the clients that completed); not carried, not
            logged, never read by a runtime.
        round_idx: The round this plan is for (set by the experiment after planning; executors
            that emulate time-varying devices read it).
    """

    tasks: list[ClientTask]
    _: KW_ONLY
    topology: Topology = field(default_factory=Star)
    device_update: DeviceUpdate | None = None
    #: Non-participants' uploads this round (:class:`IdleUpload`), priced with the round.
    idle: dict[int, IdleUpload] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict, metadata=NOT_CARRIED)
    control: Any = field(default=None, metadata=NOT_CARRIED)
    round_idx: int | None = None

    @property
    def aux(self) -> AuxSpec | None:
        """The auxiliary model of an auxiliary device update (None without one)."""
        return None if self.device_update is None else self.device_update.aux

    @property
    def device_loss(self) -> str:
        """The device update rule's wire name: ``server``, ``local`` or ``estimate``."""
        update = self.device_update
        if isinstance(update, LocalLoss) and update.server_gradient:
            return LOCAL_AND_SERVER
        return DEVICE_LOSS_OF.get(type(update), "server")

    def uploads(self, step: int) -> bool:
        """Whether step ``step``'s smashed data go to the server (every step but under an
        auxiliary update rule with an upload period)."""
        return self.device_update is None or self.device_update.uploads(step)

    def groups(self) -> dict[int, list[ClientTask]]:
        out: dict[int, list[ClientTask]] = {}
        for task in self.tasks:
            out.setdefault(task.group, []).append(task)
        return out


#: The wire name of each device update rule (what device processes are told).
DEVICE_LOSS_OF: dict[type, str] = {LocalLoss: "local", Estimate: "estimate"}
#: The device update rules, by wire name.
DEVICE_LOSSES = ("server", "local", "estimate", "local+server")
#: A local loss whose device also receives (and steps with) the server's activation gradient.
LOCAL_AND_SERVER = "local+server"
#: The rules with an auxiliary model on the device (what a device's ``begin`` may name).
AUX_LOSSES = ("local", "estimate", LOCAL_AND_SERVER)


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
    #: The server's own step on its held samples from the model it sent, by parameter name
    #: (FLTrust's ``g_0``, Cao et al. NDSS 2021): filled by the networked executor in every
    #: untrusted round whose rule is ``network.untrusted_aggregation: fltrust``; else None.
    server_move: dict[str, torch.Tensor] | None = None

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

"""The algorithm interface: a few well-named hooks around a round plan.

An algorithm never trains anything itself. Each round the runner asks it to

1. :meth:`Algorithm.select_clients` — who participates,
2. :meth:`Algorithm.plan_round` — each client's cut point, group (one server-side model copy
   per group), batch size and local steps, and how the server processes a group,

then an executor (``splitfl.engine``) runs the plan and returns the trained parts, the shared
cost model turns the work into simulated time, and the algorithm

3. :meth:`Algorithm.observe` — sees each client's measured round time, and
4. :meth:`Algorithm.aggregate` — builds the next global model (default: S²FL Algorithm 1
   layer-wise aggregation weighted by data size, which is FedAvg when nothing is split).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
import torch

from splitfl.algorithms.aggregation import layerwise_aggregate
from splitfl.system.cost import ClientCost, round_times, share_server_link

if TYPE_CHECKING:
    from splitfl.engine.context import RunContext

#: How the server trains a group's copy: ``per_step`` = every iteration, the losses of all
#: active members are combined into one loss (S²FL Eq. 3; a group of one is SplitFed V1);
#: ``sequential`` = members are served one after another, each for all its steps (SplitFed V2).
SERVER_MODES = ("per_step", "sequential")
#: How a ``per_step`` group's server part is run on its members' smashed data: ``concat`` =
#: one forward/backward on the concatenation of the active members that share a cut point
#: (MergeSFL Eq. 16's mixed feature sequence; S²FL's "larger batches"), so layers that couple
#: samples (BatchNorm) see the merged batch; ``separate`` = one forward per member.
GROUP_FORWARDS = ("concat", "separate")


@dataclass
class ClientTask:
    """One participant's work in a round.

    ``init_state`` (device-part state to start from instead of the global model) and
    ``aux_state`` (auxiliary local-loss head) serve algorithms whose clients keep models between
    aggregations; ``download_model``/``upload_model`` tell the cost model whether the device
    part crosses the network this round.
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


@dataclass
class RingSpec:
    """RingSFL's ring for a round: client order, propagation lengths L_i (blocks), weights
    a_i, and whether overlapping blocks use the dynamic learning rate (v2, Eq. 7)."""

    order: list[int]
    lengths: dict[int, int]
    weights: dict[int, float]
    dynamic_lr: bool = False


@dataclass
class RoundPlan:
    """What the executor must run this round.

    Attributes:
        tasks: One task per participant.
        server_mode: One of :data:`SERVER_MODES`.
        group_loss: ``mean`` (every sample of the group's union weighs the same) or ``sum``
            (sum of the members' own mean losses) — S²FL Eq. (3).
        device_grad: ``union`` = each device receives ∂loss/∂fx_i of the group loss (Eq. 4 as
            printed); ``own`` = rescaled to the gradient of its own mean loss.
        order: Order in which ``sequential`` mode serves clients.
        server_lr: Learning rate of the server-side copies (default: the first task's).
        device_loss: ``server`` — devices are updated with the gradient the server sends back
            (split learning); ``local`` — with the loss of an auxiliary head on the device
            (a linear classifier on the activation), no gradient is sent back.
        mixup_alpha: If set, the server also trains on mixup of the smashed data of random
            pairs of a group's members (λ ~ Beta(α, α)), as LocFedMix-SL.
        chain_devices: In ``sequential`` mode, each client starts from the device part the
            previous client trained (vanilla split learning) instead of the global one.
        ring: If set, the round is RingSFL's ring training (tasks hold full models).
        info: Algorithm-specific facts logged with the round's metrics.
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
    mixup_alpha: float | None = None
    chain_devices: bool = False
    ring: RingSpec | None = None
    info: dict[str, Any] = field(default_factory=dict)
    group_forward: str = "separate"

    def groups(self) -> dict[int, list[ClientTask]]:
        out: dict[int, list[ClientTask]] = {}
        for task in self.tasks:
            out.setdefault(task.group, []).append(task)
        return out


@dataclass
class ClientUpdate:
    """What a client hands back: its trained device part and how much it processed."""

    client: int
    cut: int
    group: int
    samples: int
    steps: int
    state: dict[str, torch.Tensor]
    loss_sum: float
    aux_state: dict[str, torch.Tensor] | None = None


@dataclass
class RoundResult:
    """Executor output: client updates and each group's trained server-side copy."""

    updates: list[ClientUpdate]
    server_states: dict[int, dict[str, torch.Tensor]]

    @property
    def train_loss(self) -> float:
        samples = sum(u.samples for u in self.updates)
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


class Algorithm:
    """Base class: uniform client selection, Algorithm-1 aggregation, no state.

    Subclasses set ``name``, ``paper`` and ``Options`` (a frozen dataclass of their options) and
    implement :meth:`plan_round`.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    Options: ClassVar[type] = object

    def __init__(self, options: Any, ctx: RunContext):
        self.options = options
        self.ctx = ctx

    # -- hooks -------------------------------------------------------------------------------
    def select_clients(self, round_idx: int, rng: np.random.Generator) -> list[int]:
        """Uniformly sample ``train.clients_per_round`` clients without replacement."""
        n = self.ctx.num_clients
        k = self.ctx.config.train.clients_per_round
        return sorted(int(c) for c in rng.choice(n, size=k, replace=False))

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        """Each client's task and how the server processes the round (subclasses define it)."""
        raise TypeError(f"{type(self).__name__} does not define plan_round")

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        """Called with every participant's measured round time and cost (after jitter)."""

    def client_cost(self, task: ClientTask, samples: int, round_idx: int, plan: RoundPlan):
        """The shared cost model applied to a task (override where the topology differs,
        e.g. clusters with top workers)."""
        return self.ctx.task_cost(task, samples, round_idx, plan.device_loss)

    def idle_costs(self, plan: RoundPlan, round_idx: int) -> dict[int, ClientCost]:
        """Transfers of clients that do not train this round but must send something (e.g.
        LocFedMix-SL's earlier clients uploading their device parts at an aggregation round);
        charged as traffic, and their time bounds the round. Default: none."""
        del plan, round_idx
        return {}

    def share_links(
        self, costs: dict[int, ClientCost], plan: RoundPlan, round_idx: int
    ) -> dict[int, ClientCost]:
        """The round's costs with the server link shared by the participants' transfers
        (``devices.contention``, :func:`~splitfl.system.cost.share_server_link`); transfers of
        a plan that chains its clients (vanilla SL) never overlap. Override where the topology
        accounts for sharing itself."""
        pop = self.ctx.population
        if not (self.ctx.config.devices.contention and pop.shared_server):
            return costs
        return share_server_link(costs, pop.server, concurrent=not plan.chain_devices)

    def round_time(self, times: dict[int, float]) -> tuple[float, dict[int, float]]:
        """Round time and per-client waiting: participants work in parallel (max)."""
        return round_times(times)

    def aggregate(
        self, global_state: dict[str, torch.Tensor], plan: RoundPlan, result: RoundResult
    ) -> dict[str, torch.Tensor]:
        """S²FL Algorithm 1 with weights |D_i| (reduces to FedAvg for unsplit models)."""
        weights = {u.client: float(self.ctx.data_sizes[u.client]) for u in result.updates}
        return layerwise_aggregate(global_state, result.updates, result.server_states, weights)

    # -- checkpointing -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        del state

    # -- helpers for subclasses --------------------------------------------------------------
    def make_task(self, client: int, cut: int, group: int, round_idx: int) -> ClientTask:
        """A task with the run's batch size, round learning rate and local steps."""
        return ClientTask(
            client=client,
            cut=cut,
            group=group,
            batch_size=self.ctx.config.train.batch_size,
            steps=self.ctx.local_steps(client),
            lr=self.ctx.lr_at(round_idx),
        )

"""The algorithm interface: a few well-named hooks around a round plan.

An algorithm never trains anything itself. Each round the runner asks it to

1. :meth:`Algorithm.select_clients` — who participates,
2. :meth:`Algorithm.plan_round` — each client's cut point, group (one server-side model copy
   per group), batch size and local steps, and how the server processes a group,

then an executor (``splitfl.experiment``) runs the plan (the contract: :mod:`splitfl.core.plan`) and
returns the trained parts, the shared cost model turns the work into simulated time, and the
algorithm

3. :meth:`Algorithm.observe` — sees each client's measured round time, and
4. :meth:`Algorithm.aggregate` — builds the next global model (default: S²FL Algorithm 1
   layer-wise aggregation weighted by data size, which is FedAvg when nothing is split).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from splitfl.aggregation.layerwise import Rule, layerwise_aggregate
from splitfl.algorithms.view import FederationView
from splitfl.core.plan import ClientTask, RoundPlan, RoundReport, RoundResult
from splitfl.core.topology import Star, Turns


@dataclass(frozen=True)
class SplitOptions:
    """The options of an algorithm that splits the model at one cut: ``cut``, a block index
    (null: the model's default cut — its paper's split, else its last candidate). Resolved once,
    when the algorithm is built (:meth:`Algorithm.__init__`): the algorithm's ``options.cut``
    is then always a checked block index."""

    cut: int | None = None


class Algorithm:
    """Base class: uniform client selection, Algorithm-1 aggregation, no state.

    Subclasses set ``name``, ``paper`` and ``Options`` (a frozen dataclass of their options) and
    implement :meth:`plan_round`.
    """

    name: ClassVar[str] = ""
    paper: ClassVar[str] = ""
    Options: ClassVar[type] = object
    #: What the control reads of training besides the clock, the partition and sample counts
    #: (losses, model updates), in one line; "" = nothing, so ``executor: timing`` (which trains
    #: nothing) charges exactly the time and traffic of a trained run.
    training_signals: ClassVar[str] = ""
    #: What stands in for :attr:`training_signals` under ``executor: timing``, in one line;
    #: "" with signals declared = ``executor: timing`` refuses the algorithm.
    timing_stand_in: ClassVar[str] = ""
    #: What of the control needs class labels (the clients' label histograms), in one line;
    #: "" = none, so any ``train.loss`` runs. Set: a ``train.loss`` other than
    #: ``cross_entropy`` (regression, multi-label) is refused at validation.
    needs_class_labels: ClassVar[str] = ""
    #: ``train.aggregation`` rules the algorithm's aggregation supports
    #: (:mod:`splitfl.aggregation.robust`); the validation refuses others in one line.
    aggregations: ClassVar[tuple[str, ...]] = (
        "mean",
        "clip_mean",
        "median",
        "trimmed_mean",
        "centered_clip",
    )
    #: ``executor: parallel``: "" when a round's groups are independent units (dealt to the
    #: workers), else why a round is one coupled unit (it runs in the driver, as sequential).
    coupled_round: ClassVar[str] = ""
    #: ``train.server_optimizer``: "" when :meth:`aggregate` returns the one global model
    #: every client starts from (the server step applies to it), else why not, in one line
    #: (the validation refuses a server optimiser with it).
    no_server_optimizer: ClassVar[str] = ""
    #: ``executor: networked``: "" when device processes can run the algorithm's plans, else
    #: why not, in one line (the validation refuses it).
    not_networked: ClassVar[str] = ""
    #: The topology payload its plans use (:mod:`splitfl.core.topology`; its family in
    #: :mod:`splitfl.topologies` runs and prices them); ``splitfl list`` names it.
    topology: ClassVar[type] = Star
    #: Whether its plans cut the model (False: every client trains the whole model, cut =
    #: the number of blocks; such an algorithm runs a model without a usable cut point).
    splits_model: ClassVar[bool] = True
    #: The server's own step of the round being aggregated (``RoundResult.server_move``,
    #: FLTrust's ``g_0``; set by the round step before :meth:`aggregate`), else None.
    server_move: dict[str, torch.Tensor] | None = None

    @classmethod
    def networked_problem(cls, options: Any) -> str:
        """Why ``executor: networked`` cannot run the algorithm with ``options`` ("" if it
        can). Default: :attr:`not_networked`."""
        del options
        return cls.not_networked

    def __init__(self, options: Any, ctx: FederationView):
        """``ctx``: what the algorithm reads of the run (:class:`~splitfl.algorithms.view.
        FederationView`; the experiment hands in its run context, which algorithms never
        import)."""
        if isinstance(options, SplitOptions):  # the one place a cut option is resolved
            options = dataclasses.replace(options, cut=ctx.resolve_cut(options.cut, self.name))
        self.options = options
        self.ctx: FederationView = ctx

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

    def lost(self, round_idx: int, plan: RoundPlan, dropped: dict[int, str]) -> None:
        """Called every round with the clients the round lost and why (networked runs: a
        device gone, stalled or rejected; empty otherwise), before :meth:`observe`."""

    def aggregate(
        self, global_state: dict[str, torch.Tensor], plan: RoundPlan, result: RoundResult
    ) -> dict[str, torch.Tensor]:
        """S²FL Algorithm 1 with weights |D_i| (reduces to FedAvg for unsplit models)."""
        weights = {u.client: float(self.ctx.data_sizes[u.client]) for u in result.updates}
        return layerwise_aggregate(
            global_state, result.updates, result.server_states, weights, self.aggregation
        )

    @property
    def aggregation(self) -> Rule:
        """The run's aggregation rule (every algorithm's averaging uses it):
        ``train.aggregation``, or ``network.untrusted_aggregation`` for an untrusted
        networked fleet (:meth:`Rule.of_run`), with the round's server step
        (:attr:`server_move`, for ``fltrust``)."""
        return Rule.of_run(self.ctx.config, self.server_move)

    def notes(self) -> list[str]:
        """What ``splitfl validate`` should tell the user about this run's configuration
        beyond the config itself (one line each; e.g. S²FL's warm-up rounds). Default: none."""
        return []

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


def chained(plan: RoundPlan) -> bool:
    """Whether ``plan``'s clients are one chain (vanilla SL): their transfers never overlap."""
    return isinstance(plan.topology, Turns) and plan.topology.chain

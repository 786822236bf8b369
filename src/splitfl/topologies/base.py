"""The topology contract: what a training pattern's family tells every runtime.

A plan's topology payload (:mod:`splitfl.core.topology`) says *what* a round's training looks
like; its :class:`Family` says *how* to run and price it. Every runtime looks the family up
once per round, by the payload's type (:func:`family_of`), and asks it:

* :meth:`Family.units` — the round's independent units (groups) with where each member's
  device state starts; ``executor: parallel`` deals them to its workers when
  :meth:`Family.dealable` says so;
* :meth:`Family.run_unit` — one unit trained in-process over a fleet of devices (local roles,
  a worker's, or a networked fleet on the server: the same schedule on every runtime);
* :meth:`Family.untrained` — the shape of a trained round without training
  (``executor: timing``);
* :meth:`Family.batched` — whether ``executor: vectorized`` has a batched twin for the plan
  (else it runs the reference, the sequential schedule);
* the clock's side: :meth:`Family.price` (every participant's cost; None: each task's cost in
  the algorithm's cost model, S²FL Eq. 1 with its task-level charges), :meth:`Family.share_links`
  (the server link shared by concurrent transfers) and :meth:`Family.round_time` (the round
  time and each participant's waiting).

Families register with :func:`register` (the tree's own in :mod:`splitfl.topologies`; a
user's from outside the tree the same way), which also lets the plan codec carry the payload
to worker processes and devices.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import numpy as np
import torch

from splitfl.core.plan import ClientTask, ClientUpdate, RoundPlan, RoundResult
from splitfl.core.plan_codec import register_plan_type
from splitfl.core.topology import Topology
from splitfl.system.cost import round_times, share_server_link

State = dict[str, torch.Tensor]
#: Mean training loss every client reports under ``executor: timing`` (no training happens);
#: the metrics row records ``train_loss: null`` all the same.
STAND_IN_LOSS = 1.0


@dataclass
class UnitEnv:
    """Where a unit trains in-process: the round's model (its weights loaded), plan, training
    settings and runtime; the mixup stream ``gen``; the round seed; the part pool (None: fresh
    copies); each client's samples ``data_of(client) -> (x, y, indices)`` and pre-drawn
    mini-batches ``batches`` (None: each device draws its own); ``tap``: where the server
    side records what it receives (:class:`~splitfl.roles.cut_record.Tap`, None: not
    recorded)."""

    model: Any  # splitfl.models.BlockModel
    plan: RoundPlan
    train: Any  # splitfl.config.TrainConfig
    runtime: Any  # splitfl.roles.sides.Runtime
    gen: np.random.Generator
    round_seed: int
    data_of: Callable[[int], tuple]
    pool: Any = None  # splitfl.roles.parts.PartPool
    batches: dict[int, list[torch.Tensor]] | None = None
    tap: Any = None  # splitfl.roles.cut_record.Tap

    def batches_of(self, client: int) -> list[torch.Tensor] | None:
        return None if self.batches is None else self.batches.get(client)


class PriceView(Protocol):
    """What a family's price reads of the run (the experiment's run context provides it)."""

    profile: Any  # splitfl.models.profile.ModelProfile
    population: Any  # splitfl.system.devices.Population
    config: Any  # splitfl.config.ExperimentConfig
    num_blocks: int
    data_sizes: Any  # sequence of |D_i|

    def round_samples(self, client: int, batch_size: int, steps: int) -> int: ...

    def task_cost(self, task: ClientTask, samples: int, r: int, device_loss: str, **extra): ...

    def client_cost(self, client: int, cut: int, samples: int, r: int, **flags): ...

    def charge_defence(
        self, cost, cut: int, samples: int, batch_size, device, tail: int | None = None
    ) -> None: ...


class Family(ABC):
    """A training pattern's schedule, units and price (subclass per payload type; a family
    that leaves an abstract method undefined cannot be built, so it never reaches a runtime)."""

    #: The payload type this family runs (a :class:`~splitfl.core.topology.Topology`).
    payload: ClassVar[type] = Topology
    #: One line for ``splitfl list``: the pattern in words.
    summary: ClassVar[str] = ""
    #: Whether each unit trains under its own torch random stream (dropout masks), so that
    #: what it computes does not depend on which units ran before it (False: the round's one
    #: coupled unit trains under the round's stream).
    own_stream: ClassVar[bool] = True

    def dealable(self, plan: RoundPlan) -> str:
        """ "" when ``plan``'s units are independent (``executor: parallel`` deals them), else
        why the round is one coupled unit (it then runs in the driver)."""
        del plan
        return ""

    def batched(self, plan: RoundPlan, model: torch.nn.Module) -> bool:
        """Whether ``executor: vectorized`` runs ``plan`` batched (default: no, the reference)."""
        del plan, model
        return False

    @abstractmethod
    def units(self, model: Any, plan: RoundPlan) -> list[Any]:
        """The round's units (a :class:`~splitfl.roles.fleet.GroupRun` per group)."""

    def start_of(self, starts: Any, task: ClientTask, plan: RoundPlan) -> State:
        """Where ``task``'s device state starts (``starts``: a
        :class:`~splitfl.roles.fleet.StartParts` of the round's model; default: its blocks
        ``[0, cut)`` or the task's ``init_state``). A parallel worker rebuilds a unit's
        starting states with it."""
        del plan
        return starts.of(task)

    def server_blocks(
        self, tasks: list[ClientTask], plan: RoundPlan, num_blocks: int
    ) -> tuple[int, int] | None:
        """The blocks ``[lo, hi)`` a unit's server copy holds (None: no server copy); a
        parallel worker's answer is checked against it. Default: from the unit's lowest cut to
        the end (a star group's server part)."""
        del plan
        cuts = [t.cut for t in tasks if t.cut < num_blocks]
        return (min(cuts), num_blocks) if cuts else None

    @abstractmethod
    def run_unit(self, unit: Any, env: UnitEnv) -> tuple[list[ClientUpdate], State | None]:
        """One unit trained: its members' updates and its server copy's state (None: none)."""

    @abstractmethod
    def untrained(
        self, plan: RoundPlan, global_state: State, num_blocks: int, samples_of
    ) -> RoundResult:
        """``executor: timing``: what a trained round hands back, untrained: each task's
        starting state, each group's server part of ``global_state``, the samples
        ``samples_of(task)`` its mini-batches hold, :data:`STAND_IN_LOSS` per sample."""

    @abstractmethod
    def price(
        self, view: PriceView, plan: RoundPlan, samples: dict[int, int], r: int
    ) -> dict[int, Any]:
        """Every completed client's :class:`~splitfl.system.cost.ClientCost` (``samples``: what
        each trained), priced for the whole round at once."""

    def idle(self, view: PriceView, plan: RoundPlan, r: int) -> dict:
        """Non-participants' transfers this round (``RoundPlan.idle``), priced: they share the
        server link with the participants' and bound the round time. Default: none."""
        del view, plan, r
        return {}

    def share_links(self, view: PriceView, costs: dict, plan: RoundPlan, r: int) -> dict:
        """The round's costs with the server link shared by concurrent transfers
        (``devices.contention``, resolved per preset: :func:`~splitfl.system.cost.
        share_server_link`); a family whose price accounts for sharing returns ``costs``."""
        del r
        pop = view.population
        if not (view.config.devices.contention and pop.shared_server):
            return costs
        return share_server_link(costs, pop.server, concurrent=self.concurrent(plan))

    def concurrent(self, plan: RoundPlan) -> bool:
        """Whether the participants' transfers overlap in time (False: one after another)."""
        del plan
        return True

    def round_time(
        self,
        view: PriceView,
        plan: RoundPlan,
        r: int,
        priced: dict,
        samples: dict[int, int],
        times: dict[int, float],
    ) -> tuple[float, dict[int, float]]:
        """Round time and each participant's waiting from their ``times`` (after jitter;
        ``priced``: their costs before link sharing). Default: in parallel, the slowest."""
        del view, plan, r, priced, samples
        return round_times(times)


#: The registered families, by payload type.
FAMILIES: dict[type, Family] = {}


def register(family: Family) -> Family:
    """Register ``family`` for its payload type (and the payload with the plan codec)."""
    payload = family.payload
    if not (isinstance(payload, type) and issubclass(payload, Topology)) or payload is Topology:
        raise TypeError(f"{type(family).__name__}.payload must be a Topology subclass")
    register_plan_type(payload)
    FAMILIES[payload] = family
    return family


def family_of(plan: RoundPlan) -> Family:
    """The family that runs ``plan``'s topology (one line naming it if none is registered)."""
    kind = type(plan.topology)
    family = FAMILIES.get(kind)
    if family is None:
        known = ", ".join(sorted(k.__name__ for k in FAMILIES))
        raise TypeError(f"no topology family registered for {kind.__name__} (known: {known})")
    return family

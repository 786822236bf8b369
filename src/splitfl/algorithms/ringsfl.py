"""RingSFL (Shen et al., "RingSFL: An Adaptive Split Federated Learning Towards Taming Client
Heterogeneity"): spec ``papers/ringsfl.md`` §3 (Alg. 1–2, Eq. 1–7).

* Propagation lengths, Eq. (3), rounded by :func:`largest_remainder` (or ``prop_lens``);
  aggregation weights a_i = D_i/ΣD.
* Training: :func:`splitfl.topologies.ring.member.ring_batch_update` (Alg. 2), the rate × N
  (§3.4, Eq. 6); ``version: v2`` scales overlapping blocks by |U_i,(j)| (Eq. 7).
* Server aggregation: plain average of the blended models (Eq. 5).
* Round time (``pipeline``): ``ideal`` (§3.3, default), ``schedule``
  (:func:`splitfl.topologies.ring.schedule.ring_makespan`), ``arrival``; cost per client:
  :func:`splitfl.topologies.ring.clock.ring_client_cost`.

How each sentence of the paper is read, and why (a lost member, the three round-time models):
``docs/explanation/readings/ringsfl.md``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.algorithms.base import Algorithm
from splitfl.config import ConfigError
from splitfl.core.benching import SitOut
from splitfl.core.plan import RING_MEMBER_FAILED, RING_MEMBER_STALLED, ClientTask, RoundPlan
from splitfl.core.topology import Ring, RingSpec
from splitfl.roles.defences import OFF, active_defences


def largest_remainder(shares: Sequence[float], total: int) -> list[int]:
    """Integers ≥ 1 summing to ``total`` proportional to ``shares``.

    Rounding rule: floor of each exact share, the remaining blocks to the largest remainders
    (ties: lower index); then every client left with 0 blocks takes one from the client with
    the most blocks. Exact shares stay exact (C = 4:2:1:1 over 16 blocks → 8, 4, 2, 2), and
    RingSFL's public sweeps come out as printed (e.g. 100:1:1:1:1 over 10 blocks → 6:1:1:1:1).
    """
    n = len(shares)
    if total < n:
        raise ValueError(f"{total} blocks cannot give {n} clients at least one block each")
    w = np.asarray(shares, dtype=float)
    if np.any(w <= 0):
        raise ValueError("propagation shares must be positive")
    ideal = w / w.sum() * total
    lengths = np.floor(ideal).astype(int)
    for i in np.argsort(-(ideal - lengths), kind="stable")[: total - lengths.sum()]:
        lengths[i] += 1
    for i in np.flatnonzero(lengths == 0):
        lengths[int(np.argmax(lengths))] -= 1
        lengths[i] = 1
    return lengths.tolist()


def propagation_lengths(power: Sequence[float], num_blocks: int) -> list[int]:
    """Eq. (3): L_i = C_i / ΣC · W, rounded by :func:`largest_remainder`."""
    return largest_remainder(power, num_blocks)


def parse_ratios(spec: str, n: int, num_blocks: int) -> list[int]:
    """Explicit ratios ``"6:1:1:1:1"`` → lengths (rounded as Eq. 3)."""
    parts = [float(p) for p in spec.split(":")]
    if len(parts) != n:
        raise ValueError(f"{len(parts)} ratios for {n} clients")
    return largest_remainder(parts, num_blocks)


#: RingSFL round-time models (module docstring); the first is the paper's (§3.3).
PIPELINES = ("ideal", "schedule", "arrival")


@dataclass(frozen=True)
class RingSFLOptions:
    version: str = "v1"
    prop_lens: str | None = None
    order: str | None = None
    lr_compensation: bool = True
    pipeline: str = "ideal"
    #: Rounds a member that broke a networked ring round sits out, doubled with each further
    #: failure (module docstring; our choice, the paper has no failures); 0: left out only
    #: while its device is not connected
    exclude_rounds: int = 1
    #: A member that acknowledged its ring command and then stalled past the abort (device
    #: connected, hung or hostile: ``core.plan.RING_MEMBER_STALLED``) sits out the rest of the
    #: run, not ``exclude_rounds`` doubling (issue 51 item 6: each return abandoned a ring; our
    #: choice, the paper has no failures); false: the doubling bench as for other failures
    exclude_stalled: bool = True

    def __post_init__(self) -> None:
        if self.version not in ("v1", "v2"):
            raise ConfigError("options.ringsfl.version", "allowed: v1, v2")
        if not 0 <= self.exclude_rounds <= 10**6:
            raise ConfigError("options.ringsfl.exclude_rounds", "an integer >= 0")
        if self.pipeline not in PIPELINES:
            raise ConfigError("options.ringsfl.pipeline", f"allowed: {', '.join(PIPELINES)}")
        if self.prop_lens is not None:
            try:
                [float(p) for p in self.prop_lens.split(":")]
            except ValueError as err:
                raise ConfigError("options.ringsfl.prop_lens", "ratios like 6:1:1:1:1") from err
        if self.order is not None and not all(c.strip().isdigit() for c in self.order.split(",")):
            raise ConfigError("options.ringsfl.order", "client ids like 0,2,1")


def check_plain_sgd(train) -> None:
    """RingSFL's ring step is plain SGD (Alg. 2 and Eq. 6-7; the authors' code uses no momentum
    or weight decay): reject a config that asks for either, or another optimiser, rather than
    ignore it."""
    if train.optimizer != "sgd":
        raise ConfigError(
            "train.optimizer",
            f"RingSFL trains with plain SGD (Alg. 2, Eq. 6-7); must be sgd (got {train.optimizer})",
        )
    for name in ("momentum", "weight_decay"):
        value = getattr(train, name)
        if value:
            raise ConfigError(
                f"train.{name}",
                f"RingSFL trains with plain SGD (Alg. 2, Eq. 6-7); must be 0 (got {value})",
            )


def check_no_defence(defence) -> None:
    """RingSFL's ring step (Alg. 2) does not run the device defences of
    :mod:`splitfl.roles.defences`: refuse one that is switched on rather than train without it
    (and charge nothing) while the config says it is on."""
    for name in active_defences(defence)[:1]:
        raise ConfigError(
            f"train.defence.{name}",
            f"RingSFL's ring does not apply device defences; must be {OFF[name]} "
            f"(got {getattr(defence, name)})",
        )


class RingSFL(Algorithm):
    name = "ringsfl"
    paper = "Shen et al., RingSFL §3 (Alg. 1-2, Eq. 1-7)"
    Options = RingSFLOptions
    topology = Ring
    coupled_round = "one ring: every batch crosses every device"

    def __init__(self, options: RingSFLOptions, ctx) -> None:
        super().__init__(options, ctx)
        n, w = ctx.num_clients, ctx.num_blocks

        self.order = list(range(n))
        if options.order is not None:
            try:
                self.order = [int(c) for c in options.order.split(",")]
            except ValueError as err:
                raise ConfigError("options.ringsfl.order", "client ids like 0,2,1") from err
            if sorted(self.order) != list(range(n)):
                raise ConfigError("options.ringsfl.order", f"a permutation of 0..{n - 1}")
        #: members of a round's ring: every client (§3.1), or — with more clients than model
        #: blocks, each member needing one — ``w`` of them drawn every round (said in a note)
        self.ring_size = min(n, w)
        check_plain_sgd(ctx.config.train)
        check_no_defence(ctx.config.train.defence)
        try:
            if options.prop_lens is not None:
                parse_ratios(options.prop_lens, n, w)
                self.shares = [float(p) for p in options.prop_lens.split(":")]
            else:
                self.shares = [d.flops for d in ctx.population.devices]
            # a ring smaller than the federation: each round's lengths over its members
            lengths = propagation_lengths(self.shares, w) if n <= w else []
        except ValueError as err:
            raise ConfigError("options.ringsfl.prop_lens", str(err)) from err
        self.lengths = {c: int(length) for c, length in enumerate(lengths)}
        #: members that broke a ring round, sitting out (failures are never forgiven)
        self.sit_out = SitOut(self.options.exclude_rounds)

    def select_clients(self, round_idx: int, rng: np.random.Generator) -> list[int]:
        """All clients form the ring every round (§3.1), but for a member sitting out after
        breaking a ring round and (networked) one whose device is not connected; all of them
        where fewer than two would be left."""
        everyone = list(range(self.ctx.num_clients))
        reachable = getattr(self.ctx, "reachable", None)
        live = reachable() if callable(reachable) else set(everyone)
        members = [c for c in everyone if c in live and not self.sit_out.out(c, round_idx)]
        members = members if len(members) >= 2 else everyone
        if len(members) > self.ring_size:  # more clients than blocks: a seeded draw
            members = sorted(int(c) for c in rng.choice(members, self.ring_size, replace=False))
        return members

    def notes(self) -> list[str]:
        """A ring smaller than the federation (more clients than model blocks), if it is."""
        n, w = self.ctx.num_clients, self.ring_size
        if n <= w:
            return []
        return [
            f"ringsfl: {n} clients but {w} model blocks (one per ring member): each round's "
            f"ring is {w} clients drawn at random (RingSFL §3.1 rings all clients; use "
            f"data.num_clients <= {w} for that)"
        ]

    def lost(self, round_idx: int, plan: RoundPlan, dropped: dict[int, str]) -> None:
        """A member that broke the ring sits out ``exclude_rounds`` × 2^(failures − 1) rounds;
        one that stalled after acknowledging its command, the rest of the run
        (``exclude_stalled``)."""
        for c, why in dropped.items():
            if not why.startswith(RING_MEMBER_FAILED):
                continue
            if self.options.exclude_stalled and RING_MEMBER_STALLED in why:
                self.sit_out.for_good(c)
            else:
                self.sit_out.fail(c, round_idx)

    def ring_lengths(self, members: list[int]) -> dict[int, int]:
        """Eq. (3) over ``members`` (in id order, as over all clients)."""
        if len(members) == len(self.lengths):
            return dict(self.lengths)
        ids = sorted(members)
        lengths = propagation_lengths([self.shares[c] for c in ids], self.ctx.num_blocks)
        return dict(zip(ids, lengths, strict=True))

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        n = len(clients)
        lr = self.ctx.lr_at(round_idx) * (n if self.options.lr_compensation else 1)
        full = self.ctx.num_blocks
        tasks = [
            ClientTask(c, full, i, self.ctx.config.train.batch_size, self.ctx.local_steps(c), lr)
            for i, c in enumerate(clients)
        ]
        sizes = self.ctx.data_sizes[clients].astype(float)
        weights = {c: float(d / sizes.sum()) for c, d in zip(clients, sizes, strict=True)}
        order = [c for c in self.order if c in weights]
        lengths = self.ring_lengths(order)
        ring = RingSpec(order, lengths, weights, self.options.version == "v2")
        info = {"prop_lens": [lengths[c] for c in order]}
        return RoundPlan(tasks, topology=Ring(spec=ring, pipeline=self.options.pipeline), info=info)

    def aggregate(self, global_state, plan: RoundPlan, result) -> dict:
        """Eq. (5): plain average of the blended models."""
        weights = {u.client: 1.0 for u in result.updates}
        return layerwise_aggregate(
            global_state, result.updates, result.server_states, weights, self.aggregation
        )

    @property
    def benched(self) -> dict[int, int]:
        """Member → the last round it sits out."""
        return self.sit_out.last_out

    @property
    def failures(self) -> dict[int, int]:
        """Member → how often it broke a ring round."""
        return self.sit_out.failures

    def state_dict(self) -> dict:
        return self.sit_out.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.sit_out.load_state_dict(state)

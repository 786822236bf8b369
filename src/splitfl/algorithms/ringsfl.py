"""RingSFL (Shen et al., "RingSFL: An Adaptive Split Federated Learning Towards Taming Client
Heterogeneity"): spec ``papers/ringsfl.md`` §3 (Alg. 1–2, Eq. 1–7).

* Every client takes part each round; they form a ring in ``order`` (client ids separated by
  commas; default by id).
* Propagation lengths (in model *blocks*, e.g. ResNet-18 = 10): Eq. (3) L_i = C_i/ΣC·W from
  the devices' FLOPS, rounded to integers ≥ 1 summing to W by the largest-remainder rule
  (:func:`largest_remainder`), or explicit ratios ``prop_lens: "6:1:1:1:1"``
  rounded the same way. Aggregation weights a_i = D_i/ΣD.
* Training: :func:`splitfl.topologies.ring.member.ring_batch_update` (Alg. 2) every local
  step, plain SGD (``train.momentum``/``weight_decay`` other than 0 are rejected, not ignored) with
  the
  learning rate multiplied by N (``lr_compensation``, §3.4) so a round equals a FedAvg update
  (Eq. 6; tested). ``version: v2`` multiplies the rate of overlapping blocks by |U_i,(j)|
  (Eq. 7); the public code was not found to do this, the paper is followed.
* Server aggregation: plain average of the blended models (Eq. 5).
* A lost member (networked runs; not in the paper, which assumes every client stays, §3.1):
  a round whose ring a member broke (device lost or silent, a hop or report of it rejected;
  :data:`~splitfl.core.plan.RING_MEMBER_FAILED`) is abandoned, as Alg. 2 needs every member in
  every step; that member sits out the next ``exclude_rounds`` rounds (doubling with each
  further failure) and every round its device is not connected (``ctx.reachable``), and the
  ring is formed over the others as the paper forms it over its clients: Eq. (3) lengths
  from their FLOPS (or ``prop_lens`` ratios), a_i over their data, the rate × their number.
  From the next round, not within the round: a ring re-formed mid-round would re-split the
  model while the members hold half-accumulated gradients of the old split.
* Round time (``pipeline``): ``ideal`` (default) — the §3.3 analysis, the most loaded
  member's busy time (segments pipelined without a gap: "the computation time consumed by the
  straggler", Problem (1), plus its ring hops and model transfers); ``schedule`` — the
  makespan of the ring's steps (:func:`splitfl.topologies.ring.schedule.ring_makespan`: each hop
  waits for its input, a member starts a step when its previous one is done, and runs a
  step's jobs in a fixed order, so a faster link never lengthens a round); ``arrival`` — the
  same with each member serving jobs in arrival order, as the networked member does (the
  model the clock validation measured, ``benchmarks/README.md``; not monotone in link rates:
  ResNet-18 took 15,927 s per round at 45 Mb/s and 14,313 s at 42). Measured on emulated
  devices the ideal model under-predicted rounds 1.5–4×; the members' busy times are the
  same in all three. ``schedule`` was the default before issue 32 (item 4).
* Time and energy: :func:`splitfl.topologies.ring.clock.ring_client_cost` per client (its segments'
  compute at its FLOPS, ring hops over D2D links, model download/upload); energy = busy
  compute time × power (preset ``ringsfl_testbed``: PC 65 W, Raspberry Pi 6.4 W).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.algorithms.base import Algorithm
from splitfl.config import ConfigError
from splitfl.core.benching import SitOut
from splitfl.core.plan import RING_MEMBER_FAILED, ClientTask, RoundPlan
from splitfl.core.topology import Ring, RingSpec


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
        if n > w:
            raise ConfigError("data.num_clients", f"RingSFL needs <= {w} clients (model blocks)")
        check_plain_sgd(ctx.config.train)
        try:
            if options.prop_lens is not None:
                parse_ratios(options.prop_lens, n, w)
                self.shares = [float(p) for p in options.prop_lens.split(":")]
            else:
                self.shares = [d.flops for d in ctx.population.devices]
            lengths = propagation_lengths(self.shares, w)
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
        return members if len(members) >= 2 else everyone

    def lost(self, round_idx: int, plan: RoundPlan, dropped: dict[int, str]) -> None:
        """A member that broke the ring sits out ``exclude_rounds`` × 2^(failures − 1) rounds."""
        for c, why in dropped.items():
            if why.startswith(RING_MEMBER_FAILED):
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

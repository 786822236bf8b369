"""RingSFL (Shen et al., "RingSFL: An Adaptive Split Federated Learning Towards Taming Client
Heterogeneity"): spec ``papers/ringsfl.md`` §3 (Alg. 1–2, Eq. 1–7).

* Every client takes part each round; they form a ring in ``order`` (client ids separated by
  commas; default by id).
* Propagation lengths (in model *blocks*, e.g. ResNet-18 = 10): Eq. (3) L_i = C_i/ΣC·W from
  the devices' FLOPS, rounded to integers ≥ 1 summing to W by the largest-remainder rule
  (:func:`largest_remainder`), or explicit ratios ``prop_lens: "6:1:1:1:1"``
  rounded the same way. Aggregation weights a_i = D_i/ΣD.
* Training: :func:`splitfl.executors.ring.ring_batch_update` (Alg. 2) every local step, plain SGD
  (``train.momentum``/``weight_decay`` other than 0 are rejected, not ignored) with the
  learning rate multiplied by N (``lr_compensation``, §3.4) so a round equals a FedAvg update
  (Eq. 6; tested). ``version: v2`` multiplies the rate of overlapping blocks by |U_i,(j)|
  (Eq. 7); the public code was not found to do this, the paper is followed.
* Server aggregation: plain average of the blended models (Eq. 5).
* Time and energy: :func:`splitfl.system.cost.ring_client_cost` per client (its segments'
  compute at its FLOPS, ring hops over D2D links, model download/upload); energy = busy
  compute time × power (preset ``ringsfl_testbed``: PC 65 W, Raspberry Pi 6.4 W).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from splitfl.algorithms.aggregation import layerwise_aggregate
from splitfl.algorithms.base import Algorithm
from splitfl.config import ConfigError
from splitfl.plan import ClientTask, RingSpec, RoundPlan
from splitfl.system.cost import ring_client_cost


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


@dataclass(frozen=True)
class RingSFLOptions:
    version: str = "v1"
    prop_lens: str | None = None
    order: str | None = None
    lr_compensation: bool = True

    def __post_init__(self) -> None:
        if self.version not in ("v1", "v2"):
            raise ConfigError("options.ringsfl.version", "allowed: v1, v2")
        if self.prop_lens is not None:
            try:
                [float(p) for p in self.prop_lens.split(":")]
            except ValueError as err:
                raise ConfigError("options.ringsfl.prop_lens", "ratios like 6:1:1:1:1") from err
        if self.order is not None and not all(c.strip().isdigit() for c in self.order.split(",")):
            raise ConfigError("options.ringsfl.order", "client ids like 0,2,1")


def check_plain_sgd(train) -> None:
    """RingSFL's ring step is plain SGD (Alg. 2 and Eq. 6-7; the authors' code uses no momentum
    or weight decay): reject a config that asks for either rather than ignore it."""
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
                lengths = parse_ratios(options.prop_lens, n, w)
            else:
                lengths = propagation_lengths([d.flops for d in ctx.population.devices], w)
        except ValueError as err:
            raise ConfigError("options.ringsfl.prop_lens", str(err)) from err
        self.lengths = {c: int(length) for c, length in enumerate(lengths)}

    def select_clients(self, round_idx: int, rng: np.random.Generator) -> list[int]:
        """All clients form the ring every round (§3.1)."""
        return list(range(self.ctx.num_clients))

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
        ring = RingSpec(self.order, self.lengths, weights, self.options.version == "v2")
        info = {"prop_lens": [self.lengths[c] for c in self.order]}
        return RoundPlan(tasks, ring=ring, info=info)

    def client_cost(self, task: ClientTask, samples: int, round_idx: int, plan: RoundPlan):
        """Each client's segments over the round (samples of every start that passes it)."""
        ring = plan.ring
        done = {
            t.client: self.ctx.round_samples(t.client, t.batch_size, t.steps) for t in plan.tasks
        }
        work = []
        for start in ring.order:
            for client, lo, hi in ring.segments(start):
                if client == task.client:
                    work.append((lo, hi, done[start], start == client))
        pos = ring.order.index(task.client)
        pop = self.ctx.population
        nxt = pop.at(ring.order[(pos + 1) % len(ring.order)], round_idx)
        prv = pop.at(ring.order[pos - 1], round_idx)
        return ring_client_cost(self.ctx.profile, work, pop.at(task.client, round_idx), nxt, prv)

    def aggregate(self, global_state, plan: RoundPlan, result) -> dict:
        """Eq. (5): plain average of the blended models."""
        weights = {u.client: 1.0 for u in result.updates}
        return layerwise_aggregate(global_state, result.updates, result.server_states, weights)

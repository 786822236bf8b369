"""U-shaped split learning (Vepakomma et al., "Split learning for health: Distributed deep
learning without sharing raw patient data", 2018, §"U-shaped configurations for split
learning without label sharing"), federated the SplitFed way.

Each selected client's device trains the front (blocks ``[0, cut)``) and the head (blocks
``[tail, n)``, with the loss and the labels); the server trains the middle ``[cut, tail)``
(:class:`~splitfl.core.topology.UShaped`; the family: :mod:`splitfl.topologies.ushaped`).
After the round the device parts (front and head) and the middle copies are averaged,
weighted by |D_i|, as SplitFed V1 averages device parts and server copies (Thapa et al.,
AAAI 2022) — the paper itself describes one client; the federation is SplitFed's.

Options: ``cut`` (null: the model's first candidate cut point), ``tail`` (null: its last;
``cut < tail``), ``server_middle``: ``per_client`` (one middle copy per client, SplitFed V1's
server side; default) or ``shared`` (one middle for the round's clients, every step on the
mean loss over all their samples, as S²FL's groups).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.algorithms.base import Algorithm
from splitfl.config import ConfigError
from splitfl.core.plan import RoundPlan
from splitfl.core.topology import UShaped

#: ``server_middle`` values (module docstring).
SERVER_MIDDLES = ("per_client", "shared")


@dataclass(frozen=True)
class UShapedOptions:
    """``cut``: the front's end (null: the model's first candidate cut point); ``tail``: the
    head's first block (null: the model's last candidate cut point); ``server_middle``:
    ``per_client`` or ``shared``."""

    cut: int | None = None
    tail: int | None = None
    server_middle: str = "per_client"

    def __post_init__(self) -> None:
        if self.server_middle not in SERVER_MIDDLES:
            raise ConfigError(
                "options.ushaped_sl.server_middle",
                f"allowed: {', '.join(SERVER_MIDDLES)} (got {self.server_middle!r})",
            )


class UShapedSL(Algorithm):
    name = "ushaped_sl"
    paper = "Vepakomma et al. 2018 (split learning for health), U-shaped: labels stay on device"
    Options = UShapedOptions
    topology = UShaped

    def __init__(self, options: UShapedOptions, ctx):
        super().__init__(options, ctx)
        self.cut, self.tail = self._cuts()

    def _cuts(self) -> tuple[int, int]:
        """(cut, tail), checked: both candidate-range block indices, cut < tail."""
        points = list(self.ctx.cut_points)
        if len(points) < 2 and (self.options.cut is None or self.options.tail is None):
            raise ConfigError(
                "options.ushaped_sl",
                f"model {self.ctx.config.model} has {len(points)} candidate cut point(s); "
                "U-shaped split learning needs two (set cut and tail)",
            )
        cut = points[0] if self.options.cut is None else self.options.cut
        tail = points[-1] if self.options.tail is None else self.options.tail
        n = self.ctx.num_blocks
        for key, value in (("cut", cut), ("tail", tail)):
            if not 1 <= value < n:
                raise ConfigError(f"options.ushaped_sl.{key}", f"must be in [1, {n - 1}]")
        if not cut < tail:
            raise ConfigError("options.ushaped_sl.tail", f"must be above cut {cut} (got {tail})")
        return cut, tail

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        shared = self.options.server_middle == "shared"
        tasks = [
            self.make_task(c, self.cut, 0 if shared else i, round_idx)
            for i, c in enumerate(clients)
        ]
        return RoundPlan(tasks, topology=UShaped(tails=dict.fromkeys(clients, self.tail)))

    def aggregate(self, global_state, plan: RoundPlan, result) -> dict:
        """SplitFed's averages with weights |D_i|: each layer from the device copies where the
        device holds it (front, head), else from the client's middle copy."""
        n = self.ctx.num_blocks
        whole = [
            replace(u, cut=n, state={**result.server_states[u.group], **u.state})
            for u in result.updates
        ]
        weights = {u.client: float(self.ctx.data_sizes[u.client]) for u in result.updates}
        return layerwise_aggregate(global_state, whole, {}, weights, self.aggregation)

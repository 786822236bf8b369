"""SplitFed as RingSFL's authors ran it: the "SplitFed" baseline of RingSFL §4 (Table 3).

RingSFL compares against "SplitFed [34]" (Thapa et al.), and the authors' code for that
baseline (``ShenJinglong/StalRingSFL``, ``alg/splitfed.py``; public-implementation facts:
"one shared server model, grad scaled 1/N, cut 2") is neither of Thapa's two variants:

* **One shared server model**, kept from round to round. Every iteration all clients
  forward a mini-batch through their own device part in parallel; the server runs its part
  on each client's smashed data separately (``group_forward: separate``) and takes **one**
  SGD step on the mean of the clients' mean losses, i.e. on the sum of the per-client
  gradients scaled by 1/N (``group_loss: member_mean``). Each client receives the gradient of
  its own mean loss (``device_grad: own``) and steps its device part.
* Device parts start the round from the global device part and are averaged at its end
  (|D_i| weights; the authors' code weighs clients equally — the same on its equal shards).

How it differs from the other SplitFeds: **SplitFed V1** (:mod:`~splitfl.algorithms.
splitfed_v1`) keeps one server copy per client, trained on that client's loss only and
averaged after the round — with plain SGD exactly FedAvg with the model split.
**SplitFed V2** (:mod:`~splitfl.algorithms.splitfed_v2`) has one server model but serves the
clients one after another, each for all its local steps. Here the shared server part takes
one averaged step per iteration over all clients' batches, while each device part follows
its own client's data until the round-end average.

N is the number of clients still training in that iteration: all of them when every client
runs the same number of steps (the RingSFL configs: equal shards; the authors' loop stops at
the shortest client's data). The default cut is 2 (the authors' ``cut_point``: the device
holds blocks 0–1); ``cut: null`` takes the model's last candidate cut. The plan is S²FL's
per-step group (:class:`splitfl.topologies.star.StarFamily`) with all clients in one group, so
the sequential, vectorised and networked executors all run it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.core.plan import RoundPlan
from splitfl.core.topology import ServerSpec, Star


@dataclass(frozen=True)
class SplitFedRingOptions(SplitOptions):
    """``cut``: block index where the model is split (default 2, the authors' ``cut_point``);
    null = the model's last candidate cut."""

    cut: int | None = 2


class SplitFedRingSFL(Algorithm):
    name = "splitfed_ringsfl"
    paper = (
        "RingSFL §4 'SplitFed' baseline as the authors' code runs it: one shared server model, "
        "one step per iteration on the clients' gradients scaled 1/N (not SFLV1/V2)"
    )
    Options = SplitFedRingOptions
    coupled_round = "one server copy for all clients"

    def __init__(self, options: SplitFedRingOptions, ctx) -> None:
        super().__init__(options, ctx)
        self.cut = self.options.cut

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        """All clients in group 0 (one server model), trained every iteration together."""
        tasks = [self.make_task(c, self.cut, 0, round_idx) for c in clients]
        server = ServerSpec(group_loss="member_mean", device_grad="own", forward="separate")
        return RoundPlan(tasks, topology=Star(server=server))

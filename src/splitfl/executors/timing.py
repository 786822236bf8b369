"""``executor: timing``: a round's plan priced on the clock without training anything.

:class:`TimingExecutor` hands back, for every task of the plan, the update a trained round
would have the *shape* of — the client's starting device part (``init_state`` or the global
model's blocks ``[0, cut)``), unchanged; each group's server part of the global model,
unchanged — with the number of samples the client would have processed (its mini-batches over
``steps`` iterations, :meth:`~splitfl.experiment.context.RunContext.round_samples`, what the
reference executor counts). The algorithm's control (selection, planning, ``observe``,
``aggregate``) and the clock (:func:`~splitfl.experiment.round_step.measure`) run as usual, so
per-round time, traffic and waiting are what a trained run charges for the same plans whenever
the control reads only the clock, the partition and sample counts; nothing is evaluated.

Control that reads training signals (losses, model updates) declares it
(``Algorithm.training_signals``) and says what stands in for them here
(``Algorithm.timing_stand_in``); the executor's part of every stand-in is one number: each
client's training loss is :data:`STAND_IN_LOSS` per sample.
"""

from __future__ import annotations

import torch

from splitfl.core.plan import RoundPlan, RoundResult
from splitfl.topologies import STAND_IN_LOSS, family_of

__all__ = ["STAND_IN_LOSS", "TimingExecutor"]

State = dict[str, torch.Tensor]


class TimingExecutor:
    """Untrained rounds with the reference executor's sample counts (module docstring)."""

    #: Nothing is trained, so the experiment evaluates nothing and records no training loss.
    trains = False

    def __init__(self, device: str = "cpu", precision: str = "fp32", channels_last: bool = False):
        del device, precision, channels_last  # nothing is computed

    def run_round(self, ctx, global_state: State, plan: RoundPlan, round_seed: int) -> RoundResult:
        """The plan's topology family's untrained round (:meth:`Family.untrained`)."""
        del round_seed  # nothing random is drawn

        def samples_of(task) -> int:
            return ctx.round_samples(task.client, task.batch_size, task.steps)

        return family_of(plan).untrained(plan, global_state, ctx.num_blocks, samples_of)

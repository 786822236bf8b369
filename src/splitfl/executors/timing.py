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

from splitfl.core.plan import ClientTask, ClientUpdate, RoundPlan, RoundResult
from splitfl.core.topology import Ring
from splitfl.models import block_index

#: Mean training loss every client reports under ``executor: timing`` (no training happens);
#: the metrics row records ``train_loss: null`` all the same.
STAND_IN_LOSS = 1.0

State = dict[str, torch.Tensor]


def _blocks(state: State, lo: int, hi: int) -> State:
    """The entries of ``state`` (full-model keys) in blocks ``[lo, hi)``, not copied."""
    return {k: v for k, v in state.items() if lo <= block_index(k) < hi}


class TimingExecutor:
    """Untrained rounds with the reference executor's sample counts (module docstring)."""

    #: Nothing is trained, so the experiment evaluates nothing and records no training loss.
    trains = False

    def __init__(self, device: str = "cpu", precision: str = "fp32", channels_last: bool = False):
        del device, precision, channels_last  # nothing is computed

    def run_round(self, ctx, global_state: State, plan: RoundPlan, round_seed: int) -> RoundResult:
        del round_seed  # nothing random is drawn
        n = ctx.num_blocks
        if isinstance(plan.topology, Ring):
            updates = [self._update(ctx, global_state, plan, t) for t in plan.tasks]
            return RoundResult(updates=updates, server_states={})
        updates, servers = [], {}
        for group, tasks in plan.groups().items():  # the reference executor's order of updates
            updates += [self._update(ctx, global_state, plan, t) for t in tasks]
            cuts = [t.cut for t in tasks if t.cut < n]
            if cuts:
                servers[group] = _blocks(global_state, min(cuts), n)
        return RoundResult(updates=updates, server_states=servers)

    @staticmethod
    def _update(ctx, global_state: State, plan: RoundPlan, task: ClientTask) -> ClientUpdate:
        """The task's untrained update: its starting device part and (auxiliary plans) its
        auxiliary model, the samples its ``steps`` mini-batches hold, the stand-in loss."""
        start = task.init_state if task.init_state is not None else global_state
        aux = task.aux_state if plan.aux is not None and task.cut < ctx.num_blocks else None
        samples = ctx.round_samples(task.client, task.batch_size, task.steps)
        return ClientUpdate(
            client=task.client,
            cut=task.cut,
            group=task.group,
            samples=samples,
            steps=task.steps,
            state=_blocks(start, 0, task.cut),
            loss_sum=STAND_IN_LOSS * samples,
            aux_state=aux,
        )

"""The vectorised executor: many simulated clients as one batched computation.

Every client (and every server-side copy) of a round is a *row* of stacked parameter tensors;
the clients that share a cut point and a batch length this step run as one ``torch.func.vmap``
of ``functional_call`` over their rows (a batched/grouped convolution on the GPU), and so do
their server-side copies (SplitFed V1's per-client copies, S²FL's per-group copies). Each
iteration therefore costs a handful of large kernels instead of one small kernel per client.

It computes exactly what :class:`~splitfl.executors.sequential.SequentialExecutor` computes
(tested to fp32 tolerance for every algorithm):

* **Mixed cut points** — workers are bucketed per step by (cut, batch length); a server copy
  whose members have different cuts gathers its rows into several buckets and receives the sum
  of their gradients, as the sequential executor's group copy does.
* **Unequal batch sizes** (MergeSFL, AdaSFL, the short last batch of an epoch) — *bucketing*,
  not padding: a bucket holds only equal-length batches, so no sample is masked and BatchNorm
  sees exactly the client's batch.
* **BatchNorm** — running statistics are rows like the parameters: each client keeps its own.
  A group's server copy is run by several members in one step; its running statistics are
  combined afterwards in member order with the closed form of the sequential EMA
  (:func:`~splitfl.executors.rowstack.chain_ema`), so they equal the sequential result.
* **Merged batches** (``group_forward: concat``, MergeSFL/S²FL) — per group and cut point the
  members' smashed data are concatenated (across batch-length buckets) into one server-row
  batch; merged batches of equal cut and length share one batched call, and the per-member
  losses are slices of its output, so no plan of this kind falls back.
* **Optimiser and dropout** — row-wise SGD with torch's semantics (a row, or a server block not
  traversed this step, that received no gradient is not touched); dropout masks differ from
  the sequential run's (same distribution), so models with dropout agree only statistically.
* **RingSFL's ring** — every start's batch at once (:mod:`splitfl.executors.batched_ring`).

Plans that are sequential by definition run on the reference executor: ``server_mode:
sequential`` (SplitFed V2, vanilla SL — each client's step depends on the previous client's
update), LocFedMix-SL's mixup pairs (``mixup_alpha``) and rounds with a device-side privacy
defence (``train.defence``: its noise and NoPeek term live in the reference executor's device
role, :mod:`splitfl.roles.defences`, not in the row stacks). ``fallbacks`` counts them.

Memory scales with the round's participants: only their rows are stacked; the other
registered clients hold nothing but their data indices and algorithm state. One iteration of
a split round is :mod:`splitfl.executors.split_step`; the row-stack machinery (stacks, batched
functional calls, row-wise SGD, BatchNorm chaining) is :mod:`splitfl.executors.rowstack`.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from splitfl.config import TrainConfig
from splitfl.core.plan import ClientUpdate, RoundPlan, RoundResult
from splitfl.core.topology import Ring, Star
from splitfl.data.base import ArrayDataset
from splitfl.data.lazy import is_lazy
from splitfl.executors.batched_ring import run_batched_ring
from splitfl.executors.rowstack import RowRunner, RowStack, WorkerRow, bn_momenta, step_rows
from splitfl.executors.sequential import SequentialExecutor
from splitfl.executors.split_step import SplitRound, split_step
from splitfl.models import BlockModel, ModelPart, block_index
from splitfl.roles.common import task_batches
from splitfl.roles.cut_record import tap_of
from splitfl.roles.defences import is_active
from splitfl.topologies import family_of


class VectorizedExecutor:
    """Runs all participants of a round as batched computations (see the module docstring)."""

    def __init__(
        self,
        device: str = "cpu",
        precision: str = "fp32",
        channels_last: bool = False,
        use_vmap: bool | None = None,
        max_rows: int | None = None,
    ):
        self.device = torch.device(device)
        #: How buckets run: ``vmap`` (default on GPUs), ``rows`` (one call per row on row
        #: leaves sharing the stacked state) or ``reference`` (default on CPU: the sequential
        #: loop itself). On 2 CPU cores neither batched mode reliably beats the loop — vmap's
        #: grouped convolutions ran at 0.49× for 10 ResNet-8 clients at batch 128, ``rows`` at
        #: 0.70–1.25× (benchmarks/README.md) — so CPU runs use the loop unless a mode is
        #: forced with ``use_vmap`` (the tests force both).
        if use_vmap is None:
            self.mode = "vmap" if self.device.type != "cpu" else "reference"
        else:
            self.mode = "vmap" if use_vmap else "rows"
        #: rows per batched call: all of a step's workers on GPUs; one group at a time on CPU,
        #: where batching gains nothing and holding every client's activations costs (100
        #: ResNet-8 clients at batch 128: 38 s vs 17 s sequential before this limit)
        self.max_rows = max_rows if max_rows is not None else (None if self.mode == "vmap" else 1)
        self.precision = precision
        self.channels_last = channels_last
        self.reference = SequentialExecutor(device, precision, channels_last)
        self.fallbacks = 0
        self._data: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    @staticmethod
    def batchable(plan: RoundPlan, model: BlockModel) -> bool:
        """Whether the plan runs vectorised (else: the reference executor). BatchNorm with a
        cumulative average (``momentum=None``) has no closed-form chaining (:func:`chain_ema`)."""
        ema_norms = all(
            m.momentum is not None
            for m in model.modules()
            if isinstance(m, nn.modules.batchnorm._BatchNorm)
        )
        twin = type(plan.topology) in BATCHED_TWINS
        return ema_norms and twin and family_of(plan).batched(plan, model)

    def _train_data(self, ctx) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = ctx.bundle.train.x, ctx.bundle.train.y
        if self._data is None or self._data[0] is not x:  # held: its id is never reused
            self._data = (x, x.to(self.device), y.to(self.device))
        return self._data[1], self._data[2]

    # -- the round --------------------------------------------------------------------------
    def run_round(
        self, ctx, global_state: dict[str, torch.Tensor], plan: RoundPlan, round_seed: int
    ) -> RoundResult:
        if self.mode == "reference":
            return self.reference.run_round(ctx, global_state, plan, round_seed)
        if not self.batchable(plan, ctx.model) or is_active(ctx.config.train.defence):
            self.fallbacks += 1
            return self.reference.run_round(ctx, global_state, plan, round_seed)
        if is_lazy(ctx.bundle.train.x):
            ctx = participants_only(ctx, plan)
        model: BlockModel = copy.deepcopy(ctx.model).to(self.device)
        model.load_state_dict(global_state)
        model.train()
        loss = ctx.config.train.loss
        runner = RowRunner(
            self.mode,
            self.device,
            self.precision,
            self.channels_last,
            loss=loss,
            augment=ctx.augment,
            round_seed=round_seed,
        )
        twin = BATCHED_TWINS[type(plan.topology)]
        return twin(self, runner, ctx, model, plan, round_seed)

    def _split_round(
        self, runner: RowRunner, ctx, model: BlockModel, plan: RoundPlan, round_seed: int
    ) -> RoundResult:
        """A split round batched: each local step's clients as rows
        (:func:`~splitfl.executors.split_step.split_step`), then the optimiser step."""
        round_ = self._start_round(ctx, model, plan, round_seed, runner)
        cfg = ctx.config.train
        for step in range(max(t.steps for t in plan.tasks)):
            active = [r for r in round_.rows.values() if step < r.task.steps]
            for chunk in self._chunks(active):
                split_step(round_, chunk, step)
            self._step(round_, active, step, cfg)
        return self._result(round_)

    def _start_round(
        self, ctx, model: BlockModel, plan: RoundPlan, round_seed: int, runner: RowRunner
    ) -> SplitRound:
        """The round's rows: one device stack per cut point (a row per worker, its batches
        drawn), one server stack over the groups that split (a row per group)."""
        n = model.num_blocks
        x_all, y_all = self._train_data(ctx)
        groups = plan.groups()
        by_cut: dict[int, list] = {}
        for tasks in groups.values():
            for t in tasks:
                by_cut.setdefault(t.cut, []).append(t)
        split_groups = [g for g, ts in groups.items() if any(t.cut < n for t in ts)]
        group_row = {g: i for i, g in enumerate(split_groups)}
        device_stacks: dict[int, RowStack] = {}
        rows: dict[int, WorkerRow] = {}
        for cut, tasks in by_cut.items():
            part = ModelPart(model, 0, cut)
            base = part.state_dict()
            states = [base if t.init_state is None else {**base, **t.init_state} for t in tasks]
            device_stacks[cut] = RowStack.from_states(
                part, states, [t.lr for t in tasks], self.device
            )
            for i, t in enumerate(tasks):
                drop = ctx.config.train.drop_last
                batches = task_batches(ctx.client_indices[t.client], t, round_seed, drop)
                rows[t.client] = WorkerRow(t, cut, i, group_row.get(t.group, -1), batches)
        server_stack, server_part = self._server_stack(model, plan, groups, split_groups)
        momenta = bn_momenta(server_part) if server_part is not None else {}
        member_order = [[rows[t.client] for t in groups[g] if t.cut < n] for g in split_groups]
        return SplitRound(
            model,
            plan,
            runner,
            rows,
            group_row,
            device_stacks,
            server_stack,
            member_order,
            momenta,
            x_all,
            y_all,
            tap_of(ctx, plan),
        )

    def _server_stack(
        self, model: BlockModel, plan: RoundPlan, groups: dict, split_groups: list[int]
    ) -> tuple[RowStack | None, ModelPart | None]:
        """One row per group that splits, over blocks from its lowest cut to the end."""
        if not split_groups:
            return None, None
        n = model.num_blocks
        server_lo = min(t.cut for g in split_groups for t in groups[g] if t.cut < n)
        server_part = ModelPart(model, server_lo, n)
        base = server_part.state_dict()
        spec = plan.topology.server
        lrs = [spec.lr if spec.lr is not None else groups[g][0].lr for g in split_groups]
        stack = RowStack.from_states(server_part, [base] * len(split_groups), lrs, self.device)
        return stack, server_part

    def _step(
        self, round_: SplitRound, active: list[WorkerRow], step: int, train: TrainConfig
    ) -> None:
        """Row-wise ``train.optimizer`` after a step: device rows of the active workers; server
        row g, block b where an active member of g has cut ≤ b."""
        for cut, stack in round_.device_stacks.items():
            on = torch.zeros(stack.rows, dtype=torch.bool, device=self.device)
            for r in active:
                if r.cut == cut:
                    on[r.row] = True
            step_rows(stack, dict.fromkeys(stack.params, on), train)
            stack.zero_grad()
        server_stack = round_.server_stack
        if server_stack is not None:
            n = round_.model.num_blocks
            masks = self._server_masks(server_stack, round_.member_order, step, n)
            step_rows(server_stack, masks, train)
            server_stack.zero_grad()

    @staticmethod
    def _result(round_: SplitRound) -> RoundResult:
        """Each worker's device state and each splitting group's server state."""
        n, server_stack = round_.model.num_blocks, round_.server_stack
        updates, server_states = [], {}
        for g, tasks in round_.plan.groups().items():
            for t in tasks:
                r = round_.rows[t.client]
                state = round_.device_stacks[r.cut].row_state(r.row)
                updates.append(
                    ClientUpdate(t.client, t.cut, g, r.samples, t.steps, state, r.loss_sum)
                )
            if g in round_.group_row:
                lo = min(t.cut for t in tasks if t.cut < n)
                keys = [
                    k for k in server_stack.params | server_stack.buffers if block_index(k) >= lo
                ]
                server_states[g] = server_stack.row_state(round_.group_row[g], keys)
        return RoundResult(updates=updates, server_states=server_states)

    def _chunks(self, active: list[WorkerRow]) -> list[list[WorkerRow]]:
        """Whole groups, packed up to ``max_rows`` rows per call (all at once when None).
        Groups are independent within a step, so any packing computes the same; smaller
        chunks hold fewer activations at once."""
        if self.max_rows is None:
            return [active]
        groups: dict[object, list[WorkerRow]] = {}
        for r in active:
            key = r.group_row if r.group_row >= 0 else ("alone", r.task.client)
            groups.setdefault(key, []).append(r)
        chunks: list[list[WorkerRow]] = [[]]
        for members in groups.values():
            if chunks[-1] and len(chunks[-1]) + len(members) > self.max_rows:
                chunks.append([])
            chunks[-1].extend(members)
        return chunks

    def _server_masks(self, stack: RowStack, members, step: int, n: int) -> dict:
        """Server row g, block b is updated iff an active member of g has cut ≤ b."""
        first = torch.full((stack.rows,), n, dtype=torch.long, device=self.device)
        for g, rows in enumerate(members):
            cuts = [r.cut for r in rows if step < r.task.steps]
            if cuts:
                first[g] = min(cuts)
        return {k: first <= block_index(k) for k in stack.params}


def participants_only(ctx, plan: RoundPlan):
    """``ctx`` whose training inputs are only the round's participants' samples, read from
    lazy inputs (``data.lazy``) into one tensor — what the batched modes stack on the device —
    and whose participants' indices point into it. The position map is monotonic, so every
    client draws the same batches as from the whole dataset (:func:`client_batches`)."""
    clients = sorted({t.client for t in plan.tasks})
    held = np.unique(np.concatenate([ctx.client_indices[c] for c in clients]))
    train = ctx.bundle.train
    subset = ArrayDataset(train.x[torch.as_tensor(held)], train.y[torch.as_tensor(held)])
    indices = [np.zeros(0, dtype=np.int64)] * len(ctx.client_indices)
    for c in clients:
        indices[c] = np.searchsorted(held, ctx.client_indices[c])
    bundle = dataclasses.replace(ctx.bundle, train=subset)
    return dataclasses.replace(ctx, bundle=bundle, client_indices=indices)


def _ring_round(executor: VectorizedExecutor, runner: RowRunner, ctx, model, plan, round_seed):
    data = executor._train_data(ctx)
    return run_batched_ring(runner, ctx, model, plan, round_seed, data)


#: Topology payload type → its batched twin, ``twin(executor, runner, ctx, model, plan,
#: round_seed) -> RoundResult``: the one lookup by which this executor runs a batched round
#: (the family's ``batched`` says whether a plan qualifies). A new family's twin is one entry.
BATCHED_TWINS: dict[type, Callable[..., RoundResult]] = {
    Star: VectorizedExecutor._split_round,
    Ring: _ring_round,
}

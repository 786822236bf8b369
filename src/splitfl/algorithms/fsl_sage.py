"""FSL-SAGE (Nair et al., "FSL-SAGE: Accelerating Federated Split Learning via Smashed
Activation Gradient Estimation", ICML 2025) as its code runs it (srijith1996/FSL-SAGE,
``src/algos/fsl_sage.py``; defaults from ``src/hydra_config/``).

Each client's auxiliary model estimates the server's cut-layer gradient, and the device part
steps on that estimate (``device_loss: estimate``); every ``upload_every`` batches the single
server model steps on the smashed data and keeps them in the client's memory; every
``align_every`` rounds the auxiliary model is fitted to the true cut-layer gradients over that
memory (:func:`splitfl.roles.aux_numerics.align_aux`). Device parts are averaged with
data-size weights; auxiliary models stay per client.

How each part of the code is read, the relation to SplitFed V1, and the differences kept on
purpose: ``docs/explanation/readings/fsl_sage.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.algorithms.aux_model import AuxModel, smashed_shape
from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.config import ConfigError
from splitfl.core.plan import Charge, ClientTask, RoundPlan, RoundResult
from splitfl.core.topology import AlignSpec, Estimate, Turns


@dataclass(frozen=True)
class FSLSAGEOptions(SplitOptions):
    cut: int | None = None
    upload_every: int = 5
    align_every: int = 10
    align_epochs: int = 100
    align_batch_size: int = 1000
    align_lr: float = 1e-3
    align_memory: int = 1000
    aux_model: str | None = None

    def __post_init__(self) -> None:
        for name in ("upload_every", "align_every", "align_epochs", "align_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"options.fsl_sage.{name}", "must be >= 1")
        if self.align_memory < 1:
            raise ConfigError("options.fsl_sage.align_memory", "must be >= 1")
        if not 0 < self.align_lr <= 1e9:  # as train.lr
            raise ConfigError("options.fsl_sage.align_lr", "must be in (0, 1e9]")


class FSLSAGE(Algorithm):
    name = "fsl_sage"
    paper = "Nair et al., FSL-SAGE (ICML 2025); code srijith1996/FSL-SAGE"
    Options = FSLSAGEOptions
    topology = Turns
    coupled_round = "one server model trained on every client's uploads, in client order"
    training_signals = "aligns on the smashed data the server kept (uploads fill its memory)"
    timing_stand_in = (
        "the alignment memory holds the round's first uploaded batch only (its size follows "
        "training): alignment FLOPs are undercounted"
    )

    def __init__(self, options: FSLSAGEOptions, ctx) -> None:
        super().__init__(options, ctx)
        self.cut = self.options.cut
        name = options.aux_model
        if name is None:
            name = "resnet_stage" if len(smashed_shape(ctx, self.cut)) == 3 else "linear"
        self.aux_model = AuxModel.of(ctx, name, self.cut, "options.fsl_sage.aux_model")
        self.align = AlignSpec(
            options.align_epochs, options.align_batch_size, options.align_lr, options.align_memory
        )
        self.aux: dict[int, dict] = {}  # each client's auxiliary model (initial until trained)
        self.memory: dict[int, tuple] = {}  # the server's memory of each client's uploads

    def is_alignment_round(self, round_idx: int) -> bool:
        return round_idx % self.options.align_every == 0

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        align = self.is_alignment_round(round_idx)
        tasks = []
        for c in clients:
            task = self.make_task(c, self.cut, 0, round_idx)
            task.aux_state = self.aux.get(c, self.aux_model.initial)
            task.align, task.aux_memory = align, self.memory.get(c)
            task.charge = self.aux_charge(task)
            tasks.append(task)
        return RoundPlan(
            tasks,
            topology=Turns(order=tuple(sorted(clients)), mode="sequential"),
            device_update=Estimate(
                aux=self.aux_model.spec, upload_every=self.options.upload_every, align=self.align
            ),
            info={"aligned": align},
        )

    def aux_charge(self, task: ClientTask) -> Charge:
        """Beyond Eq. (1)'s split round (uploads of every h-th batch, no gradients): the
        auxiliary model's device FLOPs (its gradient estimate); at an alignment, the aligned
        auxiliary model's download and the server's work: the true gradients of the memory
        (forward + backward of the server part) and ``align_epochs`` passes of the fit (a
        second-order step: counted as twice the auxiliary model's forward + backward per
        sample)."""
        if not task.align:
            return Charge(aux_flops=self.aux_model.flops)
        n = self._memory_after_first_upload(task)
        fit = self.options.align_epochs * n * 2 * self.aux_model.flops
        server = n * self.ctx.profile.server_flops(task.cut) + fit
        return Charge(
            aux_flops=self.aux_model.flops, aux_down=self.aux_model.bytes, server_flops=server
        )

    def _memory_after_first_upload(self, task: ClientTask) -> int:
        held = 0 if task.aux_memory is None else len(task.aux_memory[1])
        first = min(task.batch_size, int(self.ctx.data_sizes[task.client]))
        return min(self.options.align_memory, held + first)

    def aggregate(self, global_state, plan: RoundPlan, result: RoundResult) -> dict:
        """Device parts and the server model as every SFL round; each client keeps its
        auxiliary model and the server its memory."""
        for u in result.updates:
            self.aux[u.client] = u.aux_state
            self.memory[u.client] = u.aux_memory
        return super().aggregate(global_state, plan, result)

    def state_dict(self) -> dict:
        return {"aux": self.aux, "memory": self.memory}

    def load_state_dict(self, state: dict) -> None:
        self.aux, self.memory = state["aux"], state["memory"]

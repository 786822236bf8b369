"""What auxiliary-model algorithms share on the algorithm side (LocFedMix-SL, CSE-FSL,
FSL-SAGE): the auxiliary model of the run (:class:`AuxModel`: its spec, its initial state, its
size and FLOPs); each task's auxiliary work reaches the clock as data
(:class:`~splitfl.core.plan.Charge`, priced by :func:`splitfl.topologies.split.split_task_cost`).

The executors run the auxiliary model (:mod:`splitfl.roles.aux_numerics`, the device role);
the algorithm decides whose auxiliary model a task starts from, where it is averaged and what
crosses the network, and the shared cost model charges it: the auxiliary model's forward and
backward on the device for every trained sample, its transfers, and — with an upload period —
smashed data and server compute only for the uploaded samples.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from splitfl.core.activations import aux_input
from splitfl.core.seeding import derive_seed
from splitfl.core.topology import AuxSpec
from splitfl.extensions import build_aux
from splitfl.models.aux_heads import aux_flops
from splitfl.models.base import ModelPart
from splitfl.models.profile import BYTES_PER_ELEMENT

State = dict[str, torch.Tensor]


@dataclass
class AuxModel:
    """The run's auxiliary model: ``spec`` for the plans, the ``initial`` state every client
    starts from (drawn from ``(seed, "aux-init")``: both official codes copy client 0's
    auxiliary model to every client), ``bytes`` (parameters and buffers, 4 B each, as
    ``calculate_load`` in both codes) and ``flops`` (forward + backward per sample)."""

    spec: AuxSpec
    initial: State
    bytes: int
    flops: float

    @classmethod
    def of(cls, ctx, name: str, cut: int, field: str) -> AuxModel:
        """The auxiliary model ``name`` for the smashed data of ``ctx.model`` at ``cut``."""
        shape = smashed_shape(ctx, cut)
        spec = AuxSpec(name, shape, int(ctx.bundle.num_classes))
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(derive_seed(ctx.config.seed, "aux-init"))
            module = build_aux(name, shape, spec.num_classes, field)
        dtype = next(ctx.model.parameters()).dtype
        module = module.to(dtype)
        state = {k: v.detach().clone() for k, v in module.state_dict().items()}
        size = sum(t.numel() for t in state.values()) * BYTES_PER_ELEMENT
        return cls(spec, state, size, aux_flops(module, shape, dtype))


def smashed_shape(ctx, cut: int) -> tuple[int, ...]:
    """Per-sample shape of what the auxiliary model reads of the smashed data of ``ctx.model``
    at ``cut`` (:func:`~splitfl.core.activations.aux_input`: the floating tensor, or several
    flattened and concatenated)."""
    return tuple(int(d) for d in aux_input(_smashed(ctx, cut)).shape[1:])


def _smashed(ctx, cut: int):
    """One zero sample through a copy of the device part in eval mode (no random draws)."""
    part = copy.deepcopy(ModelPart(ctx.model, 0, cut)).eval()
    dtype = ctx.model.input_dtype
    if dtype.is_floating_point:  # a float64 run's model takes float64 inputs
        dtype = next(ctx.model.parameters()).dtype
    x = torch.zeros(1, *ctx.bundle.input_shape, dtype=dtype)
    with torch.no_grad():
        return part(x)

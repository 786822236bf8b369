"""What valid device replies look like (:class:`Expect`), derived from the model and the
round's cut points by a dry run on the server's reference samples (:func:`expect_for`); the
bounds are :mod:`splitfl.net.trust.checks`'s."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from splitfl.config import BoundsConfig
from splitfl.core.activations import leaves
from splitfl.models import ModelPart
from splitfl.models.base import moving_state
from splitfl.net.trust.checks import TensorSpec, activation_scale, state_specs


@dataclass
class Expect:
    """What valid replies look like: model dtype, what crosses each cut (a
    :class:`~splitfl.net.trust.checks.TensorSpec` per tensor: per-sample shape, dtype, largest
    value allowed; ``single``: the cuts that send one tensor, not a tuple), classes, the
    device part's tensors per cut (name → (shape, dtype)), the targets' dtype and per-sample
    shape (int64 class labels, or float targets: ``train.loss`` mse/bce_logits) and the
    bounds (:mod:`splitfl.net.trust.checks`)."""

    dtype: torch.dtype
    features: dict[int, tuple[TensorSpec, ...]]
    num_classes: int
    part_specs: dict[int, dict[str, tuple[tuple[int, ...], torch.dtype]]]
    target_dtype: torch.dtype = torch.int64
    target_shape: tuple[int, ...] = ()
    single: set[int] = field(default_factory=set)
    bounds: BoundsConfig = field(default_factory=BoundsConfig)

    def count(self, cut: int) -> int | None:
        """:func:`~splitfl.core.activations.unpack`'s count for what ``cut`` sends."""
        return None if cut in self.single else len(self.features[cut])


def expect_for(
    model,
    sample: torch.Tensor,
    num_classes: int,
    cuts,
    target: torch.Tensor | None = None,
    bounds: BoundsConfig | None = None,
) -> Expect:
    """What valid device replies look like for these cut points of ``model``: a dry run of
    each device part on the reference ``sample`` rows gives the smashed-data shape and the
    activation scale the bounds are relative to (:mod:`splitfl.net.trust.checks`); ``target``: one
    sample's target, for its dtype and shape (int64 class labels when None)."""
    bounds = bounds or BoundsConfig()
    dtype = next(model.parameters()).dtype
    features, specs, single = {}, {}, set()
    sample = sample.to(next(model.parameters()).device)
    if sample.is_floating_point():
        sample = sample.to(dtype)
    for cut in cuts:
        part = ModelPart(model, 0, cut)
        # only what a round can change travels (LoRA: the adapters, not the frozen base)
        specs[cut] = state_specs({k: t.detach() for k, t in moving_state(part, model).items()})
        if cut < model.num_blocks:
            with torch.no_grad():
                out = part.eval()(sample[:1])
            scales = activation_scale(part, sample)
            features[cut] = tuple(
                TensorSpec(
                    tuple(t.shape[1:]),
                    t.dtype,
                    bounds.activation_factor * peak + bounds.activation_abs,
                )
                for t, peak in zip(leaves(out), scales, strict=True)
            )
            if not isinstance(out, tuple):
                single.add(cut)
            part.train()
    target_dtype = torch.int64 if target is None else target.dtype
    target_shape = () if target is None else tuple(target.shape[1:])
    return Expect(dtype, features, num_classes, specs, target_dtype, target_shape, single, bounds)

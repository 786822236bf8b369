"""Model aggregation shared by every algorithm.

:func:`layerwise_aggregate` is S²FL Algorithm 1: for every parameter (layer) of the full model
and every participant ``i``, take the participant's device copy if its device part holds that
layer (block index < cut), else the server-side copy of the participant's group; weight by
``|D_i|`` and divide by the summed weight. With every cut equal to the number of blocks this is
FedAvg; with groups of one it is SplitFed V1 (server copies averaged with the same weights).

BatchNorm buffers (running mean/var) are aggregated exactly like parameters, with the same
weights; the integer ``num_batches_tracked`` counter is averaged and rounded. A layer whose
every copy is the global model's own tensor (nothing trained it: ``executor: timing``) is
that tensor itself, without the arithmetic or a copy.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import torch

from splitfl.aggregation.mean import weighted_average
from splitfl.aggregation.robust import (
    MEAN,
    Rule,
    centred_clip,
    clip_scales,
    combine,
    robust_average,
    trust_factors,
    trust_layer,
)
from splitfl.models.base import block_index

__all__ = ["Rule", "layerwise_aggregate", "robust_average", "weighted_average"]


class TrainedPart(Protocol):
    client: int
    cut: int
    group: int
    state: dict[str, torch.Tensor]


def layerwise_aggregate(
    global_state: Mapping[str, torch.Tensor],
    updates: Iterable[TrainedPart],
    server_states: Mapping[int, Mapping[str, torch.Tensor]],
    weights: Mapping[int, float],
    rule: Rule = MEAN,
) -> dict[str, torch.Tensor]:
    """S²FL Algorithm 1 (lines 3–17): layer-wise weighted average of device and server copies.

    Args:
        global_state: Current full-model state (gives the keys, dtypes, and the value of any
            layer that no participant holds).
        updates: Trained device parts (``cut``, ``group`` and ``state`` with full-model keys).
        server_states: Trained server-side copy per group (full-model keys for blocks ≥ the
            smallest cut in the group).
        weights: ``|D_i|`` per client.
        rule: ``train.aggregation`` (:mod:`splitfl.aggregation.robust`); ``mean`` is the
            paper's average; ``fltrust`` needs the round's server step (``rule.toward``).
    """
    updates = list(updates)
    picked = {
        key: [
            (u.state if block_index(key) < u.cut else server_states[u.group])[key] for u in updates
        ]
        for key in global_state
    }
    scales, centre, scores = None, {}, []
    if rule.name == "fltrust" and rule.toward is None:
        raise ValueError("fltrust aggregation without the server's step (RoundResult.server_move)")
    if rule.name in ("clip_mean", "centered_clip", "fltrust") and updates:
        models = [{key: copies[i] for key, copies in picked.items()} for i in range(len(updates))]
        if rule.name == "fltrust":
            scores, scales = trust_factors(global_state, models, rule.toward)
        elif rule.name == "clip_mean":
            scales = clip_scales(dict(global_state), models, rule)
        else:
            centre, scales = centred_clip(models, rule)
    out: dict[str, torch.Tensor] = {}
    for key, current in global_state.items():
        sources = picked[key]
        # no copy changed (executor: timing; frozen weights, e.g. a LoRA model's base): the
        # average of equal values is that value, without a float64 pass over the tensor, and
        # the global model's own tensor, not a copy (nothing writes a global tensor in place:
        # parts, evaluation and checkpoints copy out of it)
        if all(s is current or torch.equal(s, current) for s in sources):
            out[key] = current
            continue
        w = [float(weights[u.client]) for u in updates]
        if sum(w) == 0:
            out[key] = current.clone()
        elif rule.name == "fltrust":  # FLTrust Eq. 5; tensors g_0 lacks: trust-weighted mean
            out[key] = trust_layer(current, sources, scores, scales if key in rule.toward else None)
        elif rule.name != "mean":
            out[key] = combine(current, sources, w, rule, scales, centre.get(key))
        else:
            out[key] = _mean(current, sources, w)
    return out


def _mean(current: torch.Tensor, sources: list[torch.Tensor], w: list[float]) -> torch.Tensor:
    """The weighted average in float64 (integer tensors rounded), in participant order."""
    total = torch.zeros_like(current, dtype=torch.float64)
    for weight, source in zip(w, sources, strict=True):
        total += weight * source.to(torch.float64)
    avg = total / sum(w)
    return (
        avg.to(current.dtype) if current.is_floating_point() else torch.round(avg).to(current.dtype)
    )

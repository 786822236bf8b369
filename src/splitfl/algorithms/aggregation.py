"""Model aggregation shared by every algorithm.

:func:`layerwise_aggregate` is S²FL Algorithm 1: for every parameter (layer) of the full model
and every participant ``i``, take the participant's device copy if its device part holds that
layer (block index < cut), else the server-side copy of the participant's group; weight by
``|D_i|`` and divide by the summed weight. With every cut equal to the number of blocks this is
FedAvg; with groups of one it is SplitFed V1 (server copies averaged with the same weights).

BatchNorm buffers (running mean/var) are aggregated exactly like parameters, with the same
weights; the integer ``num_batches_tracked`` counter is averaged and rounded. A layer whose
every copy is the global model's own tensor (nothing trained it: ``executor: timing``) is
that tensor, copied without the arithmetic.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol

import torch

from splitfl.averaging import weighted_average
from splitfl.models.base import block_index

__all__ = ["layerwise_aggregate", "weighted_average"]


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
) -> dict[str, torch.Tensor]:
    """S²FL Algorithm 1 (lines 3–17): layer-wise weighted average of device and server copies.

    Args:
        global_state: Current full-model state (gives the keys, dtypes, and the value of any
            layer that no participant holds).
        updates: Trained device parts (``cut``, ``group`` and ``state`` with full-model keys).
        server_states: Trained server-side copy per group (full-model keys for blocks ≥ the
            smallest cut in the group).
        weights: ``|D_i|`` per client.
    """
    updates = list(updates)
    out: dict[str, torch.Tensor] = {}
    for key, current in global_state.items():
        block = block_index(key)
        sources = [(u.state if block < u.cut else server_states[u.group])[key] for u in updates]
        if all(s is current for s in sources):  # no copy changed (executor: timing)
            out[key] = current.clone()
            continue
        total = torch.zeros_like(current, dtype=torch.float64)
        weight_sum = 0.0
        for u, source in zip(updates, sources, strict=True):
            w = float(weights[u.client])
            total += w * source.to(torch.float64)
            weight_sum += w
        if weight_sum == 0:
            out[key] = current.clone()
        elif current.is_floating_point():
            out[key] = (total / weight_sum).to(current.dtype)
        else:
            out[key] = torch.round(total / weight_sum).to(current.dtype)
    return out

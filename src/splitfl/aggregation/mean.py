"""Averages of state dicts (a leaf: torch only), shared by the algorithms' aggregation and by
device processes that average their cluster's models before uploading (ParallelSFL Eq. 4)."""

from __future__ import annotations

from collections.abc import Mapping

import torch


def weighted_average(
    states: list[Mapping[str, torch.Tensor]], weights: list[float]
) -> dict[str, torch.Tensor]:
    """Weighted average of state dicts with the same keys (FedAvg's rule), for modules that
    are not blocks of the model (e.g. LocFedMix-SL's auxiliary heads). A key whose every
    state holds the very same tensor (nothing changed it: ``executor: timing``) averages to a
    copy of it, without the arithmetic."""
    total = float(sum(weights))
    out = {}
    for key, first in states[0].items():
        if all(s[key] is first for s in states):
            out[key] = first.clone()
            continue
        acc = sum(w * s[key].to(torch.float64) for s, w in zip(states, weights, strict=True))
        avg = acc / total
        out[key] = (
            avg.to(first.dtype) if first.is_floating_point() else torch.round(avg).to(first.dtype)
        )
    return out

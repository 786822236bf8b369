"""ParallelSFL §4.2 worker state monitoring: the D2D radio rates the PS learns from the
transfers of a round (inputs of the Eq. 7 estimates and of the Eq. 8 ingress budget).

A worker's radio is never read from its profile after the round-0 state collection: each
bottom worker measures the rate of its smashed data and gradients (bytes over measured time),
and its top worker's radio carried those transfers. What such a rate says about a radio
depends on what limited it, and the PS reasons with the cluster time model
(:mod:`splitfl.system.cluster`), where member k's rate is ``min(r_k, r_top)`` alone and, where
the members share the top worker's radio (``contention``), at most the max-min fair share:

* a member whose rate is below ``SHARED_LEVEL`` times the best rate in its cluster was not
  held back by the top worker's radio or by sharing: the rate is its own radio (exact);
* any other member's rate is a lower bound on its radio (it may have been held back by the top
  worker's radio or its fair share): it can raise the worker's last observation, never lower it;
* the top worker's radio carried all its members' transfers at once under contention: their
  sum is its rate (exact where the radio was the bottleneck, as with several members);
  without contention it is at least the best member's rate (a lower bound).

``SHARED_LEVEL`` (a stated choice; the paper has no shared radios): members within a factor 2
of the best rate count as possibly held back, so measurement noise of that order (e.g.
``devices.jitter``) does not turn a fair share into an estimate of a radio.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

#: A member whose measured rate is below this fraction of its cluster's best measured rate is
#: taken to have been limited by its own radio (see the module docstring).
SHARED_LEVEL = 0.5


def radio_observations(
    clusters: Mapping[int, Sequence[tuple[int, float]]], contention: bool
) -> dict[int, tuple[float, bool]]:
    """``{worker: (rate, exact)}`` from ``{top: [(member, measured D2D rate), ...]}``.

    ``exact`` is False where the rate is only a lower bound on the worker's radio (module
    docstring). Rates are in B/s; a cluster without measured members gives nothing.
    """
    out: dict[int, tuple[float, bool]] = {}
    for top, measured in clusters.items():
        if not measured:
            continue
        best = max(rate for _, rate in measured)
        for member, rate in measured:
            out[member] = (rate, rate < SHARED_LEVEL * best)
        total = sum(rate for _, rate in measured)
        out[top] = (total, True) if contention else (best, False)
    return out


def record_radios(seen: np.ndarray, observations: Mapping[int, tuple[float, bool]]) -> None:
    """Each worker's latest radio observation in ``seen`` (in place): an exact rate replaces
    it, a lower bound only raises it."""
    for worker, (rate, exact) in observations.items():
        seen[worker] = rate if exact else max(float(seen[worker]), rate)

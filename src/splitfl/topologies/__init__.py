"""Topology families: one room per training pattern.

A plan's topology payload (:mod:`splitfl.core.topology`) names the pattern; its family here
runs and prices it on every runtime (:mod:`.base`: the contract). The tree's families:

* :mod:`.star` — :class:`~splitfl.core.topology.Star` (every member meets its group's
  server copy at every step); :mod:`.clusters` — ``Clusters`` (star groups hosted on
  devices, ParallelSFL);
* :mod:`.turns` — ``Turns`` (members take turns: sequential, chained, round robin);
* :mod:`.ring` — ``Ring`` (RingSFL's ring of devices);
* :mod:`.ushaped` — ``UShaped`` (U-shaped split learning: labels stay on the device).

A family of one's own registers with :func:`register` (how-to: ``docs/how-to/add-a-topology.md``).
"""

from __future__ import annotations

from splitfl.topologies import clusters, ring, star, turns, ushaped
from splitfl.topologies.base import (
    FAMILIES,
    STAND_IN_LOSS,
    Family,
    PriceView,
    UnitEnv,
    family_of,
    register,
)

__all__ = [
    "FAMILIES",
    "STAND_IN_LOSS",
    "Family",
    "PriceView",
    "UnitEnv",
    "family_of",
    "register",
    "clusters",
    "ring",
    "star",
    "turns",
    "ushaped",
]

"""System heterogeneity: device profiles, the shared cost model and the simulated clock."""

from splitfl.system.clock import SimClock, jitter_factors
from splitfl.system.cost import (
    LINKS,
    ClientCost,
    Traffic,
    clustered_client_cost,
    d2d_rate,
    ring_client_cost,
    round_times,
    split_client_cost,
)
from splitfl.system.devices import PRESETS, DeviceProfile, Population, draw_population

__all__ = [
    "LINKS",
    "PRESETS",
    "ClientCost",
    "DeviceProfile",
    "Population",
    "SimClock",
    "clustered_client_cost",
    "d2d_rate",
    "ring_client_cost",
    "Traffic",
    "draw_population",
    "jitter_factors",
    "round_times",
    "split_client_cost",
]

"""System heterogeneity: device profiles, the shared cost model and the simulated clock."""

from splitfl.system.clock import SimClock, jitter_factors
from splitfl.system.cluster import ClusterLoad, ClusterTime, MemberLoad, cluster_times
from splitfl.system.cost import (
    LINKS,
    ClientCost,
    Traffic,
    d2d_rate,
    max_min_share,
    round_times,
    share_server_link,
    split_client_cost,
)
from splitfl.system.devices import PRESETS, DeviceProfile, Population, draw_population

__all__ = [
    "LINKS",
    "PRESETS",
    "ClientCost",
    "ClusterLoad",
    "ClusterTime",
    "DeviceProfile",
    "MemberLoad",
    "Population",
    "SimClock",
    "cluster_times",
    "d2d_rate",
    "Traffic",
    "draw_population",
    "jitter_factors",
    "max_min_share",
    "round_times",
    "share_server_link",
    "split_client_cost",
]

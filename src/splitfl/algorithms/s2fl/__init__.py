"""S²FL (Yan et al.): the algorithm (:mod:`.algorithm`: adaptive sliding model split), its
lock-step groups on the clock (:mod:`.lockstep`) and its data-balance grouping
(:mod:`.data_balance`)."""

from splitfl.algorithms.s2fl.algorithm import (
    S2FL,
    S2FLOptions,
    closest_to_median,
)
from splitfl.topologies.lockstep import lockstep_finish

__all__ = ["S2FL", "S2FLOptions", "closest_to_median", "lockstep_finish"]

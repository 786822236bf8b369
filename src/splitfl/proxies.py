"""Baselines implemented as *proxies*: where a mechanism of the baseline's paper is missing or
cannot be checked here, the algorithm is marked so in ``splitfl list``, the docs and every
comparison or report table (``"adasfl (proxy)"``). One line per baseline: what differs and
which source was followed. Details are in each algorithm module's docstring.

A leaf module (pure data) so that the metrics tables can mark names without importing the
algorithm registry.
"""

from __future__ import annotations

#: algorithm name -> one-line reason (what differs; the source followed).
PROXIES: dict[str, str] = {
    "adasfl": "heuristic per-worker τ_i (fill the fastest worker's round); paper text not "
    "here, released code (ymliao98/AdaSFL) does not run; a ParallelSFL baseline only, "
    "follows ParallelSFL §5.1's description",
    "locfedmix_sl": "local loss through a linear auxiliary head, not the paper's "
    "InfoPro-style auxiliary network; no official code; follows the title and MergeSFL §V",
    "adasampling": "q_i ∝ p_i·G_i/√t_i has the structure of the paper's solution but cannot "
    "be checked (paper text not here); follows ParallelSFL §5's description",
    "ifca": "central test set evaluated with the most chosen cluster model (IFCA evaluates "
    "each client on its own cluster's model); follows Ghosh et al. as cited by ParallelSFL",
}


def display_name(algorithm: str) -> str:
    """``algorithm`` as tables show it: ``"ifca (proxy)"`` for a proxy baseline."""
    return f"{algorithm} (proxy)" if algorithm in PROXIES else algorithm

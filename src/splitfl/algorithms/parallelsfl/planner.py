"""ParallelSFL §4.3-4.5 for one round: Alg. 1 (worker clustering) and the local frequencies.

Algorithm 1 (worker clustering in round h), on the round's :class:`~.problem.ClusterInputs`:

1-2.  K-means splits the workers into K label sets ``S_1..S_K``
      (:func:`~.clustering.cluster_label_sets`).
3-10. Greedy: the max-``B`` worker of the largest set becomes a top worker; bottom workers are
      added from the candidate set A (the slowest remaining worker of every set, Eq. 9 on the
      cluster time model) one at a time, each time the one giving the smallest
      ``KL(Φ_c ‖ Φ_0)``, while Eq. (8) and (10) hold (:func:`~.clustering.greedy_clusters`).
11.   Fine-tuning: swaps/moves of bottom workers that lower ``Σ_c U_c`` (Eq. 14) without
      breaking Eq. (8)/(10) (:func:`~.finetune.swap_finetune`).

Then Eq. (15)-(17) give per-cluster local frequencies τ_c (:func:`~.frequency.
local_frequencies`) and Eq. (18) the aggregation weights (:func:`~.frequency.
aggregation_weights`). The readings of the paper where it is silent or ambiguous are stated
in the module they concern (:mod:`.problem`, :mod:`.clustering`, :mod:`.frequency`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from splitfl.algorithms.parallelsfl.clustering import greedy_clusters, random_clusters
from splitfl.algorithms.parallelsfl.finetune import swap_finetune
from splitfl.algorithms.parallelsfl.frequency import local_frequencies, round_waiting
from splitfl.algorithms.parallelsfl.problem import Cluster, ClusterInputs, total_utility

#: ``clusters -> (t_c,o, β_c)`` per cluster, for Eq. (15)-(17).
ClusterTimeFn = Callable[[list[Cluster]], tuple[np.ndarray, np.ndarray]]


def _cluster_times(
    clusters: list[Cluster],
    inputs: ClusterInputs,
    beta_ps: np.ndarray | None,
    cluster_time: ClusterTimeFn | None,
) -> tuple[np.ndarray, np.ndarray]:
    """``(t_c,o, β_c)`` per cluster: ``cluster_time(clusters)`` if given, else the slowest
    member on the inputs' cluster time model and ``β_c = beta_ps[top_c]`` (0 without
    ``beta_ps``)."""
    if cluster_time is not None:
        t_co, beta_c = (np.asarray(a, dtype=np.float64) for a in cluster_time(clusters))
        return t_co, beta_c
    t_co = np.array([inputs.iteration_time(m, t) for t, m in clusters], dtype=np.float64)
    ps = np.zeros(inputs.n) if beta_ps is None else np.asarray(beta_ps, dtype=np.float64)
    beta_c = np.array([ps[t] for t, _ in clusters], dtype=np.float64)
    return t_co, beta_c


def _summary(clusters: list[Cluster], inputs: ClusterInputs, u_greedy: float) -> dict[str, Any]:
    """The plan's Eq. (13)/(11)/(14) figures (see :func:`plan_clusters`)."""
    training = [(t, m) for t, m in clusters if m]
    kls = [inputs.kl(m) for _, m in training]
    waits = [inputs.waiting(m, t) for t, m in training]
    return {
        "sum_utility": total_utility(clusters, inputs),
        "sum_utility_greedy": u_greedy,
        "mean_kl": float(np.mean(kls)) if kls else 0.0,
        "mean_waiting": float(np.mean(waits)) if waits else 0.0,
        "n_clusters": len(clusters),
        "n_top_only": len(clusters) - len(training),
        "w_scale": inputs.w_scale,
        "kl_scale": inputs.kl_scale,
    }


def plan_clusters(
    inputs: ClusterInputs,
    rng: np.random.Generator,
    *,
    tau: int,
    k: int | None = None,
    beta_ps: np.ndarray | None = None,
    max_passes: int = 20,
    random_assignment: bool = False,
    adaptive_tau: bool = True,
    cluster_time: ClusterTimeFn | None = None,
) -> tuple[list[Cluster], np.ndarray, dict[str, Any]]:
    """Alg. 1 lines 1-11 plus Eq. (15)-(17) for one round.

    ``k`` defaults to ``max(1, N // 5)``; ``beta_ps[i]`` is worker i's time to upload the
    submodels to the PS (``β_c = beta_ps[top_c]``, default 0). ``cluster_time``, if given,
    maps the final clusters to ``(t_c,o, β_c)`` per cluster for Eq. (15)-(17) in place of
    the inputs' ``t_c,o`` and ``beta_ps`` (ParallelSFL passes the clock's cluster model,
    :func:`splitfl.system.cluster.cluster_times`, on the same estimates). Variants:
    ``random_assignment=True`` replaces the plan by :func:`~.clustering.random_clusters` with
    the greedy plan's cluster sizes and skips line 11 (ParallelSFL-R); ``adaptive_tau=False``
    gives every training cluster τ (ParallelSFL-WC; -R uses both). Returns the clusters, τ_c
    (int64, 0 for top-only clusters) and an info dict: ``sum_utility`` (Σ U_c),
    ``sum_utility_greedy`` (before line 11), ``mean_kl`` and ``mean_waiting`` (Eq. 13 / Eq. 11
    averaged over the clusters that train), ``n_clusters``, ``n_top_only``, ``w_scale``,
    ``kl_scale``, ``t_co`` and ``beta_c`` (per-cluster lists), ``round_time`` (max_c of
    Eq. 15), ``cluster_times`` (Eq. 15 per cluster) and ``cluster_waiting`` (Eq. 16 over the
    clusters that train).
    """
    n = inputs.n
    if k is None:
        k = max(1, n // 5)
    greedy = greedy_clusters(inputs, k, rng)
    u_greedy = total_utility(greedy, inputs)
    if random_assignment:
        clusters = random_clusters(n, [len(m) for _, m in greedy], rng)
    else:
        clusters = swap_finetune(greedy, inputs, max_passes=max_passes)
    t_co, beta_c = _cluster_times(clusters, inputs, beta_ps, cluster_time)
    if adaptive_tau:
        taus = local_frequencies(clusters, t_co, beta_c, tau)
    else:
        taus = np.array([tau if m else 0 for _, m in clusters], dtype=np.int64)
    info = _summary(clusters, inputs, u_greedy)
    info.update(t_co=t_co.tolist(), beta_c=beta_c.tolist())
    info.update(round_waiting(taus * t_co + np.where(taus > 0, beta_c, 0.0), taus > 0))
    return clusters, taus, info


def failed_tops(tops: dict[int, int], dropped: dict[int, str]) -> set[int]:
    """The top workers (group → worker) whose own failure dropped a member: the reason
    starts ``top worker <w>`` (not connected, failed, rejected report, no report;
    :mod:`splitfl.net.server.clusters`; a member the top worker dropped for its own fault reads
    ``dropped by top worker <w>``)."""
    return {
        w
        for w in tops.values()
        if any(why.startswith(f"top worker {w}") for why in dropped.values())
    }

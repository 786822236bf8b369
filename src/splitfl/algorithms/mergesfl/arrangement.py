"""MergeSFL §IV-A Algorithm 1 end to end: worker arrangement and configuration of one round.

Algorithm 1 (worker arrangement and configuration in round h):

1-2. Give the fastest worker l the maximum batch size D and every worker a batch size that
     aligns its iteration time with l's (Eq. 9; Eq. 7 is the time model).
3-5. Rank workers by priority (Eq. 13), seed a genetic algorithm with the m highest-priority
     workers and search bit strings (gene i = worker i selected) for the set S minimising
     KL(Φ_h ‖ Φ_0) (Eq. 11-12) under the PS ingress-bandwidth budget (Eq. 10).
6.   Fine-tune the batch sizes of S with the smallest added waiting time Δ (Eq. 14) subject to
     KL(Φ_h ‖ Φ_0) ≤ ε.
7.   Scale all batch sizes by one factor to use as much of the budget as Eq. (10) allows,
     rounding once (lines 6-7 work on the un-floored Eq. 9 sizes); a worker whose scaled size
     is below one sample leaves S^h.

The readings of the paper where it is silent or ambiguous (``reference/spec-gaps.md``) are
stated where they apply: Eq. (9) and line 7 in :mod:`~splitfl.algorithms.mergesfl.batch_sizes`,
the GA settings in :mod:`~splitfl.algorithms.mergesfl.selection`, line 6 and ε in
:mod:`~splitfl.algorithms.mergesfl.finetune`.

No torch here: every function takes numpy arrays and, where random, a ``np.random.Generator``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from splitfl.algorithms.estimates import iid_reference, kl_divergence
from splitfl.algorithms.mergesfl.batch_sizes import (
    aligned_batch_sizes,
    average_waiting_time,
    iteration_times,
    regulate_batch_sizes,
    scale_to_budget,
)
from splitfl.algorithms.mergesfl.finetune import finetune_batch_sizes, waiting_increase
from splitfl.algorithms.mergesfl.selection import ga_select, label_mixture, priorities


def arrange_workers(
    label_dists: np.ndarray,
    mu: np.ndarray,
    beta: np.ndarray,
    participation: np.ndarray,
    bytes_per_sample: float,
    budget: float,
    max_batch: int,
    epsilon: float,
    rng: np.random.Generator,
    tau: int = 1,
    fill_budget: bool = True,
    **ga_options: Any,
) -> tuple[np.ndarray, np.ndarray, dict[str, float]]:
    """Algorithm 1 end to end (lines 1-7) for one round.

    Returns the sorted selected worker indices, their integer batch sizes (aligned with the
    indices) and an info dict: ``kl_before`` (GA set with Eq. 9 sizes), ``kl_finetuned`` (after
    line 6), ``kl_after`` (final integer sizes), ``delta`` (Eq. 14 of line 6, from the
    un-floored Eq. 9 sizes), ``waiting_time`` (Eq. 8 over the selected workers, final sizes),
    ``bandwidth`` (Σ d_i·c).
    ``ga_options`` are passed to :func:`ga_select`; with ``fill_budget`` the GA counts every
    set with KL ≤ ``epsilon`` as balanced, so that among those the larger Eq. (13) priority
    sum, i.e. more workers up to the budget, wins (without it, the smallest KL wins however
    little of the budget it uses). Workers whose Eq. (9) batch is 0 (slower
    per sample than D× the fastest worker: even one sample would make them stragglers) are not
    offered to the GA; ``excluded`` counts them. The GA checks Eq. (10) with the floored Eq. 9
    sizes; lines 6-7 start from the un-floored ones (:func:`aligned_batch_sizes`) and round
    once, and workers that line 7 scales below one sample are dropped (``dropped`` counts
    them). Φ_0 stays the mean over all N workers.
    """
    dists = np.asarray(label_dists, dtype=np.float64)
    mu = np.asarray(mu, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    batch = regulate_batch_sizes(mu, beta, max_batch, min_batch=0)
    phi0 = iid_reference(dists)
    eligible = np.flatnonzero(batch >= 1)
    prio = priorities(participation)[eligible]
    chosen = ga_select(
        dists[eligible],
        batch[eligible],
        bytes_per_sample,
        budget,
        prio,
        rng,
        phi0=phi0,
        balanced_kl=epsilon if fill_budget else 0.0,
        **ga_options,
    )
    selected = eligible[chosen]
    eq9 = batch[selected].astype(np.float64)
    kl_before = kl_divergence(label_mixture(eq9, dists[selected], np.arange(selected.size)), phi0)
    d0 = np.clip(aligned_batch_sizes(mu, beta, max_batch)[selected], 1.0, max_batch)
    tuned = finetune_batch_sizes(
        d0, mu[selected], beta[selected], dists[selected], phi0, epsilon, max_batch
    )
    kl_tuned = kl_divergence(label_mixture(tuned, dists[selected], np.arange(selected.size)), phi0)
    final = scale_to_budget(tuned, bytes_per_sample, budget, max_batch)
    kept = final > 0
    delta = waiting_increase(tuned, d0, mu[selected], beta[selected])
    selected, final = selected[kept], final[kept]
    kl_after = kl_divergence(label_mixture(final, dists[selected], np.arange(selected.size)), phi0)
    times = iteration_times(final, mu[selected], beta[selected], tau)
    info = {
        "kl_before": kl_before,
        "kl_finetuned": kl_tuned,
        "kl_after": kl_after,
        "delta": delta,
        "waiting_time": average_waiting_time(times),
        "bandwidth": float(final.sum() * bytes_per_sample),
        "excluded": float(batch.size - eligible.size),
        "dropped": float(np.count_nonzero(~kept)),
    }
    return selected, final, info

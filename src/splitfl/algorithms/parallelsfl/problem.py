"""ParallelSFL §4.3 clustering problem of one round: its inputs (:class:`ClusterInputs`) and
the cluster measures of Eq. (8)-(14).

A cluster's per-iteration times are the clock's (:func:`splitfl.system.cluster.iteration_times`
on :meth:`ClusterInputs.member_loads`); without queueing or a shared radio this is Eq. (9),
``t_i = μ_b,i + β_i,top + μ_p,top``. KL is Eq. (13)'s ``KL(Φ_c ‖ Φ_0)``; Eq. (14)'s terms are
normalised by :func:`utility_scales`. The inputs, and how the paper's silent or ambiguous
points (KL direction, Eq. 8, 10, 14) are read: ``docs/explanation/readings/parallelsfl.md``.
Top workers' own data do not train (their labels are not in Φ_c); the caller handles that.
No torch here: every function takes numpy arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from splitfl.algorithms.estimates import BUDGET_RTOL, iid_reference, kl_divergence
from splitfl.system.cluster import MemberLoad, iteration_times

#: One cluster: ``(top worker, bottom workers)``.
Cluster = tuple[int, list[int]]

#: Absolute slack below which a utility / KL decrease is treated as no decrease (float noise).
IMPROVE_TOL = 1e-12


def _idx(members: Sequence[int] | np.ndarray) -> np.ndarray:
    return np.asarray(members, dtype=np.int64).reshape(-1)


# ------------------------------------------------------------------------ time and constraints


class Timing(NamedTuple):
    """A cluster's per-iteration figures on the cluster time model (:meth:`ClusterInputs.
    timing`): ``t_co = max_i t_i``, Eq. (11)'s ``W_c`` and Eq. (10)'s right-hand side
    ``max_i(μ_b,i + β_i,c)``, ``β_i,c`` being member i's transfer time at its rate."""

    t_co: float
    waiting: float
    bottom_max: float


def top_capacity_ok(members: Sequence[int] | np.ndarray, top: int, inputs: ClusterInputs) -> bool:
    """Eq. (8) ``N_c·b ≤ B_top`` and Eq. (10) ``N_c·μ_p,top ≤ max_i(μ_b,i + β_i,c)``.

    ``N_c = len(members)`` (bottom workers only); ``β_i,c`` is member i's per-iteration
    transfer time at its rate in the cluster (:class:`Timing`). An empty cluster satisfies
    both trivially. A relative slack of ``BUDGET_RTOL`` absorbs float round-off only.
    """
    n_c = len(members)
    if n_c == 0:
        return True
    if n_c * inputs.b > inputs.bandwidth[top] * (1.0 + BUDGET_RTOL):
        return False
    slowest = inputs.timing(members, top).bottom_max
    return bool(n_c * inputs.mu_p[top] <= slowest * (1.0 + BUDGET_RTOL))


def cluster_iteration_time(
    members: Sequence[int] | np.ndarray, top: int, inputs: ClusterInputs
) -> float:
    """``t_c,o = max_i t_i`` on the cluster time model; 0 for a top-only cluster."""
    return inputs.timing(members, top).t_co if len(members) else 0.0


def cluster_waiting(members: Sequence[int] | np.ndarray, top: int, inputs: ClusterInputs) -> float:
    """Eq. (11): ``W_c = (1/N_c) Σ_i (t_c,o − t_i)`` on the cluster time model; 0 for a
    top-only cluster."""
    return inputs.timing(members, top).waiting if len(members) else 0.0


# ------------------------------------------------------------------------------ KL and utility


def cluster_kl(
    members: Sequence[int] | np.ndarray, label_dists: np.ndarray, phi0: np.ndarray
) -> float:
    """Eq. (12)-(13): ``KL(Φ_c ‖ Φ_0)`` with ``Φ_c`` the mean of the members' ``V_i``.

    0 for a top-only cluster (no bottom data, nothing to measure).
    """
    m = _idx(members)
    if m.size == 0:
        return 0.0
    phi_c = np.asarray(label_dists, dtype=np.float64)[m].mean(axis=0)
    return kl_divergence(phi_c, phi0)


def utility_scales(
    label_dists: np.ndarray, mu_b: np.ndarray, mu_p: np.ndarray, beta: np.ndarray
) -> tuple[float, float]:
    """Normalisers ``(w_scale, kl_scale)`` of Eq. (14) (the paper does not give them).

    * ``w_scale`` = mean Eq. (9) time over all ordered pairs (bottom i, top j), i ≠ j:
      ``mean(μ_b) + mean_{i≠j} β_ij + mean(μ_p)`` (``μ_b + μ_p`` for a single worker).
    * ``kl_scale`` = ``max_i KL(V_i ‖ Φ_0)``: by convexity no cluster's KL exceeds it.

    A scale that is not positive (identical or zero-cost workers) is replaced by 1.
    """
    mu_b = np.asarray(mu_b, dtype=np.float64)
    mu_p = np.asarray(mu_p, dtype=np.float64)
    beta = np.asarray(beta, dtype=np.float64)
    n = mu_b.size
    if n == 0:
        return 1.0, 1.0
    off = ~np.eye(n, dtype=bool)
    mean_beta = float(beta[off].mean()) if n > 1 else 0.0
    w_scale = float(mu_b.mean() + mean_beta + mu_p.mean())
    dists = np.asarray(label_dists, dtype=np.float64)
    phi0 = iid_reference(dists)
    kl_scale = max(kl_divergence(v, phi0) for v in dists)
    return (w_scale if w_scale > 0 else 1.0), (kl_scale if kl_scale > 0 else 1.0)


# ------------------------------------------------------------------------------ one round's inputs


@dataclass(frozen=True, eq=False)
class ClusterInputs:
    """What Alg. 1 works on in round h: the workers' state and the Eq. (14) weights.

    ``label_dists`` (V, [N, M]), ``mu_b``, ``mu_p``, ``beta`` (Eq. 9), ``bandwidth`` (B_i),
    ``b`` (Eq. 8), ``down_bytes`` and ``radio`` (``None``: no radio is shared) as in the module
    docstring; ``lam`` is λ of Eq. (14). ``phi0`` defaults to
    Φ_0 = :func:`~splitfl.algorithms.estimates.iid_reference` of V, ``w_scale`` and
    ``kl_scale`` to :func:`utility_scales`. Arrays are stored as float64.
    """

    label_dists: np.ndarray
    mu_b: np.ndarray
    mu_p: np.ndarray
    beta: np.ndarray
    bandwidth: np.ndarray
    b: float
    lam: float = 0.5
    phi0: np.ndarray | None = None
    w_scale: float | None = None
    kl_scale: float | None = None
    down_bytes: float = 0.0
    radio: np.ndarray | None = None
    #: workers not to elect as top workers this round: a top worker whose hosted cluster
    #: failed (device lost, stalled, refused; networked runs) sits out the next election,
    #: doubling at each further failure in a row (:class:`~splitfl.core.benching.SitOut`).
    #: Not in the paper, which assumes every elected top worker serves: without it a dead top
    #: worker drops its whole cluster every round.
    excluded_tops: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        arrays = ("label_dists", "mu_b", "mu_p", "beta", "bandwidth")
        for name in arrays:
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=np.float64))
        if self.radio is not None:
            object.__setattr__(self, "radio", np.asarray(self.radio, dtype=np.float64))
        object.__setattr__(self, "down_bytes", float(self.down_bytes))
        object.__setattr__(self, "_timing", {})  # (top, members) -> Timing
        object.__setattr__(self, "_loads", {})  # (worker, top) -> MemberLoad
        phi0 = iid_reference(self.label_dists) if self.phi0 is None else self.phi0
        object.__setattr__(self, "phi0", np.asarray(phi0, dtype=np.float64))
        object.__setattr__(self, "b", float(self.b))
        if self.w_scale is None or self.kl_scale is None:
            w_scale, kl_scale = utility_scales(self.label_dists, self.mu_b, self.mu_p, self.beta)
            if self.w_scale is None:
                object.__setattr__(self, "w_scale", w_scale)
            if self.kl_scale is None:
                object.__setattr__(self, "kl_scale", kl_scale)

    @property
    def n(self) -> int:
        """The number of workers N."""
        return self.label_dists.shape[0]

    def member_loads(
        self, members: Sequence[int] | np.ndarray, top: int, model_bytes: float = 0.0
    ) -> tuple[MemberLoad, ...]:
        """Each member's per-iteration work on the cluster time model, in the given order:
        ``μ_b,i``, ``μ_p,top``, link rate ``(b + down_bytes)/β_i,top`` (∞ where nothing takes
        time), ``b`` up, ``down_bytes`` down, and ``model_bytes`` (the bottom submodel; only the
        model traffic β_c uses it)."""
        nbytes = self.b + self.down_bytes
        return tuple(
            MemberLoad(
                float(self.mu_b[i]),
                float(self.mu_p[top]),
                float(nbytes / self.beta[i, top]) if self.beta[i, top] > 0 else math.inf,
                self.b,
                self.down_bytes,
                model_bytes,
            )
            for i in members
        )

    def timing(self, members: Sequence[int] | np.ndarray, top: int) -> Timing:
        """:class:`Timing` of ``members`` (taken in increasing worker order, as the clock
        takes a cluster's tasks) served by ``top``, from
        :func:`splitfl.system.cluster.iteration_times`, the clock's function; cached."""
        top, order = int(top), tuple(sorted(int(i) for i in members))
        cache, loads = self._timing, self._loads  # type: ignore[attr-defined]
        if (top, order) not in cache:
            for i in order:
                if (i, top) not in loads:
                    loads[i, top] = self.member_loads([i], top)[0]
            radio = None if self.radio is None else float(self.radio[top])
            times, rates = iteration_times([loads[i, top] for i in order], radio)
            nbytes = self.b + self.down_bytes
            links = [float(self.mu_b[i]) + nbytes / r for i, r in zip(order, rates, strict=True)]
            t_co = max(times)
            cache[top, order] = Timing(t_co, t_co - sum(times) / len(times), max(links))
        return cache[top, order]

    def iteration_time(self, members: Sequence[int] | np.ndarray, top: int) -> float:
        """``t_c,o`` of ``members`` served by ``top`` (:func:`cluster_iteration_time`)."""
        return cluster_iteration_time(members, top, self)

    def fits(self, members: Sequence[int] | np.ndarray, top: int) -> bool:
        """Eq. (8) and (10) for ``top`` serving ``members`` (:func:`top_capacity_ok`)."""
        return top_capacity_ok(members, top, self)

    def kl(self, members: Sequence[int] | np.ndarray) -> float:
        """Eq. (13) ``KL(Φ_c ‖ Φ_0)`` of ``members`` (:func:`cluster_kl`)."""
        return cluster_kl(members, self.label_dists, self.phi0)

    def waiting(self, members: Sequence[int] | np.ndarray, top: int) -> float:
        """Eq. (11) ``W_c`` of ``members`` served by ``top`` (:func:`cluster_waiting`)."""
        return cluster_waiting(members, top, self)


def cluster_utility(members: Sequence[int] | np.ndarray, top: int, inputs: ClusterInputs) -> float:
    """Eq. (14): ``U_c = λ·W_c/w_scale + (1−λ)·KL(Φ_c ‖ Φ_0)/kl_scale``.

    ``W_c`` is Eq. (11), the KL is Eq. (13); see :func:`utility_scales` for the scales.
    """
    w = inputs.waiting(members, top)
    kl = inputs.kl(members)
    lam = inputs.lam
    return float(lam * w / inputs.w_scale + (1.0 - lam) * kl / inputs.kl_scale)


def total_utility(clusters: Sequence[Cluster], inputs: ClusterInputs) -> float:
    """``Σ_c U_c`` (Eq. 14 summed over clusters), the objective of Alg. 1 line 11."""
    return float(sum(cluster_utility(m, t, inputs) for t, m in clusters))

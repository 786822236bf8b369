"""MergeSFL §IV-A worker selection (Alg. 1 lines 3-5; Eq. 10-13): a genetic algorithm over
bit strings (gene i = worker i selected) for the set S minimising KL(Φ_h ‖ Φ_0) (Eq. 11-12)
under the PS ingress-bandwidth budget (Eq. 10), seeded with the highest-priority workers
(Eq. 13).

GA settings (population, generations, rates, elite count, m = ⌈init_fraction·N⌉) are
arguments, since the paper does not give them (see ``reference/spec-gaps.md``).
No torch here: every function takes numpy arrays and a ``np.random.Generator``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from splitfl.algorithms.estimates import BUDGET_RTOL, iid_reference, kl_divergence


def priorities(participation: np.ndarray) -> np.ndarray:
    """Eq. (13): ``p_i = Σ_j (K_j+1) / (K_i+1)`` with ``K`` the participation counts."""
    k1 = np.asarray(participation, dtype=np.float64) + 1.0
    return k1.sum() / k1


# ------------------------------------------------------------------------ label distributions


def _as_indices(selected: np.ndarray, n: int) -> np.ndarray:
    """Worker indices from a boolean mask of length ``n`` or from an integer index array."""
    sel = np.asarray(selected)
    if sel.dtype == np.bool_:
        if sel.shape != (n,):
            raise ValueError(f"boolean mask has shape {sel.shape}, expected ({n},)")
        return np.flatnonzero(sel)
    sel = sel.astype(np.int64).reshape(-1)
    if sel.size and (sel.min() < 0 or sel.max() >= n):
        raise ValueError(f"worker index out of range [0, {n})")
    return sel


def label_mixture(batch: np.ndarray, label_dists: np.ndarray, selected: np.ndarray) -> np.ndarray:
    """Eq. (11): ``Φ_h = Σ_{i∈S} d_i·V_i / Σ_{i∈S} d_i``.

    ``batch`` has one entry per worker (length N) and ``label_dists`` one row ``V_i`` per worker
    (``[N, M]``, rows summing to 1). ``selected`` is either a boolean mask of length N or an
    integer array of worker indices; both are accepted. Raises ``ValueError`` if the selected
    batch sizes sum to zero (the mixture is undefined).
    """
    dists = np.asarray(label_dists, dtype=np.float64)
    idx = _as_indices(selected, dists.shape[0])
    d = np.asarray(batch, dtype=np.float64)[idx]
    total = d.sum()
    if total <= 0:
        raise ValueError("the selected workers' batch sizes sum to zero; Φ_h is undefined")
    return d @ dists[idx] / total


# ----------------------------------------------------------------------------- worker selection


def bandwidth_feasible(
    mask: np.ndarray, batch: np.ndarray, bytes_per_sample: float, budget: float
) -> bool:
    """Eq. (10): ``Σ_{i∈S} d_i·c ≤ B`` (``mask``: boolean mask or index array, as Eq. 11).

    A relative slack of ``BUDGET_RTOL`` absorbs float round-off only.
    """
    d = np.asarray(batch, dtype=np.float64)
    used = d[_as_indices(mask, d.shape[0])].sum() * bytes_per_sample
    return bool(used <= budget * (1.0 + BUDGET_RTOL))


@dataclass
class _Search:
    """One genetic search of Alg. 1 lines 3-5: its fixed inputs, the fitness cache and ``rng``.

    ``cost`` is each worker's Eq. (10) use ``d_i·c``; ``fits_alone`` the workers whose use fits
    the budget alone (non-empty, checked by :func:`ga_select`).
    """

    dists: np.ndarray
    batch: np.ndarray
    prio: np.ndarray
    phi0: np.ndarray
    cost: np.ndarray
    budget: float
    fits_alone: np.ndarray
    rng: np.random.Generator
    balanced_kl: float = 0.0
    cache: dict[bytes, tuple[float, float]] = field(default_factory=dict)

    def fitness(self, genes: np.ndarray) -> tuple[float, float]:
        """``KL(Φ_h(S) ‖ Φ_0)`` (Eq. 11-12), counted as 0 at or below ``balanced_kl``, then
        the larger ``Σ_{i∈S} p_i`` (Eq. 13) first."""
        k = np.packbits(genes).tobytes()
        if k not in self.cache:
            kl = kl_divergence(label_mixture(self.batch, self.dists, genes), self.phi0)
            kl = 0.0 if kl <= self.balanced_kl else kl
            self.cache[k] = (kl, -float(self.prio[genes].sum()))
        return self.cache[k]

    def repair(self, genes: np.ndarray) -> np.ndarray:
        """Make a bit string satisfy Eq. (10) and be non-empty (in place; also returned).

        While over budget, one selected worker chosen uniformly at random is dropped. If the
        result is empty, one worker chosen uniformly at random among ``fits_alone`` is selected.
        """
        limit = self.budget * (1.0 + BUDGET_RTOL)
        used = self.cost[genes].sum()
        if used > limit:  # the selected workers listed once, not a scan of all N a drop
            on = np.flatnonzero(genes).tolist()
            while used > limit:
                drop = on.pop(int(self.rng.integers(len(on))))
                genes[drop] = False
                used -= self.cost[drop]
        if not genes.any():
            genes[self.fits_alone[self.rng.integers(self.fits_alone.size)]] = True
        return genes

    def initial(self, population: int, init_fraction: float) -> list[np.ndarray]:
        """Individual 0: the m = ⌈init_fraction·N⌉ highest-priority workers (Eq. 13, ties to
        the lower index); the others: each of the m with probability 1/2 (an empty draw gets
        one of the m at random). Every individual is repaired."""
        n = self.dists.shape[0]
        m = min(n, max(1, math.ceil(init_fraction * n)))
        top = np.argsort(-self.prio, kind="stable")[:m]
        pop = []
        for j in range(population):
            genes = np.zeros(n, dtype=bool)
            if j == 0:
                genes[top] = True
            else:
                genes[top[self.rng.random(m) < 0.5]] = True
                if not genes.any():
                    genes[top[self.rng.integers(m)]] = True
            pop.append(self.repair(genes))
        return pop

    def tournament(self, ranked: list[np.ndarray]) -> np.ndarray:
        """Binary tournament: the better of two random individuals of ``ranked`` (best first)."""
        a, b = self.rng.integers(len(ranked), size=2)
        return ranked[min(a, b)]  # ranked is sorted best-first, so the lower rank wins

    def next_generation(
        self, pop: list[np.ndarray], elite: int, crossover_rate: float, mutation_rate: float
    ) -> list[np.ndarray]:
        """The ``elite`` best unchanged, then children of two tournament parents: uniform
        crossover with probability ``crossover_rate`` (else a copy of the first parent),
        bit-flip mutation with probability ``mutation_rate`` per gene, repair."""
        ranked = sorted(pop, key=self.fitness)
        nxt = [g.copy() for g in ranked[:elite]]
        n = self.dists.shape[0]
        while len(nxt) < len(pop):
            first, second = self.tournament(ranked), self.tournament(ranked)
            if self.rng.random() < crossover_rate:
                child = np.where(self.rng.random(n) < 0.5, first, second)
            else:
                child = first.copy()
            child ^= self.rng.random(n) < mutation_rate
            nxt.append(self.repair(child))
        return nxt


def ga_select(
    label_dists: np.ndarray,
    batch: np.ndarray,
    bytes_per_sample: float,
    budget: float,
    priority: np.ndarray,
    rng: np.random.Generator,
    population: int = 20,
    generations: int = 40,
    mutation_rate: float = 0.05,
    crossover_rate: float = 0.9,
    elite: int = 2,
    init_fraction: float = 0.5,
    phi0: np.ndarray | None = None,
    balanced_kl: float = 0.0,
) -> np.ndarray:
    """Lines 3-5 of Alg. 1: genetic search for the worker set minimising ``KL(Φ_h ‖ Φ_0)``.

    Encoding: a bit string of length N, gene i = worker i selected. ``Φ_0`` is
    :func:`iid_reference` over all N workers and ``Φ_h`` is Eq. (11) with the Eq. (9) batch
    sizes ``batch``.

    * Initial population ("select m workers based on their priority"): the m = ⌈init_fraction·N⌉
      workers of highest Eq. (13) priority (ties to the lower index). Individual 0 selects all
      m of them; each other individual selects each of the m with probability 1/2 (an empty
      draw gets one of the m at random). Every individual is then repaired.
    * Repair (applied to every individual, initial and offspring): while Eq. (10) is violated,
      drop a uniformly random selected worker; if the set became empty, select one random
      worker among those whose batch fits the budget alone.
    * Fitness: ``KL(Φ_h(S) ‖ Φ_0)``, lower is better, with every KL at or below
      ``balanced_kl`` counted as 0 (MergeSFL passes ε: line 6 asks no more of a set than
      KL ≤ ε); ties go to the larger total priority ``Σ_{i∈S} p_i`` (so equally balanced
      sets favour rarely-used workers and more workers, up to the Eq. 10 budget: "the
      available ingress bandwidth B^h ... determine[s] the number of selected workers").
    * Each generation keeps the ``elite`` best unchanged; every other child comes from two
      binary-tournament parents (best of two random individuals each), uniform crossover with
      probability ``crossover_rate`` (else a copy of the first parent), independent bit-flip
      mutation with probability ``mutation_rate`` per gene, then repair.

    ``phi0`` overrides Φ_0 (when ``label_dists`` holds only the eligible workers, Φ_0 is still
    the mean over all N). Deterministic for a given ``rng`` state. Raises ``ValueError`` if no
    single worker fits the budget. Returns the best set found, as sorted worker indices.
    """
    dists = np.asarray(label_dists, dtype=np.float64)
    d = np.asarray(batch, dtype=np.float64)
    prio = np.asarray(priority, dtype=np.float64)
    n = dists.shape[0]
    if n == 0:
        raise ValueError("no workers to select from")
    cost = d * bytes_per_sample
    fits_alone = np.flatnonzero(cost <= budget * (1.0 + BUDGET_RTOL))
    if fits_alone.size == 0:
        raise ValueError(
            f"bandwidth budget {budget} is below the smallest worker's use {cost.min()} (Eq. 10)"
        )
    phi0 = iid_reference(dists) if phi0 is None else np.asarray(phi0, dtype=np.float64)
    search = _Search(dists, d, prio, phi0, cost, budget, fits_alone, rng, balanced_kl)
    pop = search.initial(max(1, population), init_fraction)
    elite = min(max(0, elite), len(pop))
    for _ in range(generations):
        pop = search.next_generation(pop, elite, crossover_rate, mutation_rate)
    return np.flatnonzero(min(pop, key=search.fitness))

"""Could S²FL's swap search skip pairs of groups without scoring them? (issue 54)

The search (``splitfl.algorithms.s2fl.data_balance._swap_search``) makes, each step, the best
swap over all pairs of groups; a swap changes two groups, so the best swaps of their 2(G − 1)
pairs are rescored (``_SwapTable._row``), O(G) a step, O(G²) a restart. A search making the
same swaps in less than O(G) a step must rule pairs out in bulk: show that a pair has no
improving swap without scoring its w² swaps. This script runs one restart of the search and
counts, for every rescored pair and for every pair of the final local optimum, what the two
cheap bounds on a pair's best change rule out:

* ``sum_of_distances``: Eq. (2) is ≥ 0, so a swap between x and y lowers Σ Eq. (2) by at most
  ``Dx + Dy``; a pair of two groups at distance 0 is ruled out (separable: a sorted list of
  the groups' distances would find such pairs without visiting them).
* ``triangle``: with ``z_c = C·h_c − t_c`` and ``Z`` a group's sum (``Dist = |Z| / (C·T)``),
  swapping i ∈ x with j ∈ y adds ``d = z_j − z_i`` to x and removes it from y;
  ``|Z + d| ≥ |d| − |Z|`` and ``T' ≤ Tx + Ty`` give: the swap can lower the sum only if
  ``2|d| < |Zx| + |Zy| + C·(Tx + Ty)·(Dx + Dy)``. The least |d| over the pair's swaps is used,
  the best any index over the clients' ``z`` (a ball tree) could do.

    PYTHONPATH=src python benchmarks/s2fl_swap_bounds.py --kinds four_samples dirichlet \
        --clients 1000
    PYTHONPATH=src python benchmarks/s2fl_swap_bounds.py --kinds dirichlet --clients 1000 5000 \
        --samples 120

One JSON line per (kind, N).
"""

from __future__ import annotations

import argparse
import json

import numpy as np

from splitfl.algorithms.s2fl import data_balance as db

#: Pairs of the final table checked at once (bounds the memory of :func:`ruled_out`).
_SLICE = 20_000
#: The bounds of :func:`lower_bounds`.
BOUNDS = ("sum_of_distances", "triangle")


def histograms(kind: str, n: int, samples: int = 600) -> np.ndarray:
    """``four_samples``: ``bench_scale.py grouping``'s devices (4 IID samples of 10 classes);
    ``dirichlet``: ``samples`` a device, label shares from Dirichlet(0.5) (non-IID). Keep
    ``16·(10·n·samples)² < 2⁵³``, or the table claims no error bound and the search scores
    every improving pair exactly (``_SwapTable.error_bound``): hours at N = 5,000 × 600."""
    rng = np.random.default_rng(0)
    if kind == "four_samples":
        hist = np.zeros((n, 10))
        np.add.at(hist, (np.repeat(np.arange(n), 4), rng.integers(0, 10, 4 * n)), 1)
        return hist
    shares = rng.dirichlet([0.5] * 10, n)
    return np.stack([rng.multinomial(samples, p) for p in shares]).astype(np.float64)


def least_gaps(table: db._SwapTable, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """The least ``|z_j − z_i|`` over the swaps of each pair ``(x[k], y[k])``, in slices."""
    members, real, z = table.members, table.real, table.z
    out = np.empty(len(x))
    for k in range(0, len(x), _SLICE):
        a, b = members[x[k : k + _SLICE]], members[y[k : k + _SLICE]]
        gap = np.linalg.norm(z[b][:, None, :, :] - z[a][:, :, None, :], axis=-1)
        ok = real[x[k : k + _SLICE]][:, :, None] & real[y[k : k + _SLICE]][:, None, :]
        out[k : k + _SLICE] = np.where(ok, gap, np.inf).reshape(len(a), -1).min(axis=1)
    return out


def lower_bounds(
    table: db._SwapTable, x: np.ndarray, y: np.ndarray, least: np.ndarray
) -> dict[str, np.ndarray]:
    """Each bound's least change of Σ Eq. (2) by a swap of the pair ``(x[k], y[k])``."""
    dist, norms = table.dists, np.sqrt(table.square)
    both = dist[x] + dist[y]
    scale = table.classes * (table.total[x] + table.total[y])
    triangle = (2 * least - norms[x] - norms[y]) / scale - both
    return {"sum_of_distances": -both, "triangle": np.maximum(-both, triangle)}


def one_restart(kind: str, n: int, samples: int = 600, seed: int = 1) -> dict:
    """One restart of the search on ``n`` devices in groups of 5, counting what the bounds rule
    out: among the pairs each step rescores (no improving swap), among all pairs each step
    given the step's own best change (an oracle threshold), among all pairs at the end."""
    hist = histograms(kind, n, samples)
    count = -(-n // 5)
    order = np.random.default_rng(seed).permutation(n)
    cuts = np.cumsum([0, *db.group_sizes(n, count)])
    groups = [[int(i) for i in order[cuts[g] : cuts[g + 1]]] for g in range(count)]
    x, y = np.triu_indices(count, 1)
    tally = {"steps": 0, "rescored": 0, "rescored_improving": 0}
    tally |= {f"rescored_{b}": 0 for b in BOUNDS} | {f"oracle_{b}": [] for b in BOUNDS}
    tables, table_class, swap, best_swap = [], db._SwapTable, db._SwapTable.swap, db._best_swap
    least = np.zeros((count, count))

    def counted_best(hist_, table, sums, cost):
        best, move = best_swap(hist_, table, sums, cost)
        if move is not None:
            tally["steps"] += 1
            for name, bound in lower_bounds(table, x, y, least[x, y]).items():
                tally[f"oracle_{name}"].append(int((bound <= best - cost).sum()))
        return best, move

    def counted_swap(self, a, b, i, j):
        swap(self, a, b, i, j)
        for g in (a, b):
            others = np.delete(np.arange(count), g)
            mine = np.full(len(others), g)
            least[g, others] = least[others, g] = least_gaps(self, mine, others)
            tally["rescored"] += len(others)
            tally["rescored_improving"] += int((self.changes[g, others] < 0).sum())
            for name, bound in lower_bounds(self, mine, others, least[g, others]).items():
                tally[f"rescored_{name}"] += int((bound >= 0).sum())

    def kept(*args):
        tables.append(table_class(*args))
        least[x, y] = least[y, x] = least_gaps(tables[-1], x, y)
        return tables[-1]

    db._SwapTable, table_class.swap, db._best_swap = kept, counted_swap, counted_best
    try:
        cost, groups = db._swap_search(hist, groups)
    finally:
        db._SwapTable, table_class.swap, db._best_swap = table_class, swap, best_swap
    table = tables[0]
    final = lower_bounds(table, x, y, least[x, y])
    entries = table.changes[x, y]
    row = {"kind": kind, "n": n, "groups": count, "steps": tally["steps"], "cost": cost}
    row["samples"] = samples if kind == "dirichlet" else 4
    row["rescored_pairs"] = tally["rescored"]
    row["rescored_improving"] = tally["rescored_improving"] / tally["rescored"]
    for name in BOUNDS:
        row[f"rescored_ruled_out_{name}"] = tally[f"rescored_{name}"] / tally["rescored"]
        looked = np.array(tally[f"oracle_{name}"])
        row[f"oracle_not_ruled_out_{name}_median"] = float(np.median(looked) / len(x))
        row[f"oracle_not_ruled_out_{name}_least"] = float(looked.min() / len(x))
        row[f"final_ruled_out_{name}"] = float((final[name] >= 0).mean())
    row["final_pairs"] = len(x)
    row["final_groups_at_distance_0"] = float((table.dists == 0).mean())
    row["final_entries_at_most_1e-9"] = float((entries <= 1e-9).mean())
    row["final_entry_quantiles_10_50_90"] = np.quantile(entries, [0.1, 0.5, 0.9]).tolist()
    return row


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kinds", nargs="+", default=["four_samples", "dirichlet"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1000])
    parser.add_argument("--samples", type=int, default=600, help="dirichlet: samples a device")
    a = parser.parse_args(argv)
    for kind in a.kinds:
        for n in a.clients:
            print(json.dumps(one_restart(kind, n, a.samples)), flush=True)


if __name__ == "__main__":
    main()

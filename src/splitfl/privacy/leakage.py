"""RingSFL's eavesdropper leakage probability (``papers/ringsfl.md`` §3.6.1, Eq. 8, Fig. 5).

In the worst case every client trains one layer per step, so an eavesdropper who hears every
link can piece together a client's complete gradient. Client u_i leaks if its link to the
server is heard (probability ``e_i``) and, for every other client u_j, either u_j's server link
(``e_j``) or its ring link to u_{j-1} (``e'_j``) is heard:

    P_i = e_i · Π_{j ≠ i} (1 − (1 − e_j)(1 − e'_j))                                   (8)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np


def _probabilities(values: Sequence[float], name: str) -> np.ndarray:
    arr = np.asarray(values, dtype=float)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty sequence of probabilities")
    if not np.all((arr >= 0) & (arr <= 1)):
        raise ValueError(f"{name} must lie in [0, 1] (got {arr.tolist()})")
    return arr


def leakage_probability(e: Sequence[float], e_prime: Sequence[float]) -> np.ndarray:
    """Eq. (8) for every client.

    Args:
        e: ``e_i``, the probability that the link between client i and the server is heard.
        e_prime: ``e'_i``, the probability that the ring link between u_i and u_{i-1} is heard.

    Returns:
        ``P`` with ``P[i]`` the leakage probability of client i.
    """
    e_arr = _probabilities(e, "e")
    ep_arr = _probabilities(e_prime, "e_prime")
    if e_arr.shape != ep_arr.shape:
        raise ValueError(f"e has {e_arr.size} entries but e_prime has {ep_arr.size}")
    heard = 1.0 - (1.0 - e_arr) * (1.0 - ep_arr)  # some link carrying u_j's layer is heard
    n = e_arr.size
    # product over j != i without dividing (heard_j may be 0)
    return np.array([e_arr[i] * np.prod(np.delete(heard, i)) for i in range(n)])


def leakage_curve(e_values: Sequence[float], n_max: int) -> dict:
    """Fig. 5: P of client 0 for ``N = 2..n_max`` clients, with ``e = e_i = e'_i`` for all i.

    Returns ``{"n": [2, …, n_max], "curves": {e: [P(N=2), …, P(N=n_max)]}}``.
    """
    if n_max < 2:
        raise ValueError(f"n_max must be >= 2 (got {n_max})")
    ns = list(range(2, n_max + 1))
    curves = {}
    for e in e_values:
        curves[float(e)] = [float(leakage_probability([e] * n, [e] * n)[0]) for n in ns]
    return {"n": ns, "curves": curves}


def plot_leakage_curve(curve: dict, path: str | Path) -> Path:
    """Plot :func:`leakage_curve`'s result (log-scale y, one line per e) to a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(5.5, 4))
    markers = "osd^v<>ph*"
    for k, (e, values) in enumerate(sorted(curve["curves"].items())):
        ax.plot(curve["n"], values, marker=markers[k % len(markers)], ms=4, label=f"e = {e:g}")
    ax.set_yscale("log")
    ax.set_xlabel("number of clients N")
    ax.set_ylabel("privacy leakage probability P")
    ax.set_title("RingSFL Eq. (8), e = e_i = e'_i")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

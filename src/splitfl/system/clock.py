"""The simulated clock: deterministic time from the cost model, with optional seeded jitter."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SimClock:
    """Accumulates simulated seconds round by round; never goes backwards."""

    now: float = 0.0

    def advance(self, seconds: float) -> float:
        if not seconds >= 0:
            raise ValueError(f"simulated time must not go backwards (got {seconds})")
        self.now += seconds
        return self.now


def jitter_factors(
    clients: list[int], sigma: float, rng: np.random.Generator | None
) -> dict[int, float]:
    """Multiplicative log-normal jitter ``exp(N(0, sigma²))`` per client (1.0 when sigma = 0,
    where ``rng`` is not used and may be None)."""
    if sigma <= 0:
        return {c: 1.0 for c in clients}
    draws = rng.lognormal(mean=0.0, sigma=sigma, size=len(clients))
    return {c: float(f) for c, f in zip(clients, draws, strict=True)}

"""Every random choice flows from the run's seed.

Random streams are derived from ``(seed, purpose, round, …)`` rather than carried along, so a
resumed run draws exactly what an uninterrupted run would (no RNG state to checkpoint), and two
algorithms compared under one seed see the same partition, devices and client selection.
"""

from __future__ import annotations

import zlib

import numpy as np


def _key(part: int | str) -> int:
    return zlib.crc32(part.encode()) if isinstance(part, str) else int(part)


def derive_seed(seed: int, *parts: int | str) -> int:
    """A 63-bit integer seed for ``(seed, *parts)``."""
    ss = np.random.SeedSequence([int(seed), *(_key(p) for p in parts)])
    return int(ss.generate_state(2, dtype=np.uint32).astype(np.uint64) @ [1 << 31, 1])


def rng_for(seed: int, *parts: int | str) -> np.random.Generator:
    """A numpy generator for ``(seed, *parts)``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), *(_key(p) for p in parts)]))

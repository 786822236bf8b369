"""Every random choice flows from the run's seed.

Random streams are derived from ``(seed, purpose, round, …)`` rather than carried along, so a
resumed run draws exactly what an uninterrupted run would (no RNG state to checkpoint), and two
algorithms compared under one seed see the same partition, devices and client selection.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np
import torch


def _key(part: int | str) -> int:
    return zlib.crc32(part.encode()) if isinstance(part, str) else int(part)


def derive_seed(seed: int, *parts: int | str) -> int:
    """A 63-bit integer seed for ``(seed, *parts)``: the first two 32-bit words ``a, b`` of
    the stream's state as ``a·2³¹ + b`` rounded to a float64, as it was first computed (a
    uint64 vector times a list of ints is a float64 product in numpy), without the array."""
    ss = np.random.SeedSequence([int(seed), *(_key(p) for p in parts)])
    a, b = ss.generate_state(2, dtype=np.uint32).tolist()
    return int(float(a * (1 << 31) + b))


def rng_for(seed: int, *parts: int | str) -> np.random.Generator:
    """A numpy generator for ``(seed, *parts)``."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), *(_key(p) for p in parts)]))


@functools.cache
def _other_accelerator() -> bool:
    """Whether an MPS or XPU device exists (``torch.manual_seed`` seeds theirs too)."""
    xpu = getattr(torch, "xpu", None)
    return torch.backends.mps.is_available() or bool(xpu is not None and xpu.is_available())


def seed_torch(seed: int) -> None:
    """``torch.manual_seed(seed)``: the same streams, without its queued calls for
    accelerators nobody initialised — where CUDA is not initialised and no MPS/XPU device
    exists, only the CPU generator is seeded, as ``torch.manual_seed`` would (its lazy CUDA,
    XPU and MTIA calls each record a stack trace: about 1 ms a round on a 2-core machine,
    ~3 % of a 35 ms round)."""
    if torch.cuda.is_initialized() or _other_accelerator():
        torch.manual_seed(seed)
    else:
        torch.default_generator.manual_seed(seed)

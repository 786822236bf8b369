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
    ``numpy.random.SeedSequence([seed, *parts]).generate_state(2)`` as ``a·2³¹ + b`` rounded
    to a float64, as it was first computed (a uint64 vector times a list of ints is a
    float64 product in numpy). The words come from :func:`_seed_sequence_words`, numpy's
    algorithm in plain integers: a round derives ~23 seeds, and numpy's object (arrays, an
    ``errstate`` per call) took ~15 µs each inside a run, ~0.5 ms of a 30 ms round."""
    a, b = _seed_sequence_words([int(seed), *(_key(p) for p in parts)])
    return int(float(a * (1 << 31) + b))


_M32 = 0xFFFFFFFF


def _seed_sequence_words(entropy: list[int]) -> tuple[int, int]:
    """``SeedSequence(entropy).generate_state(2, np.uint32)`` for non-negative ints (numpy's
    ``bit_generator.pyx``, after M. E. O'Neill's ``seed_seq_fe``: each int split into 32-bit
    words, little end first; a pool of 4 words hashed in, mixed pairwise, the remaining words
    mixed into every pool word; two output words hashed out). Checked against numpy by
    ``tests/executors/test_overhead.py::test_derived_seeds_equal_the_array_reference``."""
    words: list[int] = []
    for value in entropy:
        words += [0] if value == 0 else _words32(value)
    pool, h = [0, 0, 0, 0], 0x43B0D7E5
    for i in range(4):
        pool[i], h = _hashmix(words[i] if i < len(words) else 0, h)
    for src in range(4):
        for dst in range(4):
            if src != dst:
                value, h = _hashmix(pool[src], h)
                pool[dst] = _mix(pool[dst], value)
    for word in words[4:]:
        for dst in range(4):
            value, h = _hashmix(word, h)
            pool[dst] = _mix(pool[dst], value)
    out, h = [], 0x8B51F9DD
    for word in pool[:2]:
        value = word ^ h
        h = (h * 0x58F38DED) & _M32
        value = (value * h) & _M32
        out.append(value ^ (value >> 16))
    return out[0], out[1]


def _words32(value: int) -> list[int]:
    words = []
    while value:
        words.append(value & _M32)
        value >>= 32
    return words


def _hashmix(value: int, h: int) -> tuple[int, int]:
    """numpy's ``hashmix``: the hashed word and the next hash constant."""
    value ^= h
    h = (h * 0x931E8875) & _M32
    value = (value * h) & _M32
    return value ^ (value >> 16), h


def _mix(x: int, y: int) -> int:
    result = (0xCA01F9DD * x - 0x4973F715 * y) & _M32
    return result ^ (result >> 16)


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

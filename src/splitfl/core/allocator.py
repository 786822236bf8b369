"""Keep freed memory in the process for the next batch instead of returning it to the OS.

glibc's ``malloc`` serves blocks above a threshold (128 KiB at first) with ``mmap`` and gives
them back on ``free``, so a process that builds and drops a buffer of the same size each batch
(a message's bytes, a received tensor's aligned copy, a unit's activations) faults in fresh
zeroed pages every time: about 256 page faults per MiB, for every message. A long-running
splitfl process (a worker of ``executor: parallel``, a device, the networked server) keeps
freed blocks up to :data:`MMAP_THRESHOLD` in its heap and trims the heap only beyond
:data:`TRIM_THRESHOLD`. Other allocators (macOS, musl) are left as they are.

A leaf module (imports nothing from splitfl).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

#: Blocks up to this size come from (and return to) the heap.
MMAP_THRESHOLD = 32 << 20
#: The heap's free top is returned to the OS only beyond this.
TRIM_THRESHOLD = 256 << 20
#: The same settings for a child process, as glibc reads them from its environment.
KEEP_FREED_MEMORY = {
    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD),
    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD),
}
# mallopt's parameter numbers (glibc's malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


@functools.cache
def keep_freed_memory() -> bool:
    """Apply the settings to this process (glibc only, once per process; a setting its
    environment already gives is left as given); whether glibc took them."""
    if not sys.platform.startswith("linux"):
        return False
    try:  # the process's own symbols: glibc's mallopt where the C library is glibc
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = (
        ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD, MMAP_THRESHOLD),
        ("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD, TRIM_THRESHOLD),
    )
    taken = [mallopt(param, value) == 1 for var, param, value in settings if var not in os.environ]
    return all(taken)

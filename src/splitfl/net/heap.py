"""Keep freed message buffers in the process's heap instead of returning them to the system.

Every message a process sends or receives allocates buffers of its size (the stream chunks,
the receive buffer the tensors are read from, the tensors a device computes). With glibc's
default policy, blocks of a megabyte or so are mapped fresh from the system (or the heap is
trimmed back after they are freed), so each message pays a page fault per 4 KB page when its
bytes are first written — far more than the copy itself. :func:`keep_freed_buffers` raises
the two thresholds (``mallopt``) once per process so that such blocks are reused: blocks up
to :data:`MMAP_THRESHOLD` come from the heap and up to :data:`TRIM_THRESHOLD` of free heap is
kept. A process whose environment sets glibc's own ``MALLOC_MMAP_THRESHOLD_`` or
``MALLOC_TRIM_THRESHOLD_`` keeps those; on other C libraries this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: Largest block served from the heap (glibc's ceiling for this setting on 64-bit systems).
MMAP_THRESHOLD = 32 << 20
#: Free heap kept before it is returned to the system.
TRIM_THRESHOLD = 256 << 20
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_done = False


def keep_freed_buffers() -> bool:
    """Set the heap thresholds once per process; whether they are now set (False on a C
    library without ``mallopt`` or when the environment chose its own)."""
    global _done
    if _done:
        return True
    if any(k in os.environ for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    _done = bool(ok)
    return _done

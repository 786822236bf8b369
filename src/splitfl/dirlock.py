"""Exclusive locks on run and sweep directories (one owning process at a time).

A process that writes into a run directory (``splitfl run``, ``--resume``) or a sweep
directory (``splitfl sweep``) holds an exclusive, non-blocking ``fcntl.flock`` on the file
``.splitfl.lock`` inside it for as long as it works there. The kernel drops the lock when
the process exits, however it exits (``kill -9`` included), so a stale lock never blocks a
later resume. A second process is refused with one line naming the directory and the owner's
pid. Where ``fcntl`` does not exist (Windows) directories are not locked.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from splitfl.config import ConfigError

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None  # type: ignore[assignment]

LOCK_FILE = ".splitfl.lock"


class DirectoryLockedError(ConfigError):
    """Another process holds the directory's lock (one line; exit code 2 from the CLI)."""


@contextmanager
def hold_lock(folder: str | Path, what: str = "run") -> Iterator[None]:
    """Hold ``folder``'s lock for the body of the ``with``; raise
    :class:`DirectoryLockedError` at once if another process holds it."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    path = Path(folder) / LOCK_FILE
    # "a+" neither truncates nor fails when the file exists: the owner's pid stays readable
    fh = open(path, "a+")  # noqa: SIM115 - closed in finally below
    try:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            owner = fh.read().strip() or "unknown"
            raise DirectoryLockedError(
                str(folder),
                f"{what} directory in use by another splitfl process (pid {owner}); "
                "wait for it to finish or stop it",
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    finally:
        fh.close()

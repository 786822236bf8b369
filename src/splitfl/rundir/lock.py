"""Exclusive locks on run and sweep directories (one owning process at a time).

A process that writes into a run directory (``splitfl run``, ``--resume``) or a sweep
directory (``splitfl sweep``) holds an exclusive, non-blocking ``fcntl.flock`` on the file
``.splitfl.lock`` inside it for as long as it works there, and removes the file when it is
done. The kernel drops the lock when the process exits, however it exits (``kill -9``
included: then the file stays, unlocked), so a stale lock never blocks a later resume. A
second process is refused with one line naming the directory and the owner's pid. Where
``fcntl`` does not exist (Windows) directories are not locked.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from splitfl.config import ConfigError
from splitfl.core.atomic import remove_stale_tmp

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
    :class:`DirectoryLockedError` at once if another process holds it.

    The lock file is removed when the body ends (a finished directory holds no
    ``.splitfl.lock``). It is removed while still locked, so a process that opened it just
    before finds, once it has the lock, that the file is no longer the one at ``path`` and
    opens the new one: two processes never both hold "the" lock."""
    if fcntl is None:  # pragma: no cover
        yield
        return
    path = Path(folder) / LOCK_FILE
    fh = _acquire(path, folder, what)
    try:
        remove_stale_tmp(folder)  # a killed owner's half-written files
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        yield
    finally:
        with contextlib.suppress(OSError):  # best effort: never hide the body's error
            path.unlink(missing_ok=True)
        fcntl.flock(fh, fcntl.LOCK_UN)
        fh.close()


def _acquire(path: Path, folder: str | Path, what: str):  # noqa: ANN202 - an open file
    """The open, locked lock file at ``path`` (retried while a finishing owner removes it)."""
    while True:
        # "a+" neither truncates nor fails when the file exists: the owner's pid stays readable
        fh = open(path, "a+")  # noqa: SIM115 - closed by the caller (or below on failure)
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.seek(0)
            owner = fh.read().strip() or "unknown"
            fh.close()
            raise DirectoryLockedError(
                str(folder),
                f"{what} directory in use by another splitfl process (pid {owner}); "
                "wait for it to finish or stop it",
            ) from None
        if _same_file(fh, path):
            return fh
        fh.close()  # the previous owner removed this file as it finished: lock the new one


def _same_file(fh, path: Path) -> bool:  # noqa: ANN001
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fh.fileno())
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)

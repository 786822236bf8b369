"""Files that never lie: atomic writes, and OS errors that name their path.

Every file a reader or a resume relies on (``model.pt``, ``summary.json``, checkpoints,
``config.yaml``, ``trials.json``, reports, plots) is written by :func:`write_atomic`: to a
temporary file in the same folder, flushed to disk, then renamed over the old one. A kill,
SIGTERM or a full disk during the write leaves the old file (or none) and no temporary file
behind it, never a half-written one. Temporary files are named :data:`TMP_PREFIX` + random
text (short, so a long target name cannot make them too long).

An :class:`OSError` raised here always carries the path it is about (``err.filename``), so
the command line can print it as one line (:func:`describe_os_error`). This module imports
nothing from splitfl (the config package uses it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Callable, Iterator
from pathlib import Path

TMP_PREFIX = ".splitfl-tmp-"

#: Longest file or directory name most file systems accept (bytes; ext4, XFS, APFS, NTFS).
NAME_MAX = 255

Content = str | bytes | Callable[[Path], object]


@contextlib.contextmanager
def naming(path: str | Path) -> Iterator[None]:
    """Re-raise an :class:`OSError` from the body with ``path`` as its file name (a write
    that fails for a full disk names no file by itself)."""
    try:
        yield
    except OSError as err:
        raise OSError(err.errno, err.strerror or str(err), str(path)) from err


def write_atomic(path: str | Path, content: Content) -> Path:
    """Write ``content`` to ``path`` atomically; returns ``path``.

    ``content`` is text (UTF-8), bytes, or a function that writes the file it is given (a
    temporary path with ``path``'s suffix, e.g. ``fig.savefig``). On any failure the
    temporary file is removed and ``path`` is unchanged; an OSError names ``path``.
    """
    path = Path(path)
    with naming(path):
        fd, tmp = _create_tmp(path)
    try:
        with naming(path):
            if callable(content):
                os.close(fd)
                fd = -1
                content(tmp)
                fd = os.open(tmp, os.O_RDONLY)
            else:
                data = content.encode() if isinstance(content, str) else content
                _write_all(fd, data)
            os.fsync(fd)
            os.close(fd)
            fd = -1
            os.replace(tmp, path)
    except BaseException:
        if fd >= 0:
            os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return path


def _create_tmp(path: Path) -> tuple[int, Path]:
    """A new temporary file beside ``path`` (same suffix), opened for writing with the
    permissions of a plain new file (0o666 less the umask)."""
    while True:
        tmp = path.with_name(f"{TMP_PREFIX}{secrets.token_hex(6)}{path.suffix}")
        try:
            return os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), tmp
        except FileExistsError:
            continue


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a write may take only part of them)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def remove_stale_tmp(folder: str | Path) -> None:
    """Remove temporary files a killed writer left in ``folder`` (call it only while no
    other process can write there: under the folder's lock)."""
    for path in Path(folder).glob(f"{TMP_PREFIX}*"):
        path.unlink(missing_ok=True)


def append_text(path: str | Path, text: str) -> None:
    """Append ``text`` to ``path`` (``metrics.jsonl`` rows); an OSError names ``path``."""
    with naming(path), open(path, "a") as fh:
        fh.write(text)


def describe_os_error(err: OSError) -> str:
    """One line for an OS error: ``<path>: <reason>`` (both paths for a failed rename)."""
    reason = err.strerror or str(err) or type(err).__name__
    if err.filename is None:
        return reason
    where = str(err.filename)
    if err.filename2 is not None:
        where += f" -> {err.filename2}"
    return f"{where}: {reason}"


def error_line(err: BaseException | str) -> str:
    """One line for any error: :func:`describe_os_error` for an OS error, else the first
    line of its message (its type's name if it has none)."""
    if isinstance(err, OSError):
        return describe_os_error(err)
    lines = str(err).strip().splitlines()
    return lines[0][:300] if lines else type(err).__name__


def creatable_dir_problem(path: str | Path) -> str | None:
    """Why ``path`` cannot be used as a new or existing directory, or None if it can: a
    component that exists but is not a directory, a name longer than :data:`NAME_MAX` bytes,
    or a nearest existing folder that this process cannot write."""
    if "\0" in str(path):
        return "a name with a NUL character"
    path = Path(os.path.abspath(path))
    for part in path.parts:
        if len(os.fsencode(part)) > NAME_MAX:
            size = len(os.fsencode(part))
            return f"a name of {size} bytes is longer than the limit of {NAME_MAX}"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return "exists and is not a directory" if existing == path else f"{existing} is a file"
    if existing != path and not os.access(existing, os.W_OK | os.X_OK):
        return f"cannot create folders in {existing} (not writable)"
    return None

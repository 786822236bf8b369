"""Reading a run directory's records: ``metrics.jsonl`` rows and JSON objects
(``summary.json``, ``error.json``), each damaged or unreadable file a one-line
:class:`~splitfl.config.ConfigError` naming it. Split from :mod:`splitfl.metrics.summary`,
which computes what the rows say."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from splitfl.config import ConfigError


def read_bytes(path: Path) -> bytes:
    """The bytes of ``path``; a file that cannot be read (a directory, no permission) is a
    one-line :class:`~splitfl.config.ConfigError` naming it."""
    try:
        return path.read_bytes()
    except OSError as err:
        raise ConfigError(str(path), f"unreadable ({err.strerror or err})") from None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl`` (none if it is missing); a damaged line is a one-line
    :class:`~splitfl.config.ConfigError` naming the file and line."""
    if not path.exists():
        return []
    rows = []
    for i, line in enumerate(read_bytes(path).splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            row = None
        if not isinstance(row, dict):
            raise ConfigError(str(path), f"line {i} is not a JSON metrics row (damaged file?)")
        rows.append(row)
    return rows


def read_record(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path`` (``summary.json``, ``error.json``), None if there is no
    such file; an unreadable, damaged or non-object file is a one-line
    :class:`~splitfl.config.ConfigError` naming it."""
    if not path.exists() and not path.is_symlink():
        return None
    try:
        value = json.loads(read_bytes(path))
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise ConfigError(str(path), "not a JSON object (truncated or damaged file?)")
    return value

"""The audit log: one line per refusal, dropped link, replaced link, join and throttled
(address, name), with the UTC time and the peer address — ``run_dir/audit.log`` on the
server, a device's log for its peer listener.

Bounded whatever callers do: at most :data:`BURST` lines of one kind — (event, peer address,
first word of the detail: the status code of a refusal, the device of a join) — per
:data:`WINDOW_S` seconds; beyond that they are counted and summarised in one line when the
window ends (``... 57 more lines like this in the last 10 s``). The file is rotated to
``audit.log.1`` (replacing the previous one) once it reaches ``max_bytes``, so it never holds
more than twice that; a file that cannot be written (a full disk) costs one line on the sink
or stderr and is not written again — the run goes on.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

#: Lines of one kind written per window, the window (seconds), and the file's size cap.
BURST, WINDOW_S, MAX_BYTES = 5, 10.0, 4 << 20
#: Kinds tracked at once; beyond, new kinds share one entry per event (a flood of addresses).
MAX_KINDS = 1024


@dataclass
class _Window:
    start: float
    count: int = 0
    suppressed: int = 0


class Audit:
    """One line per event, to a file (appended, flushed per line) and/or a callable."""

    def __init__(
        self,
        path: str | Path | None = None,
        sink: Callable[[str], None] | None = None,
        only: tuple[str, ...] | None = None,
        max_bytes: int = MAX_BYTES,
    ):
        self.path, self.sink = (Path(path) if path else None), sink
        self.only = only  # the events written (None: all)
        self.max_bytes = max_bytes
        self.lock = threading.Lock()
        self.windows: dict[tuple[str, str, str], _Window] = {}
        self.size = _size(self.path)

    def __call__(self, event: str, peer: str, detail: str) -> None:
        if self.only is not None and event not in self.only:
            return
        peer = peer or "?"
        now = time.monotonic()
        with self.lock:
            kind = (event, peer, detail.split(" ", 1)[0])
            if kind not in self.windows and len(self.windows) >= MAX_KINDS:
                kind = (event, "*", "*")
            window = self.windows.get(kind)
            if window is None or now - window.start >= WINDOW_S:
                if window is not None:
                    self._summarise(kind, window, now)
                window = self.windows[kind] = _Window(now)
            window.count += 1
            if window.count > BURST:
                window.suppressed += 1
                return
            self._write(f"{event} peer={peer} {detail}")

    def flush(self, force: bool = False) -> None:
        """Write the summaries of the windows that ended (all with ``force``)."""
        now = time.monotonic()
        with self.lock:
            for kind, window in list(self.windows.items()):
                if force or now - window.start >= WINDOW_S:
                    self._summarise(kind, window, now)
                    del self.windows[kind]

    def _summarise(self, kind: tuple[str, str, str], window: _Window, now: float) -> None:
        if window.suppressed:
            event, peer, first = kind
            seconds = min(now - window.start, WINDOW_S)
            self._write(
                f"{event} peer={peer} ... {window.suppressed} more {event} lines like "
                f"'{first[:40]}' in the last {seconds:.0f} s (not written one by one)"
            )

    def _write(self, text: str) -> None:
        """One stamped line to the file (rotated at ``max_bytes``) and the sink."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        line = f"{stamp} {text}".replace("\n", " ")
        if self.path is not None:
            try:
                self._append(line + "\n")
            except OSError as err:
                print(
                    f"splitfl: {self.path}: cannot write ({err.strerror}); audit lines "
                    "are not written from now on",
                    file=sys.stderr,
                    flush=True,
                )
                self.path = None
        if self.sink is not None:
            self.sink(line)

    def _append(self, line: str) -> None:
        data = line.encode()
        if self.size + len(data) > self.max_bytes and self.size:
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self.size = 0
        with open(self.path, "ab") as f:
            f.write(data)
        self.size += len(data)


def _size(path: Path | None) -> int:
    try:
        return path.stat().st_size if path is not None else 0
    except OSError:
        return 0

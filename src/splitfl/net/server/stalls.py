"""The server process's own stalls: time during which it did not run at all.

A server frozen for 40 s (``SIGSTOP``, a paused VM, swapping) wakes past its round deadline
with its devices' replies unread in its sockets; judged on the wall clock, every honest device
of the round was "late" and was benched (issue 51 item 3). :class:`StallClock` is a heartbeat
thread that wakes every :data:`TICK_S`; a gap between two beats longer than
:data:`STALL_GAP_S` means the whole process stood still for that gap (less one tick), and
:meth:`StallClock.since` sums those gaps. The round deadline
(:meth:`~splitfl.net.server.remote_fleet.RemoteFleet._await`) moves by the stall since the
round began: lateness is measured on a clock that excludes the time the server itself was
stalled. splitfl's choice: the papers model no server stalls.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

#: How often the heartbeat wakes (seconds).
TICK_S = 0.05
#: A gap between beats longer than this is a stall of the process (seconds): well above the
#: scheduling jitter of a loaded host (a Python thread waits for the GIL up to its 5 ms switch
#: interval per runnable thread; tens of milliseconds on 2 busy cores), well below a
#: round deadline's floor (``network.round_deadline_min_s``).
STALL_GAP_S = 0.5


class StallClock:
    """Heartbeat of the server process: :meth:`since` is how long it stood still after a
    moment (``time.monotonic()``). ``clock`` is injectable for tests; :meth:`start` and
    :meth:`stop` bracket the thread (:meth:`beat` is one heartbeat)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic, gap_s: float = STALL_GAP_S):
        self.clock, self.gap_s = clock, gap_s
        self.last = clock()
        #: (start, end) of each stall, on ``clock``
        self.stalls: list[tuple[float, float]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def beat(self) -> None:
        """One heartbeat: a gap since the last one beyond ``gap_s`` is recorded as a stall."""
        now = self.clock()
        with self._lock:
            if now - self.last > self.gap_s:
                self.stalls.append((self.last + TICK_S, now))
            self.last = now

    def since(self, moment: float) -> float:
        """Seconds the process stood still after ``moment``, a stall still unrecorded included:
        after a freeze (``SIGSTOP``) every thread wakes at once, and a thread whose wait
        timed out in it may ask before the heartbeat thread has beaten again — the gap since
        the last beat is judged here first (:meth:`beat`), as the heartbeat would."""
        self.beat()
        with self._lock:
            return sum(end - max(start, moment) for start, end in self.stalls if end > moment)

    def start(self) -> StallClock:
        self.last = self.clock()
        self._thread = threading.Thread(target=self._run, name="stall-clock", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)
            self._thread = None

    def _run(self) -> None:
        while not self._stop.wait(TICK_S):
            self.beat()

"""What a listener (the server's hub, a device's peer listener) does before it knows who is
calling, and what it writes down.

* **Pre-authentication limits** (:class:`Gate`): at most ``max_pending`` streams may be
  unauthenticated at once (more are refused at once, ``RESOURCE_EXHAUSTED``); a stream that
  has not authenticated within ``auth_timeout_s`` is cancelled by one watchdog thread (no
  thread per stream); an address with ``auth_failures`` failed authentications within a
  minute is refused for the next minute (``UNAVAILABLE``, a transient code: an honest device
  behind the same address retries with backoff). The hello itself is bounded by
  ``max_hello_bytes`` (the hub reads it with its own :class:`~splitfl.net.wire.Reassembler`).
* **Audit log** (:class:`Audit`): one line per refusal, dropped link, replaced link and
  throttled address, with the UTC time and the peer address — ``run_dir/audit.log`` on the
  server, a device's log for its peer listener.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from pathlib import Path

#: How long failed authentications are remembered, and an address is refused once over the cap.
THROTTLE_WINDOW_S = 60.0


class Audit:
    """One line per event, to a file (appended, flushed per line) and/or a callable."""

    def __init__(
        self,
        path: str | Path | None = None,
        sink: Callable[[str], None] | None = None,
        only: tuple[str, ...] | None = None,
    ):
        self.path, self.sink = (Path(path) if path else None), sink
        self.only = only  # the events written (None: all)
        self.lock = threading.Lock()

    def __call__(self, event: str, peer: str, detail: str) -> None:
        if self.only is not None and event not in self.only:
            return
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        line = f"{stamp} {event} peer={peer or '?'} {detail}".replace("\n", " ")
        with self.lock:
            if self.path is not None:
                with open(self.path, "a") as f:
                    f.write(line + "\n")
            if self.sink is not None:
                self.sink(line)


class Gate:
    """Admission limits before authentication (see the module docstring)."""

    def __init__(self, max_pending: int, auth_timeout_s: float, auth_failures: int, audit: Audit):
        self.max_pending, self.auth_timeout_s = max_pending, auth_timeout_s
        self.auth_failures, self.audit = auth_failures, audit
        self.lock = threading.Lock()
        self.pending: dict[object, float] = {}  # context → authentication deadline
        self.failures: dict[str, collections.deque] = {}
        self.blocked: dict[str, float] = {}  # address → refused until
        self.stopped = threading.Event()
        self.watchdog = threading.Thread(target=self._watch, daemon=True, name="splitfl-gate")
        self.watchdog.start()

    def enter(self, context, address: str) -> str | None:
        """Admit an unauthenticated stream (its deadline starts now); the reason to refuse it
        (over the cap, or its address throttled), else None."""
        now = time.monotonic()
        with self.lock:
            if self.blocked.get(address, 0.0) > now:
                return f"too many failed authentications from {address}; retry later"
            if len(self.pending) >= self.max_pending:
                return f"more than {self.max_pending} unauthenticated connections; retry later"
            self.pending[context] = now + self.auth_timeout_s
        return None

    def deadline(self, context) -> float:
        """When ``context`` must have authenticated (``time.monotonic``)."""
        with self.lock:
            return self.pending.get(context, time.monotonic())

    def leave(self, context) -> None:
        """The stream authenticated, was refused or ended."""
        with self.lock:
            self.pending.pop(context, None)

    def failed(self, address: str) -> None:
        """Count a failed authentication; throttle the address once over the cap."""
        now = time.monotonic()
        with self.lock:
            times = self.failures.setdefault(address, collections.deque())
            times.append(now)
            while times and times[0] < now - THROTTLE_WINDOW_S:
                times.popleft()
            over = self.auth_failures and len(times) >= self.auth_failures
            if over and self.blocked.get(address, 0.0) <= now:
                self.blocked[address] = now + THROTTLE_WINDOW_S
                times.clear()
            else:
                over = False
        if over:
            self.audit("throttled", address, f"{self.auth_failures} failed authentications")

    def stop(self) -> None:
        self.stopped.set()

    def _watch(self) -> None:
        """Cancel the streams past their authentication deadline."""
        while not self.stopped.wait(0.2):
            now = time.monotonic()
            with self.lock:
                late = [ctx for ctx, deadline in self.pending.items() if deadline < now]
                for ctx in late:
                    del self.pending[ctx]
            for ctx in late:
                self.audit("refused", peer_address(ctx), "no authentication in time")
                ctx.cancel()


def peer_address(context) -> str:
    """The caller's IP address (``ipv4:1.2.3.4:5678`` → ``1.2.3.4``), for throttling."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0]
    return peer

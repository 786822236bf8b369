"""What a listener (the server's hub, a device's peer listener) does before it knows who is
calling.

**Pre-authentication limits** (:class:`Gate`): at most ``max_pending`` streams may be
unauthenticated at once; when they are all taken, a new stream takes a slot of the caller
holding the most — the address with the most pending streams, within it the connection
(``context.peer()``, address and port) with the most — its oldest stream that has not said
hello yet (else its oldest), which is cancelled. A flood of streams, silent or saying hellos
it never proves, from one connection or address cannot keep a device out: it only shortens
its own streams' lives (issue 51 item 6: ≈136 hello streams/s on one TLS connection
cancelled 6 of 8 valid logins when the globally oldest stream was evicted). One stream per
HTTP/2 connection is not enforced with ``grpc.max_concurrent_streams``: grpc shares one
connection among a process's channels with equal arguments, so that would also cap honest
devices run in one process. A stream must say
hello within :data:`HELLO_TIMEOUT_S` and prove its token within ``auth_timeout_s`` of opening,
or one watchdog thread (no thread per stream) cancels it. Failed proofs are counted per
(address, claimed name), never per address alone (devices behind one NAT share an address):
``auth_failures`` of them within a minute *throttle* that pair for a minute — it may then hold
one unauthenticated stream at a time (a newer one replaces it) — but a stream that proves
the right token is always admitted. A hello never proved — its stream closed or timed out
after the hello without a right proof — counts as a failed authentication of its pair (issue
51: such hellos never engaged the throttle); a stream closed before its hello does not, nor
does one evicted for another's slot. The hello itself is bounded by ``max_hello_bytes`` (the
hub reads it with its own :class:`~splitfl.net.transport.wire.Reassembler`). Refusals are
written down by :class:`~splitfl.net.transport.audit.Audit`. TLS handshake failures only as a
count: grpc's Python API (1.85) creates no call for a failed handshake, and the one hook near
it, ``dynamic_ssl_server_credentials``' fetcher, runs before each handshake but is told
neither the peer nor the outcome, so the server's hub audits the connections that never
opened a stream (:mod:`splitfl.net.transport.connections`), without their addresses.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass

from splitfl.net.transport.audit import Audit

__all__ = ["HELLO_TIMEOUT_S", "THROTTLE_WINDOW_S", "Audit", "Gate", "peer_address"]

#: How long failed authentications are remembered, and a throttled (address, name) stays so.
THROTTLE_WINDOW_S = 60.0
#: A stream must send its hello within this (seconds; at most ``auth_timeout_s``).
HELLO_TIMEOUT_S = 2.0


@dataclass
class _Pending:
    """One unauthenticated stream: when it must be done, when it came, who it claims to be."""

    deadline: float
    opened: float
    key: tuple[str, str] | None = None  # (address, name) once its hello arrived
    peer: str = ""  # the connection (``context.peer()``: address and port)
    address: str = ""
    proved: bool = False  # its proof checked out (a later refusal is no failed proof)


class Gate:
    """Admission limits before authentication (see the module docstring)."""

    def __init__(self, max_pending: int, auth_timeout_s: float, auth_failures: int, audit: Audit):
        self.max_pending, self.auth_timeout_s = max_pending, auth_timeout_s
        self.auth_failures, self.audit = auth_failures, audit
        self.lock = threading.Lock()
        self.pending: dict[object, _Pending] = {}
        self.failures: dict[tuple[str, str], collections.deque] = {}
        self.throttled: dict[tuple[str, str], float] = {}  # (address, name) → until
        self.stopped = threading.Event()
        self.watchdog = threading.Thread(target=self._watch, daemon=True, name="splitfl-gate")
        self.watchdog.start()

    def enter(self, context, address: str) -> str | None:
        """Admit an unauthenticated stream (its hello deadline starts now), cancelling the
        oldest pending stream when every slot is taken; the reason to refuse it, else None."""
        now = time.monotonic()
        with self.lock:
            full = len(self.pending) >= self.max_pending
            evicted = self._evict_from_most() if full else None
            if len(self.pending) >= self.max_pending:
                return f"more than {self.max_pending} unauthenticated connections; retry later"
            hello_by = now + min(HELLO_TIMEOUT_S, self.auth_timeout_s)
            peer = str(context.peer() or "")
            self.pending[context] = _Pending(hello_by, now, None, peer, address)
        if evicted is not None:
            self.audit("refused", peer_address(evicted), "evicted: unauthenticated slots full")
            evicted.cancel()
        return None

    def _evict_from_most(self):
        """Remove (under the lock) a stream of the caller holding the most slots (the
        address with the most pending streams, within it the connection with the most): its
        oldest without a hello, else its oldest; it."""
        if not self.pending:
            return None
        by_address = collections.Counter(p.address for p in self.pending.values())
        top = max(by_address.values())
        # ties: the address whose oldest stream is the oldest (the order they came)
        mine = [c for c, p in self.pending.items() if by_address[p.address] == top]
        address = self.pending[min(mine, key=lambda c: self.pending[c].opened)].address
        mine = [c for c in mine if self.pending[c].address == address]
        by_peer = collections.Counter(self.pending[c].peer for c in mine)
        top = max(by_peer.values())
        mine = [c for c in mine if by_peer[self.pending[c].peer] == top]
        silent = [c for c in mine if self.pending[c].key is None] or mine
        oldest = min(silent, key=lambda c: self.pending[c].opened)
        del self.pending[oldest]
        return oldest

    def hello(self, context, address: str, name: str) -> None:
        """``context`` said hello as ``name``: it has until ``auth_timeout_s`` after it
        opened to prove its token. A throttled (address, name) keeps one pending stream:
        an older one of the pair is cancelled."""
        key, older = (address, name), []
        with self.lock:
            entry = self.pending.get(context)
            if entry is None:
                return
            entry.key, entry.deadline = key, entry.opened + self.auth_timeout_s
            if self.throttled.get(key, 0.0) > time.monotonic():
                older = [c for c, p in self.pending.items() if p.key == key and c is not context]
                for ctx in older:
                    del self.pending[ctx]
        for ctx in older:
            self.audit("refused", address, f"throttled: a newer stream for {name[:60]!r}")
            ctx.cancel()

    def deadline(self, context) -> float:
        """When ``context`` must have authenticated (``time.monotonic``)."""
        with self.lock:
            entry = self.pending.get(context)
            return entry.deadline if entry is not None else time.monotonic()

    def proved(self, context) -> None:
        """``context``'s proof checked out: its end is no failed authentication."""
        with self.lock:
            entry = self.pending.get(context)
            if entry is not None:
                entry.proved = True

    def leave(self, context) -> None:
        """The stream authenticated, was refused or ended; a hello it never proved counts as
        a failed authentication of its (address, name)."""
        with self.lock:
            entry = self.pending.pop(context, None)
        if entry is not None and entry.key is not None and not entry.proved:
            self.failed(*entry.key)

    def failed(self, address: str, name: str) -> None:
        """Count a failed proof for (address, name); throttle the pair once over the cap."""
        now, key = time.monotonic(), (address, name)
        with self.lock:
            times = self.failures.setdefault(key, collections.deque())
            times.append(now)
            while times and times[0] < now - THROTTLE_WINDOW_S:
                times.popleft()
            over = self.auth_failures and len(times) >= self.auth_failures
            if over and self.throttled.get(key, 0.0) <= now:
                self.throttled[key] = now + THROTTLE_WINDOW_S
                times.clear()
            else:
                over = False
            if len(self.failures) > 4096:  # bounded memory under a flood of names
                self.failures = {k: v for k, v in self.failures.items() if v}
        if over:
            why = f"{self.auth_failures} failed authentications for {name[:60]!r}"
            self.audit("throttled", address, why)

    def stop(self) -> None:
        self.stopped.set()

    def _watch(self) -> None:
        """Cancel the streams past their deadline; write the audit log's summaries."""
        while not self.stopped.wait(0.2):
            now = time.monotonic()
            with self.lock:
                late = [(c, p) for c, p in self.pending.items() if p.deadline < now]
                for ctx, _ in late:
                    del self.pending[ctx]
                self.throttled = {k: t for k, t in self.throttled.items() if t > now}
            for ctx, entry in late:
                why = "no authentication in time" if entry.key else "no hello in time"
                self.audit("refused", peer_address(ctx), why)
                ctx.cancel()
                if entry.key is not None:  # a hello never proved
                    self.failed(*entry.key)
            self.audit.flush()
        self.audit.flush(force=True)


def peer_address(context) -> str:
    """The caller's IP address (``ipv4:1.2.3.4:5678`` → ``1.2.3.4``), for throttling."""
    peer = context.peer() or ""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rpartition(":")[0]
    return peer

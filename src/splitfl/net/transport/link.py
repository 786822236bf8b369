"""One device's link as the server (or a peer listener) holds it, and the keepalive rules
both ends share (:mod:`splitfl.net.transport.hub` accepts the links).

A :class:`DeviceLink` has one inbox per hosted client and an outgoing queue; closing it puts
:data:`LOST` in every inbox (waiting calls see the link as lost) and writes a line to the
audit log. Keepalive: the hub pings every link each ``keepalive_s`` and closes one silent for
:data:`SILENT_PERIODS` periods; the device redials when the server is silent as long.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field

import grpc

from splitfl.net.transport.guard import Audit
from splitfl.net.transport.inbox import Inbox
from splitfl.net.transport.wire import Message, encode

#: Placed in a client's inbox when its device's link closes.
LOST = Message("lost")
#: Keepalive periods without a message after which a link counts as lost (either end).
SILENT_PERIODS = 3
#: A link heard from within this many periods still answers (:func:`answers`).
LIVE_PERIODS = 2


@dataclass
class DeviceLink:
    """One connected device process: its clients, inboxes and outgoing queue."""

    name: str
    clients: list[int]
    inbox: dict[int, Inbox] = field(default_factory=dict)
    outbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    alive: bool = True
    #: the device has loaded its data and model (it said ``ready``): it can be given work
    ready: bool = False
    reason: str = ""
    #: where the device accepts device-to-device links (``host:port``) and the PEM
    #: certificate that listener presents ("" = plain text), as its hello announced
    peer_address: str = ""
    peer_cert: str = ""
    #: the caller's address and the audit log (a line when the link closes)
    address: str = ""
    audit: Audit | None = None
    #: when the device last sent anything (``time.monotonic``)
    heard: float = field(default_factory=time.monotonic)

    def send(self, message: Message) -> int:
        """Queue ``message`` for the device; its encoded size (0 if the link is closed)."""
        if not self.alive:
            return 0
        data = encode(message)
        self.outbox.put(data)
        return len(data)

    def reply(self, client: int, seq: int, wait_s: float):
        """The reply to command ``seq`` for ``client`` — (message, bytes, arrival time) — if
        it arrives within ``wait_s``; :data:`LOST` if the link closed first; None on time-out.
        Replies to earlier commands are skipped. A reply already in the inbox counts even
        when ``wait_s`` is spent: the server, busy elsewhere, came late to read it, and a
        device is late only when the server waits for it (issue 51: honest devices were
        benched as late because the server was)."""
        deadline = time.monotonic() + wait_s
        box = self.inbox[client]
        while True:
            left = deadline - time.monotonic()
            try:
                got = box.get(timeout=left) if left > 0 else box.get(block=False)
            except queue.Empty:
                return None
            if got is LOST or got[0].fields.get("seq") == seq:
                return got

    def close(self, reason: str) -> None:
        if self.alive:
            self.alive, self.reason = False, reason
            if self.audit is not None:
                self.audit("dropped", self.address, f"device={self.name} {reason}")
            self.outbox.put(None)
            for box in self.inbox.values():
                box.put(LOST)


def keep_alive(link: DeviceLink, period: float, judge: bool = True) -> None:
    """One keepalive tick of the hub for ``link``: closed when silent for more than
    :data:`SILENT_PERIODS` periods (never while it loads its data: not yet ready; never on
    a tick that is not to ``judge``: :func:`judges_silence`), else pinged."""
    silent = time.monotonic() - link.heard
    if judge and link.ready and silent > SILENT_PERIODS * period:
        link.close(f"silent for {silent:.0f} s (keepalive)")
    else:
        link.send(Message("ping"))


def judges_silence(woke: float, now: float, period: float) -> bool:
    """Whether a keepalive tick at ``now``, the last at ``woke``, may judge links silent: not
    when it wakes over a period late. Then the whole server process stood still (``SIGSTOP``,
    a paused VM, swap), its stream-reading threads with it, and what the devices sent in that
    time lies unread in its sockets: a 40 s freeze closed honest links as "silent for 40 s"
    before they were read (benchmarks/bench_server_freeze.py, issue 51 item 3). The next
    tick judges as usual, after the reads. splitfl's choice: the papers model no server
    stalls."""
    return now - woke < 2 * period


def answers(link: DeviceLink, period: float) -> bool:
    """Whether ``link`` is open and was heard from within :data:`LIVE_PERIODS` keepalive
    periods (its name is then refused to another stream); never without keepalive."""
    silent = time.monotonic() - link.heard
    return link.alive and period > 0 and silent <= LIVE_PERIODS * period


def keepalive_options(keepalive_s: float) -> list[tuple[str, int]]:
    """gRPC channel arguments for keepalive pings every ``keepalive_s`` seconds, the link
    declared dead when one is not answered within another ``keepalive_s`` (both ends: a
    silent partition ends the stream instead of hanging it); [] for 0."""
    if keepalive_s <= 0:
        return []
    ms = max(int(keepalive_s * 1000), 1000)
    return [
        ("grpc.keepalive_time_ms", ms),
        ("grpc.keepalive_timeout_ms", ms),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
    ]


def stop_grpc_server(server: grpc.Server, grace_s: float, timeout_s: float) -> None:
    """Stop ``server`` and join the thread gRPC starts to cancel calls after the grace period.

    ``grpc.Server.stop(grace)`` returns an event set by the serving loop, while its own
    ``cancel_all_calls_after_grace`` thread may still be running: joining it keeps the
    promise of :meth:`splitfl.net.transport.hub.Hub.stop` that no thread it caused runs on."""
    before = set(threading.enumerate())
    deadline = time.monotonic() + timeout_s
    server.stop(grace=grace_s).wait(timeout_s)
    for thread in set(threading.enumerate()) - before:
        # is_alive(): False for a thread not (or no longer) running, which join() may refuse
        if thread.name.endswith("(cancel_all_calls_after_grace)") and thread.is_alive():
            thread.join(max(deadline - time.monotonic(), 0.0))

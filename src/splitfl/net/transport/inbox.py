"""Bounded inboxes: what a device may queue on the server without being asked, and the
loop that reads a device's stream into them (:func:`route_replies`).

The server awaits each reply before its next command to a client, so an honest device has one
reply in a client's inbox at a time (a reply to an earlier command, skipped by
``DeviceLink.reply``, at most one more). :func:`deliver` puts a reply in the inbox only while it
holds fewer than :data:`INBOX_MAX` messages and :data:`INBOX_BYTES` bytes (an empty inbox takes
any message up to ``network.max_message_mb``: the reply being awaited); beyond, the reply is
dropped and logged — to the link's audit log where it has one, else one line on stderr — on
the first drop and every 100th. A device flooding its clients' inboxes only delays its own
replies (their clients time out and are dropped for the round).
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Callable, Iterator

import grpc

from splitfl.net.transport.wire import Message, Reassembler, WireError, decode

#: Most messages, and bytes, one client's inbox holds.
INBOX_MAX = 16
INBOX_BYTES = 64 << 20


class Inbox:
    """One client's inbox: a C queue (no Python-level lock on the per-batch path) and the
    number and bytes of the replies it holds (:func:`deliver`'s bound). Items are replies —
    (message, bytes, arrival time) — or markers such as ``LOST``."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self.held, self.held_bytes = 0, 0

    def offer(self, message: Message, nbytes: int) -> bool:
        """Queue a reply if it fits (see the module docstring); whether it was queued."""
        with self._lock:
            full = self.held >= INBOX_MAX or self.held_bytes + nbytes > INBOX_BYTES
            if self.held and full:
                return False
            self.held, self.held_bytes = self.held + 1, self.held_bytes + nbytes
        self._queue.put((message, nbytes, time.perf_counter()))
        return True

    def put(self, item) -> None:
        """Queue a marker (it is not counted against the bound)."""
        self._queue.put(item)

    def get(self, block: bool = True, timeout: float | None = None):
        """The next item (``queue.Empty`` when none comes within ``timeout``)."""
        item = self._queue.get(block, timeout)
        if type(item) is tuple:
            with self._lock:
                self.held, self.held_bytes = self.held - 1, self.held_bytes - item[1]
        return item

    def qsize(self) -> int:
        return self._queue.qsize()


def deliver(link, client: int, message: Message, nbytes: int) -> bool:
    """Queue ``message`` (``nbytes`` on the wire) in ``link.inbox[client]`` if it fits (see the
    module docstring); whether it was queued (a dropped reply is logged)."""
    if link.inbox[client].offer(message, nbytes):
        return True
    _log_drop(link, client)
    return False


def _log_drop(link, client: int) -> None:
    dropped = getattr(link, "dropped_replies", 0) + 1
    link.dropped_replies = dropped
    if dropped % 100 != 1:
        return
    line = (
        f"device={link.name} client={client} dropped {dropped} replies nobody awaited "
        f"(inbox full: {INBOX_MAX} messages / {INBOX_BYTES} bytes)"
    )
    audit = getattr(link, "audit", None)
    if audit is not None:
        audit("dropped-reply", getattr(link, "address", ""), line)
    else:
        print(f"splitfl hub: {line}", file=sys.stderr)


def route_replies(
    link, requests: Iterator[bytes], assembler: Reassembler, rate_limit: float, on_ready: Callable
) -> None:
    """Read the device's messages until its stream ends and close its link then: each reply
    to its client's inbox (:func:`deliver`; a device speaks only for its own clients), pongs
    noted, the first ``ready``/``refuse`` to ``on_ready(link, message)`` (False: refused, stop
    reading). More than ``rate_limit`` messages in a second (0: no limit), a malformed message
    or a reply for a foreign client closes the link as a protocol violation."""
    window, count = time.monotonic(), 0
    try:
        for chunk in requests:
            link.heard = time.monotonic()
            data = assembler.feed(chunk)
            if data is None:
                continue
            count += 1
            if time.monotonic() - window >= 1.0:
                window, count = time.monotonic(), 1
            if rate_limit and count > rate_limit:
                raise WireError(f"more than {rate_limit:g} messages per second")
            message = decode(data)
            if message.type == "pong":
                continue
            if message.type in ("ready", "refuse") and not link.ready:
                if not on_ready(link, message):
                    return
                continue
            client = message.fields.get("client")
            if not isinstance(client, int) or client not in link.inbox:
                raise WireError(f"reply for client {str(client)[:40]} not hosted by {link.name}")
            deliver(link, client, message, len(data))
        link.close("device closed the stream")
    except WireError as err:
        link.close(f"protocol violation: {err}")
    except grpc.RpcError:
        link.close("connection lost")

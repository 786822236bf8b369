"""Connections a TLS listener accepted that never opened a stream: failed TLS handshakes,
port probes, idle connections — counted, since grpc names none of them.

grpc's Python API (1.85) creates no call for a connection whose TLS handshake fails, and its
one hook near the handshake, ``grpc.dynamic_ssl_server_credentials``' certificate fetcher,
runs once for every new connection *before* its handshake and is told neither the peer nor
the outcome. So a failed handshake cannot be written down with its address (issue 51 item
6: "TLS handshake failures leave no audit line"); what can be counted is the difference
between the connections the fetcher saw and those that opened a stream (each stream's
``context.peer()``, address and port, names its connection). :class:`ConnectionTally` does
that and writes one ``tls`` audit line per interval in which the difference grew, e.g.
``tls peer=? 3 connections in the last 10 s opened no stream (...)``.

A connection counts as streamless only once it has stayed so across two consecutive looks
(the hub looks each ``network.keepalive_s`` and when it stops): a device opens its stream at
once after its handshake, so one look may fall between the two. Those seen at the last look
only are not counted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc

__all__ = ["ConnectionTally", "counted_tls_credentials"]


class ConnectionTally:
    """Connections seen before their TLS handshake (:meth:`opened`) against those that opened
    a stream (:meth:`streamed`, by their peer string); :meth:`report` audits the growth of the
    difference. Thread-safe: the fetcher runs on grpc's threads, streams on the hub's."""

    #: Peer strings remembered (distinct connections with a stream); beyond, they are counted
    #: without remembering (a long run of redials must not grow memory without bound).
    MAX_PEERS = 4096

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.connections = 0  # seen by the credentials' fetcher
        self.with_stream = 0  # distinct peers that opened a stream
        self.peers: set[str] = set()
        self.previous = 0  # the difference at the last look (none before the first)
        self.reported = 0  # streamless connections already written down
        self.since = time.monotonic()

    def opened(self) -> None:
        """A new connection, before its TLS handshake (the credentials' fetcher)."""
        with self.lock:
            self.connections += 1

    def streamed(self, peer: str) -> None:
        """A stream of the connection ``peer`` (``context.peer()``) began."""
        with self.lock:
            if peer in self.peers:
                return
            if len(self.peers) >= self.MAX_PEERS:
                self.peers.clear()  # forget the oldest batch; a later stream of theirs recounts
            self.peers.add(peer)
            self.with_stream += 1

    def report(self, audit: Callable[[str, str, str], None]) -> int:
        """Write one ``tls`` line if connections without a stream grew since the last report
        (streamless at this look and the previous one); returns how many were new."""
        with self.lock:
            now = max(self.connections - self.with_stream, 0)
            confirmed = min(now, self.previous)
            self.previous = now
            new = confirmed - self.reported
            if new <= 0:
                return 0
            self.reported = confirmed
            seconds, self.since = time.monotonic() - self.since, time.monotonic()
        audit(
            "tls",
            "?",
            f"{new} connection{'s' if new != 1 else ''} in the last {seconds:.0f} s opened no "
            "stream (a failed TLS handshake, a port probe or an idle connection; grpc names "
            "no peer of these)",
        )
        return new


def counted_tls_credentials(
    key_pem: bytes, cert_pem: bytes, tally: ConnectionTally
) -> grpc.ServerCredentials:
    """TLS server credentials whose certificate fetcher tells ``tally`` of each connection
    before its handshake (and keeps the certificate: it returns None)."""

    def fetch() -> None:
        tally.opened()
        return None

    config = grpc.ssl_server_certificate_configuration([(key_pem, cert_pem)])
    return grpc.dynamic_ssl_server_credentials(config, fetch)

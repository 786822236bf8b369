"""Device-to-device links (RingSFL's ring, ParallelSFL's clusters).

Every device process also *listens* (:class:`PeerEndpoint`: the same
:class:`~splitfl.net.transport.hub.Hub` the server runs, so the same token, protocol-version, size,
rate and pre-authentication rules apply, with a small thread pool: :data:`PEER_LINKS` links)
and announces the address — and, when it reaches the server over TLS, the self-signed
certificate its listener presents — in its hello. Each round the server tells a
device whom to expect (name → token hash) and tells its peers where to connect with which
one-round token, over their already-authenticated links to the server; a connecting peer pins
the relayed certificate. :class:`PeerChannel` is the connecting end of one such link.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import grpc

from splitfl.net.transport.auth import TokenBook, is_loopback
from splitfl.net.transport.certs import self_signed_pem
from splitfl.net.transport.guard import Audit
from splitfl.net.transport.handshake import answer
from splitfl.net.transport.hub import LOST, METHOD, Hub, HubSettings, keepalive_options
from splitfl.net.transport.wire import (
    PROTOCOL_VERSION,
    Message,
    Reassembler,
    chunks,
    decode,
    encode,
)

#: Links a peer listener holds at once (ParallelSFL's top worker serves its cluster's bottom
#: workers, who may all dial before the server told it to expect them; a ring member one
#: predecessor), and unauthenticated streams it tolerates.
PEER_LINKS, PEER_PENDING = 64, 64


def outgoing(outbox: queue.SimpleQueue, chunking: dict) -> Iterator[bytes]:
    """The request stream of a connecting end: encoded messages from ``outbox`` in chunks of
    ``chunking["bytes"]`` until None."""
    while True:
        data = outbox.get()
        if data is None:
            return
        yield from chunks(data, chunking["bytes"])


@dataclass
class PeerEndpoint:
    """A device process's listener for its peers."""

    hub: Hub
    address: str
    cert_pem: str = ""

    @classmethod
    def start(
        cls,
        listen: str,
        advertise: str | None,
        tls: bool,
        max_message_bytes: int,
        wait_s: float,
        audit: Audit | None = None,
    ) -> PeerEndpoint:
        """Listen on ``listen`` (``host:0`` picks a port); ``advertise`` is the address peers
        should dial (default: the listen host). With ``tls`` the listener presents a fresh
        self-signed certificate (needs the ``net`` extra) — to any caller, as TLS does: it
        holds only a public key; what admits a peer is its one-round token."""
        host = listen.rpartition(":")[0]
        if advertise is None and host in ("0.0.0.0", "[::]", ""):
            raise ValueError(f"--peer-listen {listen}: give --peer-address (what peers dial)")
        settings = HubSettings(
            max_message_bytes,
            1 << 20,
            admit_wait_s=wait_s,
            auth_timeout_s=wait_s + 5.0,
            max_pending=PEER_PENDING,
            max_links=PEER_LINKS,
            keepalive_s=0.0,  # one-round links with their own time-outs; no pings
        )
        hub = Hub(settings, TokenBook(), 1 << 31, {"config": {}, "block": 1}, audit)
        cert = key = ""
        credentials = None
        if tls:
            dial_host = (advertise or listen).rpartition(":")[0]
            cert, key = self_signed_pem([dial_host])
            credentials = grpc.ssl_server_credentials([(key.encode(), cert.encode())])
        port = hub.start(listen, credentials)
        address = advertise or f"{host}:{port}"
        return cls(hub, address, cert)

    def announce(self) -> dict[str, str]:
        return {"address": self.address, "cert": self.cert_pem}

    def stop(self) -> None:
        self.hub.stop()


class PeerError(RuntimeError):
    """A device-to-device link could not be set up or broke (``transient``: the listener
    was full or unreachable, worth another try)."""

    def __init__(self, why: str, transient: bool = False):
        super().__init__(why)
        self.transient = transient


#: Codes a dial is retried after: the listener was full (its unauthenticated slots under a
#: flood), unreachable for a moment, or cancelled the stream (evicted from a full slot).
TRANSIENT = {
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.CANCELLED,
}


def dial(
    address: str,
    name: str,
    token: str,
    client: int,
    cert_pem: str,
    limit: int,
    timeout_s: float,
    abort: threading.Event | None = None,
) -> PeerChannel:
    """A :class:`PeerChannel`, redialled with backoff after a transient refusal until
    ``timeout_s`` has passed (or ``abort`` is set); the last PeerError then."""
    deadline, delay = time.monotonic() + timeout_s, 0.1
    while True:
        left = deadline - time.monotonic()
        try:
            return PeerChannel(address, name, token, client, cert_pem, limit, max(left, 0.1))
        except PeerError as err:
            left = deadline - time.monotonic()
            if not err.transient or left <= delay or (abort is not None and abort.is_set()):
                raise
        time.sleep(delay)
        delay = min(delay * 2, 2.0)


class PeerChannel:
    """The connecting end of a device-to-device link: hello (name, the client it speaks for),
    the proof of its one-round token (:mod:`splitfl.net.transport.handshake`), then messages both
    ways. Replies land in ``inbox`` as ``(message, bytes, arrival time)``;
    :data:`~splitfl.net.transport.hub.LOST` when the link ends."""

    def __init__(
        self,
        address: str,
        name: str,
        token: str,
        client: int,
        cert_pem: str,
        max_message_bytes: int,
        timeout_s: float,
    ):
        limit = max_message_bytes + 1024
        options = [("grpc.max_receive_message_length", limit)]
        options.append(("grpc.max_send_message_length", limit))
        options += keepalive_options(10.0)
        if cert_pem:
            creds = grpc.ssl_channel_credentials(root_certificates=cert_pem.encode())
            self.channel = grpc.secure_channel(address, creds, options=options)
        elif is_loopback(address.rpartition(":")[0]):
            self.channel = grpc.insecure_channel(address, options=options)
        else:
            raise PeerError(f"peer {address} is not on loopback and presents no certificate")
        self.max_message_bytes = max_message_bytes
        self.outbox: queue.Queue = queue.Queue()
        self.inbox: queue.Queue = queue.Queue()
        self.chunking = {"bytes": 1 << 16}
        self.welcomed = threading.Event()
        self.settled = threading.Event()  # welcomed, or the link ended before that
        self.error, self.code = "", None
        self.token = token
        self.hello = {"protocol": PROTOCOL_VERSION, "name": name, "clients": [client]}
        self.outbox.put(encode(Message("hello", self.hello)))
        self.stream = self.channel.stream_stream(METHOD)(outgoing(self.outbox, self.chunking))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        self.settled.wait(timeout_s)
        if not self.welcomed.is_set():
            self.close()
            why = f"peer {address}: {self.error or 'no welcome within the timeout'}"
            raise PeerError(why, self.code in TRANSIENT)

    def send(self, message: Message) -> int:
        data = encode(message)
        self.outbox.put(data)
        return len(data)

    def _read(self) -> None:
        assembler = Reassembler(self.max_message_bytes)
        try:
            for chunk in self.stream:
                data = assembler.feed(chunk)
                if data is None:
                    continue
                msg = decode(data)
                if msg.type == "challenge" and not self.welcomed.is_set():
                    self.outbox.put(encode(answer(self.token, self.hello, msg)))
                elif msg.type == "welcome" and not self.welcomed.is_set():
                    self.chunking["bytes"] = int(msg.fields.get("chunk_bytes") or (1 << 16))
                    self.outbox.put(encode(Message("ready")))
                    self.welcomed.set()
                    self.settled.set()
                elif msg.type == "bye":
                    break
                else:
                    self.inbox.put((msg, len(data), time.perf_counter()))
        except grpc.RpcError as err:
            self.code, self.error = err.code(), f"{err.code().name} {err.details()}"
        except Exception as err:  # noqa: BLE001 (a malformed message ends the link)
            self.error = str(err)
        finally:
            self.settled.set()
            self.inbox.put(LOST)

    def close(self) -> None:
        """End the link after what was queued has gone (the peer closes its side in turn)."""
        self.outbox.put(None)
        self.reader.join(timeout=2.0)
        self.stream.cancel()
        self.channel.close()

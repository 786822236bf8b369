"""The server's end of the network: a gRPC service that device processes connect to.

Each device process opens one bidirectional stream (``/splitfl.Hub/Connect``, raw bytes: the
chunks of :mod:`splitfl.net.wire`) and says ``hello`` (protocol version, name, token, the
clients it asks to host). The hub checks the token against the stored hashes, refuses a
different protocol version or a name already connected, assigns clients and answers
``welcome`` with the run's config. From then on the server sends commands on the stream and
routes each reply to the inbox of the client it names — a device may only speak for its own
clients. A broken stream, a malformed or oversized message, a reply for a foreign client or a
burst over the rate limit closes the device's link; waiting calls see the link as lost.
"""

from __future__ import annotations

import queue
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from splitfl.net.announce import Announced, AnnouncementError, check_announcement
from splitfl.net.auth import TokenBook
from splitfl.net.wire import (
    PROTOCOL_VERSION,
    Message,
    Reassembler,
    WireError,
    chunks,
    decode,
    encode,
)

SERVICE = "splitfl.Hub"
METHOD = f"/{SERVICE}/Connect"
#: Placed in a client's inbox when its device's link closes.
LOST = Message("lost")


@dataclass(frozen=True)
class HubSettings:
    """Limits of the hub (from the config's ``network`` section)."""

    max_message_bytes: int
    chunk_bytes: int
    rate_limit: float = 0.0
    hello_timeout_s: float = 30.0
    #: How long a hello from a name not (yet) in the token book waits for it to be added
    #: (a device's peer listener learns whom to expect from the server, possibly after the
    #: peer's hello arrived); 0 = refuse at once (the server's hub).
    admit_wait_s: float = 0.0


@dataclass
class DeviceLink:
    """One connected device process: its clients, inboxes and outgoing queue."""

    name: str
    clients: list[int]
    #: SimpleQueue (C-implemented): one lock hand-off per message, not a Python Condition's
    inbox: dict[int, queue.SimpleQueue] = field(default_factory=dict)
    outbox: queue.SimpleQueue = field(default_factory=queue.SimpleQueue)
    alive: bool = True
    #: the device has loaded its data and model (it said ``ready``): it can be given work
    ready: bool = False
    reason: str = ""
    #: where the device accepts device-to-device links (``host:port``) and the PEM
    #: certificate that listener presents ("" = plain text), as its hello announced
    peer_address: str = ""
    peer_cert: str = ""

    def send(self, message: Message) -> int:
        """Queue ``message`` for the device; its encoded size (0 if the link is closed)."""
        if not self.alive:
            return 0
        data = encode(message)
        self.outbox.put(data)
        return len(data)

    def reply(self, client: int, seq: int, wait_s: float):
        """The reply to command ``seq`` for ``client`` — (message, bytes, arrival time) — if
        it comes within ``wait_s``; :data:`LOST` if the link closed first; None on time-out.
        Replies to earlier commands are skipped."""
        deadline = time.monotonic() + wait_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                got = self.inbox[client].get(timeout=left)
            except queue.Empty:
                return None
            if got is LOST or got[0].fields.get("seq") == seq:
                return got
        return None

    def close(self, reason: str) -> None:
        if self.alive:
            self.alive, self.reason = False, reason
            self.outbox.put(None)
            for box in self.inbox.values():
                box.put(LOST)


class Hub:
    """Accepts device sessions and keeps the links of the connected ones."""

    def __init__(self, settings: HubSettings, tokens: TokenBook, num_clients: int, welcome: dict):
        self.settings, self.tokens, self.num_clients = settings, tokens, num_clients
        self.welcome = welcome
        #: the model's input shape and class count and whether devices bring their own data
        #: (``data.source: devices``); None on a device's peer listener (no checks)
        self.data_spec: dict | None = welcome.get("data")
        #: client → what its device announced at its first join (``data.source: devices``)
        self.announced: dict[int, Announced] = {}
        self.log = lambda line: print(line, file=sys.stderr, flush=True)
        self.links: dict[str, DeviceLink] = {}
        self.lock = threading.Condition()
        self.server: grpc.Server | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, address: str, credentials: grpc.ServerCredentials | None) -> int:
        """Listen on ``address`` (``host:port``; port 0 picks one); returns the port."""
        limit = self.settings.chunk_bytes + 1024
        options = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
        ]
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=256), options=options)
        handler = grpc.method_handlers_generic_handler(
            SERVICE, {"Connect": grpc.stream_stream_rpc_method_handler(self._connect)}
        )
        server.add_generic_rpc_handlers((handler,))
        if credentials is None:
            port = server.add_insecure_port(address)
        else:
            port = server.add_secure_port(address, credentials)
        if port == 0:
            raise OSError(f"cannot listen on {address}")
        server.start()
        self.server = server
        return port

    def stop(self) -> None:
        with self.lock:
            links = list(self.links.values())
        for link in links:
            link.send(Message("bye", {"reason": "server stopping"}))
            link.close("server stopping")
        if self.server is not None:
            self.server.stop(grace=1.0).wait(5.0)
            self.server = None

    def wait_for(self, devices: int, timeout_s: float) -> None:
        """Block until ``devices`` device processes are connected (TimeoutError after
        ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while len(self.live()) < devices:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"{len(self.live())} of {devices} devices connected after {timeout_s:g} s"
                    )
                self.lock.wait(min(left, 1.0))

    def live(self) -> list[DeviceLink]:
        """Connected devices that are ready for work."""
        return [link for link in self.links.values() if link.alive and link.ready]

    def expect(self, names: dict[str, str]) -> None:
        """Admit these device names (name → token hash) from now on (peer listeners: the
        server says whom to expect each round); dead links are forgotten."""
        with self.lock:
            self.tokens.hashes.update(names)
            self.links = {k: v for k, v in self.links.items() if v.alive}
            self.lock.notify_all()

    def forget(self, names) -> None:
        """Close these names' links and refuse them from now on."""
        with self.lock:
            for name in names:
                self.tokens.hashes.pop(name, None)
                link = self.links.pop(name, None)
                if link is not None:
                    link.send(Message("bye", {"reason": "round over"}))
                    link.close("round over")

    def wait_clients(self, clients, timeout_s: float, abort=None) -> set[int]:
        """Block until every client in ``clients`` has a ready link, ``timeout_s`` passed or
        ``abort`` (an Event) is set; the clients connected by then."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while True:
                ready = {c for c in clients if self._linked(c)}
                left = deadline - time.monotonic()
                if len(ready) == len(set(clients)) or left <= 0 or (abort and abort.is_set()):
                    return ready
                self.lock.wait(min(left, 0.2))

    def wait_announced(self, timeout_s: float) -> list[int]:
        """Block until every client's data has been announced (``data.source: devices``) or
        ``timeout_s`` passed; the clients still missing."""
        deadline = time.monotonic() + timeout_s
        with self.lock:
            while True:
                missing = [c for c in range(self.num_clients) if c not in self.announced]
                left = deadline - time.monotonic()
                if not missing or left <= 0:
                    return missing
                self.lock.wait(min(left, 0.2))

    def _linked(self, client: int) -> bool:
        return any(k.alive and k.ready and client in k.clients for k in self.links.values())

    def link_of(self, client: int) -> DeviceLink | None:
        """The live link hosting ``client``, if any."""
        with self.lock:
            for link in self.links.values():
                if link.alive and link.ready and client in link.clients:
                    return link
        return None

    # -- one device session -------------------------------------------------------------------
    def _connect(self, requests: Iterator[bytes], context) -> Iterator[bytes]:
        assembler = Reassembler(self.settings.max_message_bytes)
        timer = threading.Timer(self.settings.hello_timeout_s, context.cancel)
        timer.start()  # a peer that never says hello does not hold a worker thread
        try:
            hello = _first_message(requests, assembler)
        except WireError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad hello: {err}")
        finally:
            timer.cancel()
        link = self._admit(hello, context)
        reader = threading.Thread(target=self._read, args=(link, requests, assembler), daemon=True)
        reader.start()
        context.add_callback(lambda: link.close("stream closed"))
        yield from chunks(
            encode(Message("welcome", self._welcome(link))), self.settings.chunk_bytes
        )
        while True:
            data = link.outbox.get()
            if data is None:
                return
            yield from chunks(data, self.settings.chunk_bytes)

    def _admit(self, hello: Message, context) -> DeviceLink:
        """Check a hello and register the device (aborts the RPC with a reason if refused)."""
        f = hello.fields
        if hello.type != "hello" or f.get("protocol") != PROTOCOL_VERSION:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"protocol version {f.get('protocol')!r} not supported; this server speaks "
                f"{PROTOCOL_VERSION} (install the same splitfl version on the device)",
            )
        name = f.get("name")
        if not isinstance(name, str) or not self._known(name, f.get("token")):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "unknown device name or wrong token")
        peer = f.get("peer") or {}
        address, cert = peer.get("address", ""), peer.get("cert", "")
        if not isinstance(address, str) or not isinstance(cert, str) or len(address) > 300:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad peer listener in hello")
        with self.lock:
            if name in self.links and self.links[name].alive:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"device {name!r} already connected")
            clients = self._assign(f.get("clients"), context)
            link = DeviceLink(name, clients, {c: queue.SimpleQueue() for c in clients})
            link.peer_address, link.peer_cert = address, cert
            self.links[name] = link
            self.lock.notify_all()
        return link

    def _known(self, name: str, token) -> bool:
        """The token checks out; a name not in the book yet is waited for up to
        ``admit_wait_s`` (a wrong token for a known name is refused at once)."""
        deadline = time.monotonic() + self.settings.admit_wait_s
        with self.lock:
            while name not in self.tokens.hashes and time.monotonic() < deadline:
                self.lock.wait(min(deadline - time.monotonic(), 0.2))
            return self.tokens.check(name, token)

    def _assign(self, asked, context) -> list[int]:
        """The clients a device asked for (each unhosted), else the next free block."""
        hosted = {c for link in self.links.values() if link.alive for c in link.clients}
        if asked:
            ok = isinstance(asked, list) and all(isinstance(c, int) for c in asked)
            if not ok or any(not 0 <= c < self.num_clients for c in asked):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"bad client ids {asked!r}")
            taken = sorted(set(asked) & hosted)
            if taken:
                context.abort(grpc.StatusCode.ALREADY_EXISTS, f"clients {taken} already hosted")
            return sorted(set(asked))
        free = [c for c in range(self.num_clients) if c not in hosted]
        if not free:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "every client is already hosted")
        return free[: int(self.welcome.get("block", 1))]

    def _welcome(self, link: DeviceLink) -> dict:
        return {
            "protocol": PROTOCOL_VERSION,
            "clients": link.clients,
            "config": self.welcome["config"],
            "chunk_bytes": self.settings.chunk_bytes,
            **({"data": self.data_spec} if self.data_spec is not None else {}),
        }

    def _read(self, link: DeviceLink, requests, assembler: Reassembler) -> None:
        """Route the device's replies to its clients' inboxes until the stream ends."""
        window, count = time.monotonic(), 0
        try:
            for chunk in requests:
                data = assembler.feed(chunk)
                if data is None:
                    continue
                count += 1
                if time.monotonic() - window >= 1.0:
                    window, count = time.monotonic(), 1
                limit = self.settings.rate_limit
                if limit and count > limit:
                    raise WireError(f"more than {limit:g} messages per second")
                message = decode(data)
                if message.type in ("ready", "refuse") and not link.ready:
                    refusal = self._check_data(link, message)
                    if refusal is not None:
                        self.log(f"splitfl server: device {link.name} refused: {refusal}")
                        link.send(Message("bye", {"refused": refusal}))
                        link.close(f"refused: {refusal}")
                        return
                    with self.lock:
                        link.ready = True
                        self.lock.notify_all()
                    continue
                client = message.fields.get("client")
                if client not in link.inbox:
                    raise WireError(f"reply for client {client!r} not hosted by {link.name}")
                link.inbox[client].put((message, len(data), time.perf_counter()))
            link.close("device closed the stream")
        except WireError as err:
            link.close(f"protocol violation: {err}")
        except grpc.RpcError:
            link.close("connection lost")
        finally:
            with self.lock:
                self.lock.notify_all()

    def _check_data(self, link: DeviceLink, ready: Message) -> str | None:
        """Why a device's ``ready`` is refused (its data announcement, or the device's own
        ``refuse`` of a data mismatch), or None; keeps a valid announcement (the first
        announcement of a client stands; a later one must repeat its sample count)."""
        spec, data = self.data_spec, ready.fields.get("data")
        if ready.type == "refuse":
            return str(ready.fields.get("reason"))[:300]
        if spec is None or (not spec.get("own") and data is None):
            return None
        if not spec.get("own"):
            return (
                "this server partitions its own dataset (data.source: partition); start the "
                "device without --data"
            )
        try:
            got = check_announcement(data, link.name, link.clients, spec)
        except AnnouncementError as err:
            return f"data announcement: {err}"
        with self.lock:
            for c, a in got.items():
                first = self.announced.get(c, a)
                if first.samples != a.samples:
                    return f"client {c}: {a.samples} samples, {first.samples} at its first join"
            for c, a in got.items():
                self.announced.setdefault(c, a)
            self.lock.notify_all()
        return None


def _first_message(requests: Iterator[bytes], assembler: Reassembler) -> Message:
    for chunk in requests:
        data = assembler.feed(chunk)
        if data is not None:
            return decode(data)
    raise WireError("stream closed before hello")

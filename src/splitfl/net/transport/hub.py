"""The server's end of the network: a gRPC service that device processes connect to.

Each device process opens one bidirectional stream (``/splitfl.Hub/Connect``, raw bytes: the
chunks of :mod:`splitfl.net.transport.wire`) as :mod:`splitfl.net.transport.handshake` says: hello
(protocol, name, clients asked for; no token), the hub's challenge, the device's proof of its token.
Until then the :class:`~splitfl.net.transport.guard.Gate` bounds what the caller may hold. The hub
checks the version and the proof, assigns clients (only those bound to the token, if any)
and answers ``welcome`` with what the device needs of the run's config. A name whose link
still answers keepalives is refused to a second stream; a silent (half-open) link is
replaced. Keepalive: the hub pings every link each ``keepalive_s``, the device answers at
once; a link silent for :data:`SILENT_PERIODS` periods is closed (both ends: the device
redials), so a partition ends in a reconnect, never a hang. Then the server sends commands
and routes each reply to the inbox of the client it names — a device speaks only for its
own clients. A broken stream, a malformed or oversized message, a reply for a foreign
client or a burst over the rate limit closes the link; waiting calls see it as lost.

One concept, a link's life on the server's end (admit, assign, keep alive, route, close),
and over 400 lines for it: splitting admission from routing would put one link's state in
two modules that each need all of it.

One concept over ~430 lines: the hub's life cycle, its stream handler and the links it keeps
share one lock and one set of threads; the pre-authentication gate, the audit and the TLS
connection count live in their own modules (``guard.py``, ``audit.py``, ``connections.py``).
"""

from __future__ import annotations

import math
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass

import grpc

from splitfl.net.transport.announce import Announced, keep_announced, ready_problem
from splitfl.net.transport.assign import AssignRefused, assign_clients
from splitfl.net.transport.auth import TokenBook, new_nonce
from splitfl.net.transport.connections import ConnectionTally
from splitfl.net.transport.guard import Audit, Gate, peer_address
from splitfl.net.transport.handshake import (
    CONNECTED_ALREADY,
    challenge,
    hello_problem,
    read_message,
)
from splitfl.net.transport.inbox import Inbox, route_replies
from splitfl.net.transport.link import (
    LOST,
    SILENT_PERIODS,
    DeviceLink,
    answers,
    judges_silence,
    keep_alive,
    keepalive_options,
    stop_grpc_server,
)
from splitfl.net.transport.wire import (
    PROTOCOL_VERSION,
    Message,
    Reassembler,
    WireError,
    chunks,
    encode,
)

#: (``LOST``, ``DeviceLink``, keepalive: from :mod:`splitfl.net.transport.link`, re-exported)
__all__ = ["LOST", "METHOD", "SILENT_PERIODS", "DeviceLink", "Hub", "HubSettings"]
__all__ += ["keepalive_options"]

SERVICE = "splitfl.Hub"
METHOD = f"/{SERVICE}/Connect"


@dataclass(frozen=True)
class HubSettings:
    """Limits of the hub (from the config's ``network`` section)."""

    max_message_bytes: int
    chunk_bytes: int
    rate_limit: float = 0.0
    #: a stream must authenticate within this (its hello read and checked)
    auth_timeout_s: float = 10.0
    max_hello_bytes: int = 64 << 10
    #: unauthenticated streams held at once; more are refused at once
    max_pending: int = 16
    #: connected devices at once (with ``max_pending``, this bounds the worker threads)
    max_links: int = 64
    #: failed authentications per address and minute before it is refused for a minute
    auth_failures: int = 10
    #: seconds between gRPC keepalive pings (and to wait for their answer); 0 = none
    keepalive_s: float = 10.0
    #: How long a hello from a name not (yet) in the token book waits for it to be added
    #: (a device's peer listener learns whom to expect from the server, possibly after the
    #: peer's hello arrived); 0 = refuse at once (the server's hub).
    admit_wait_s: float = 0.0


class Hub:
    """Accepts device sessions and keeps the links of the connected ones."""

    def __init__(
        self,
        settings: HubSettings,
        tokens: TokenBook,
        num_clients: int,
        welcome: dict,
        audit: Audit | None = None,
        connections: ConnectionTally | None = None,
    ):
        """``connections``: the tally the TLS credentials' fetcher counts into
        (:func:`~splitfl.net.transport.auth.server_credentials`); its streamless connections
        are audited each ``keepalive_s`` and at :meth:`stop`."""
        self.settings, self.tokens, self.num_clients = settings, tokens, num_clients
        self.connections = connections or ConnectionTally()
        self.welcome = welcome
        #: the model's input shape and class count and whether devices bring their own data
        #: (``data.source: devices``); None on a device's peer listener (no checks)
        self.data_spec: dict | None = welcome.get("data")
        #: client → what its device announced at its first join (``data.source: devices``)
        self.announced: dict[int, Announced] = {}
        self.log = lambda line: print(line, file=sys.stderr, flush=True)
        self.links: dict[str, DeviceLink] = {}
        self.seen: set[str] = set()  # names that connected before (a new link: "reconnected")
        self.lock = threading.Condition()
        self.server: grpc.Server | None = None
        self.threads: list[threading.Thread] = []  # readers, heartbeat: joined by stop()
        self.stopping = threading.Event()
        self.audit = audit or Audit()
        self.gate = Gate(
            settings.max_pending, settings.auth_timeout_s, settings.auth_failures, self.audit
        )

    # -- lifecycle -------------------------------------------------------------------------
    def start(self, address: str, credentials: grpc.ServerCredentials | None) -> int:
        """Listen on ``address`` (``host:port``; port 0 picks one); returns the port."""
        st = self.settings
        limit = st.chunk_bytes + 1024
        options = [
            ("grpc.max_receive_message_length", limit),
            ("grpc.max_send_message_length", limit),
            ("grpc.so_reuseport", 0),
            *keepalive_options(st.keepalive_s),
            # devices ping at their own --keepalive-s: accept pings up to once a second
            ("grpc.http2.min_recv_ping_interval_without_data_ms", 1000),
            ("grpc.http2.max_ping_strikes", 0),
        ]
        # each stream holds a worker for its life: links + unauthenticated ones + slack; a
        # call beyond that is refused at once (RESOURCE_EXHAUSTED), never queued
        workers = st.max_links + st.max_pending + 4
        pool = futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="splitfl-hub")
        server = grpc.server(pool, options=options, maximum_concurrent_rpcs=workers)
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
        if st.keepalive_s > 0:
            self._spawn(self._heartbeat, (), "splitfl-ping")
        return port

    def stop(self) -> None:
        with self.lock:
            links = list(self.links.values())
        for link in links:
            link.send(Message("bye", {"reason": "server stopping"}))
            link.close("server stopping")
        if self.server is not None:
            stop_grpc_server(self.server, grace_s=1.0, timeout_s=5.0)
            self.server = None
        self.stopping.set()
        self.gate.stop()
        self.connections.report(self.audit)
        # no thread of ours may run on at exit: a daemon thread in a C++ frame (a torch op)
        # then aborts the process ("terminate called without an active exception")
        deadline = time.monotonic() + 5.0
        for thread in [*self.threads, self.gate.watchdog]:
            if thread is not threading.current_thread():
                thread.join(max(deadline - time.monotonic(), 0.0))

    def _spawn(self, target, args: tuple, name: str) -> None:
        """Start one of this hub's daemon threads (joined by :meth:`stop`)."""
        thread = threading.Thread(target=target, args=args, daemon=True, name=name)
        with self.lock:
            self.threads = [t for t in self.threads if t.is_alive()]
            self.threads.append(thread)
            thread.start()

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
                self.seen.discard(name)
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
        ``timeout_s`` passed (0: no limit); the clients still missing."""
        deadline = time.monotonic() + (timeout_s or math.inf)
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
        self.connections.streamed(context.peer())
        address = peer_address(context)
        refused = self.gate.enter(context, address)
        if refused:
            self._refuse(context, address, grpc.StatusCode.RESOURCE_EXHAUSTED, refused)
        try:
            hello = self._expect(requests, context, address)
            problem = hello_problem(hello)
            if problem is not None:
                code = "FAILED_PRECONDITION" if "protocol" in problem else "INVALID_ARGUMENT"
                self._refuse(context, address, getattr(grpc.StatusCode, code), problem)
            self.gate.hello(context, address, hello.fields["name"])
            nonce = new_nonce()
            yield from chunks(encode(challenge(nonce)), self.settings.chunk_bytes)
            link = self._admit(hello, self._expect(requests, context, address), nonce, context)
        finally:
            self.gate.leave(context)
        assembler = Reassembler(self.settings.max_message_bytes)
        self._spawn(self._read, (link, requests, assembler), f"splitfl-read-{link.name}")
        context.add_callback(lambda: link.close("stream closed"))
        yield from chunks(
            encode(Message("welcome", self._welcome(link))), self.settings.chunk_bytes
        )
        while True:
            data = link.outbox.get()
            if data is None:
                return
            yield from chunks(data, self.settings.chunk_bytes)

    def _expect(self, requests, context, address: str) -> Message:
        """The next message of an unauthenticated stream, read within the hello size limit
        (a malformed one, or the stream's end, refuses it: neither is a failed
        authentication)."""
        try:
            msg = read_message(requests, Reassembler(self.settings.max_hello_bytes))
        except WireError as err:
            self._refuse(context, address, grpc.StatusCode.INVALID_ARGUMENT, f"bad hello: {err}")
        if msg is None:
            self._refuse(context, address, grpc.StatusCode.CANCELLED, "closed before its hello")
        return msg

    def _refuse(self, context, address: str, code: grpc.StatusCode, reason: str) -> None:
        """Write the refusal to the audit log and abort the call (raises)."""
        self.audit("refused", address, f"{code.name} {reason}")
        context.abort(code, reason)

    def _admit(self, hello: Message, proof: Message, nonce: str, context) -> DeviceLink:
        """Check the device's proof and register it (aborts the RPC with a reason if
        refused). A name whose link still answers keepalives is refused; a silent one
        (half-open after a partition) is replaced, and told so."""
        f, address = hello.fields, peer_address(context)
        name = f["name"]
        if proof.type != "proof" or not self._known(name, nonce, f, proof, context):
            # counted as a failed authentication as the stream leaves the gate (a hello never
            # proved, :meth:`~splitfl.net.transport.guard.Gate.leave`)
            why = f"unknown device name or wrong token (name {name[:60]!r})"
            self._refuse(context, address, grpc.StatusCode.UNAUTHENTICATED, why)
        self.gate.proved(context)
        peer = f.get("peer") or {}
        with self.lock:
            old = self.links.get(name)
            if old is not None and answers(old, self.settings.keepalive_s):
                why = f"device {name[:60]!r} {CONNECTED_ALREADY} from {old.address} and "
                why += "answers keepalives (another process with its token?)"
                self._refuse(context, address, grpc.StatusCode.ALREADY_EXISTS, why)
            clients = self._assign(name, f.get("clients"), context, address)
            self.tokens.assigned(name, clients)
            link = DeviceLink(name, clients, {c: Inbox() for c in clients})
            link.peer_address, link.peer_cert = peer.get("address", ""), peer.get("cert", "")
            link.address, link.audit = address, self.audit
            if old is not None and old.alive:  # a silent link's device hears why it must stop
                old.send(Message("bye", {"refused": f"replaced by a connection from {address}"}))
                old.close(f"replaced by a new connection from {address} (silent link)")
            event = "reconnected" if name in self.seen else "joined"
            self.seen.add(name)
            self.links[name] = link
            self.lock.notify_all()
        self.audit(event, address, f"device={name} clients={clients}")
        return link

    def _known(self, name: str, nonce: str, hello: dict, proof: Message, context) -> bool:
        """The proof checks out; a name not in the book yet is waited for up to
        ``admit_wait_s`` (a wrong proof for a known name is refused at once), never past the
        stream's authentication deadline."""
        deadline = min(time.monotonic() + self.settings.admit_wait_s, self.gate.deadline(context))
        with self.lock:
            while name not in self.tokens.hashes and time.monotonic() < deadline:
                self.lock.wait(min(deadline - time.monotonic(), 0.2))
            return self.tokens.check(name, nonce, hello, proof.fields.get("proof"))

    def _assign(self, name: str, asked, context, address: str) -> list[int]:
        """The clients a device gets (:func:`~splitfl.net.transport.assign.assign_clients`, under
        the lock); a refusal is sent with its gRPC status."""
        if self.settings.max_links and len(self.live_names() - {name}) >= self.settings.max_links:
            why = f"{self.settings.max_links} devices connected already (network.max_devices)"
            self._refuse(context, address, grpc.StatusCode.RESOURCE_EXHAUSTED, why)
        hosted = {c for k in self.links.values() if k.alive and k.name != name for c in k.clients}
        block = int(self.welcome.get("block", 1))
        try:
            return assign_clients(name, asked, hosted, self.tokens, self.num_clients, block)
        except AssignRefused as err:
            self._refuse(context, address, getattr(grpc.StatusCode, err.code), err.why)
            raise

    def live_names(self) -> set[str]:
        """Names with an open link (ready or not)."""
        return {k.name for k in self.links.values() if k.alive}

    def _heartbeat(self) -> None:
        """Each ``keepalive_s``: ping every link; close those silent for too long."""
        period = self.settings.keepalive_s
        woke = time.monotonic()
        while not self.stopping.wait(period):
            now = time.monotonic()
            judge, woke = judges_silence(woke, now, period), now
            with self.lock:
                links = [k for k in self.links.values() if k.alive]
            for link in links:
                keep_alive(link, period, judge)
            self.connections.report(self.audit)
            with self.lock:
                self.lock.notify_all()

    def _welcome(self, link: DeviceLink) -> dict:
        """What the device needs: its clients, the chunk size and the run's config as the
        session prepared it (:func:`~splitfl.net.server.session.device_config`: no server paths)."""
        return {
            "protocol": PROTOCOL_VERSION,
            "clients": link.clients,
            "config": self.welcome["config"],
            "chunk_bytes": self.settings.chunk_bytes,
            **({"data": self.data_spec} if self.data_spec is not None else {}),
            "keepalive_s": self.settings.keepalive_s,
        }

    def _read(self, link: DeviceLink, requests, assembler: Reassembler) -> None:
        """Route the device's replies to its clients' inboxes until the stream ends."""
        try:
            route_replies(link, requests, assembler, self.settings.rate_limit, self._ready)
        finally:
            with self.lock:
                self.lock.notify_all()

    def _ready(self, link: DeviceLink, message: Message) -> bool:
        """The device's ``ready``/``refuse``: mark the link ready, or refuse the device (bye,
        closed) and say False."""
        refusal = self._check_data(link, message)
        if refusal is not None:
            self.log(f"splitfl server: device {link.name} refused: {refusal}")
            link.send(Message("bye", {"refused": refusal}))
            link.close(f"refused: {refusal}")
            return False
        with self.lock:
            link.ready = True
            self.lock.notify_all()
        return True

    def _check_data(self, link: DeviceLink, ready: Message) -> str | None:
        """Why a device's ``ready`` is refused
        (:func:`~splitfl.net.transport.announce.ready_problem`,
        :func:`~splitfl.net.transport.announce.keep_announced`), or None."""
        problem, got = ready_problem(ready.type, ready.fields, self.data_spec, link)
        if problem is not None or not got:
            return problem
        with self.lock:
            problem = keep_announced(self.announced, got)
            self.lock.notify_all()
        return problem

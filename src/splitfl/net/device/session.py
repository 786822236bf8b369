"""A device process's connections (``splitfl device``; the device's arithmetic is
:class:`~splitfl.net.device.agent.DeviceAgent`).

:func:`run_device` opens the device's peer listener
(:class:`~splitfl.net.transport.peer.PeerEndpoint`), connects to the server, says hello (with the
listener's address and certificate), builds the agent from the welcome's config and hands every
command to the hosted client's worker thread (:class:`ClientWorkers`); it reconnects with
exponential backoff when the link drops — keepalive pings (``--keepalive-s``) turn a silent
partition into a dropped link — and retries transient refusals (clients still held by its own stale
link or another device, a server at capacity or throttling) the same way; only a wrong token,
protocol or client set ends it. The same loop serves a link to a peer's listener (ParallelSFL's
bottom worker answering its top worker, :func:`join_cluster`). Device-to-device session commands
(``host``, ``join``, ``ring``) are :data:`SESSION_HANDLERS`.
"""

from __future__ import annotations

import os
import queue
import threading
import time

import grpc

from splitfl.config import ConfigError, ExperimentConfig, from_dict
from splitfl.core.allocator import keep_freed_memory
from splitfl.data.base import DatasetError
from splitfl.data.formats import ContainerOptions
from splitfl.data.local import LocalData, load_local
from splitfl.data.source import container_options
from splitfl.extensions import device_imports
from splitfl.net.device.agent import ClientData, DeviceAgent, DeviceOptions, Refused
from splitfl.net.device.clusters import host_cluster, ring_member
from splitfl.net.device.refusals import Duplicate, certificate_refused, tls_mismatch
from splitfl.net.device.workers import ClientWorkers, Contact, Outage, Silence
from splitfl.net.transport.announce import effective_epsilon
from splitfl.net.transport.guard import Audit
from splitfl.net.transport.handshake import answer
from splitfl.net.transport.hub import METHOD, SILENT_PERIODS, keepalive_options
from splitfl.net.transport.peer import PeerEndpoint, outgoing
from splitfl.net.transport.wire import (
    PROTOCOL_VERSION,
    Message,
    Reassembler,
    WireError,
    decode,
    encode,
)


def join_cluster(agent: DeviceAgent, c: int, msg: Message) -> Message:
    """``join`` (ParallelSFL's bottom worker): connect to the top worker's listener and
    answer its commands for client ``c`` (``begin``/``forward``/``backward``/``finish``, as from
    the server) until it says bye; the server's ``abort`` of this command ends the link."""
    f = msg.fields
    try:
        _serve_peer(agent, c, f["address"], f["name"], f["token"], f.get("cert", ""), f["seq"])
    except Exception as err:  # noqa: BLE001 (reported to the server, which records it)
        return Message("joined", {"error": f"{type(err).__name__}: {err}"})
    return Message("joined", {})


def _serve_peer(agent, client: int, address: str, name: str, token: str, cert: str, session):
    abort = agent.abort_event(session)
    if abort.is_set():
        raise WireError("aborted by the server")
    base = agent.options
    creds = grpc.ssl_channel_credentials(root_certificates=cert.encode()) if cert else None
    opts = DeviceOptions(
        server=address,
        name=name,
        token=token,
        clients=(client,),
        credentials=creds,
        max_message_bytes=base.max_message_bytes if base else 256 << 20,
    )

    def watch(stream) -> None:  # the server's abort ends the link at once
        def cancel() -> None:
            abort.wait()
            stream.cancel()

        threading.Thread(target=cancel, daemon=True).start()

    try:
        _, done = _session(opts, agent, lambda line: None, type(agent), None, True, watch)
    finally:
        abort.set()  # ends the watcher
    if not done:
        raise WireError(f"link to peer {address} ended before its bye")


#: The device-to-device session commands: one whole session each, one reply at its end.
SESSION_HANDLERS = {"host": host_cluster, "join": join_cluster, "ring": ring_member}
#: how ``--data`` is checked at start (lazy: lists files, reads labels, decodes no image);
#: the server's ``data.*`` options (label column, image size, lazy) apply from its welcome
STARTUP = ContainerOptions(lazy=True)


def run_device(opts: DeviceOptions, log=print, agent_cls: type | None = None) -> int:
    """Serve until the server says bye; reconnect with backoff (up to ``retry_s`` without a
    connection). Returns the process exit code (0 after bye, 1 when it gave up, 2 refused).
    ``agent_cls`` replaces :class:`DeviceAgent` (custom devices, fault injection)."""
    keep_freed_memory()  # each batch's message buffers reuse the last one's pages
    try:
        peer = _peer_endpoint(opts, log)
    except (ValueError, OSError, RuntimeError, ConfigError) as err:
        log(f"splitfl device {opts.name}: cannot listen for peers: {err}")
        return 2
    try:
        # checked now (one line, exit 2); read again with the server's options at welcome
        local = load_local(opts.data, opts.data_format, STARTUP) if opts.data else None
    except DatasetError as err:
        log(f"splitfl device {opts.name}: error: {err}")
        return 2
    try:
        return _serve_server(opts, log, agent_cls or DeviceAgent, peer, local)
    finally:
        if peer is not None:
            peer.stop()


def _peer_endpoint(opts: DeviceOptions, log) -> PeerEndpoint | None:
    """The listener for device-to-device links: TLS when the server link is TLS."""
    if not opts.peer_listen:
        return None
    tls = opts.credentials is not None
    wait = 30.0  # a peer's hello may arrive before the server told us to expect it
    audit = Audit(
        sink=lambda line: log(f"splitfl device {opts.name}: peer listener: {line}"),
        only=("refused", "throttled"),  # not every round's links
    )
    return PeerEndpoint.start(
        opts.peer_listen, opts.peer_address, tls, opts.max_message_bytes, wait, audit
    )


def _serve_server(opts: DeviceOptions, log, agent_cls, peer: PeerEndpoint | None, local) -> int:
    """Sessions with the server until its bye; between them, redial with backoff until
    ``retry_s`` has passed since the server was last heard (:class:`Contact`)."""
    delay, contact = 0.5, Contact()
    outage = Outage(opts, log, contact)
    agent: DeviceAgent | None = None
    duplicate = Duplicate(opts.duplicate_wait_s)
    while True:
        try:
            agent, done = _session(opts, agent, log, agent_cls, peer, local=local, contact=contact)
            if done:
                return 0
            contact.at, delay, duplicate.since = time.monotonic(), 0.5, None
        except Refused as err:
            log(f"splitfl device {opts.name}: refused: {err}")
            return 2
        except (ConfigError, DatasetError) as err:
            log(f"splitfl device {opts.name}: error: {err}")
            return 2
        except grpc.RpcError as err:
            if certificate_refused(err):
                log(f"splitfl device {opts.name}: error: {certificate_refused(err)}")
                return 2
            if duplicate.gave_up(err):
                log(
                    f"splitfl device {opts.name}: refused: {err.details()} (for "
                    f"{opts.duplicate_wait_s:g} s; exiting)"
                )
                return 2
            mismatch = tls_mismatch(opts, err)
            if mismatch:
                log(f"splitfl device {opts.name}: error: {mismatch}")
                return 2
            outage.failed(f"connection: {err.code().name} {err.details()}")
        except WireError as err:
            log(f"splitfl device {opts.name}: bad message from the server: {err}")
        except OSError as err:
            outage.failed(f"connection: {err}")
        limit = outage.limit()
        left = contact.at + limit - time.monotonic()
        if left <= 0:
            log(f"splitfl device {opts.name}: no server for {limit:g} s, giving up")
            return 1
        time.sleep(min(delay, left))  # the last dial falls on the deadline, not before it
        delay = min(delay * 2, 10.0)


#: Permanent refusals (exit 2). ALREADY_EXISTS (clients held by another link, e.g. this
#: device's own half-open one), RESOURCE_EXHAUSTED (the server is full) and UNAVAILABLE
#: (throttled, unreachable) are retried with backoff.
_REFUSALS = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.PERMISSION_DENIED,
}


def _session(
    opts: DeviceOptions,
    agent,
    log,
    agent_cls,
    peer: PeerEndpoint | None,
    to_peer: bool = False,
    watch=None,
    local: LocalData | None = None,
    contact: Contact | None = None,
) -> tuple[DeviceAgent | None, bool]:
    """One connection: hello, welcome, then commands until bye (True) or the stream ends.
    ``to_peer``: the connection is a device-to-device link to a peer's listener (ParallelSFL's
    top worker) serving ``agent``'s client ``opts.clients[0]``. ``local``: the device's own
    data (``--data``), announced after the welcome."""
    # chunks are at most the server's chunk size (told in welcome), messages at most ours
    limit = opts.max_message_bytes + 1024
    options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
    options += keepalive_options(opts.keepalive_s)
    if opts.credentials is None:
        channel = grpc.insecure_channel(opts.server, options=options)
    else:
        channel = grpc.secure_channel(opts.server, opts.credentials, options=options)
    outbox: queue.SimpleQueue = queue.SimpleQueue()
    # the chunk size (until the welcome says the server's); the hello, until the listener's
    # challenge is answered
    chunking: dict = {"bytes": 1 << 16}
    hello = {"protocol": PROTOCOL_VERSION, "name": opts.name}
    hello["clients"] = list(opts.clients) if to_peer else hello_clients(opts, local)
    if peer is not None:
        hello["peer"] = peer.announce()
    outbox.put(encode(Message("hello", hello)))
    chunking["hello"] = hello
    compression = grpc.Compression.Gzip if opts.compression == "gzip" else None
    stream = channel.stream_stream(METHOD)(outgoing(outbox, chunking), compression=compression)
    if watch is not None:
        watch(stream)
    try:
        setup = (agent_cls, peer, to_peer, local)
        return _serve(opts, stream, outbox, agent, log, setup, chunking, contact)
    except grpc.RpcError as err:
        if err.code() in _REFUSALS:
            details = err.details() or ""
            if "bad chunk flag" in details:  # a server from before protocol 3 (flag first)
                details += " (the server runs an older splitfl; this device speaks protocol "
                details += f"{PROTOCOL_VERSION}: install the same version on both ends)"
            raise Refused(details) from None
        raise
    finally:
        outbox.put(None)
        stream.cancel()
        channel.close()


def _serve(opts, stream, outbox, agent, log, setup, chunking, contact=None):
    """Read the server's messages; commands go to the client's worker thread."""
    workers = ClientWorkers(outbox, stream.cancel)
    silence = Silence(stream, SILENT_PERIODS * opts.keepalive_s, log, opts.name, contact)
    setup = (*setup, silence)
    try:
        return _read_commands(opts, stream, outbox, agent, log, setup, chunking, workers)
    except grpc.RpcError:
        err = workers.error
        if err is None:
            raise
        if isinstance(err, OSError | WireError) or not isinstance(err, Exception):
            raise err from None
        # anything else a worker raised is logged and the device reconnects (no traceback)
        raise WireError(f"client worker failed: {type(err).__name__}: {str(err)[:200]}") from None
    finally:
        silence.stop()
        workers.close()


def _read_commands(
    opts, stream, outbox, agent, log, setup, chunking, workers
) -> tuple[DeviceAgent | None, bool]:
    agent_cls, peer, to_peer, local, silence = setup
    assembler = Reassembler(opts.max_message_bytes)
    for chunk in stream:
        if chunking.get("welcomed"):
            silence.heard = time.monotonic()
        else:
            silence.stirred(time.monotonic())
        data = assembler.feed(chunk)
        if data is None:
            continue
        msg = decode(data)
        if msg.type == "ping":
            outbox.put(encode(Message("pong")))
            continue
        if msg.type == "challenge" and "hello" in chunking:
            outbox.put(encode(answer(opts.token, chunking.pop("hello"), msg)))
            continue
        if msg.type == "welcome":
            clients = msg.fields.get("clients")
            if not isinstance(clients, list) or not isinstance(msg.fields.get("config"), dict):
                raise WireError("welcome without clients or config")
            keepalive = msg.fields.get("keepalive_s", 0)
            silence.limit = 0.0  # loading the data may take a while
            size = msg.fields.get("chunk_bytes")
            if not isinstance(size, int) or not 1 <= size <= opts.max_message_bytes:
                raise WireError(f"bad chunk size {size!r} in welcome")
            chunking["bytes"], chunking["welcomed"] = size, True
            silence.contact.joined = True
            if not to_peer and (agent is None or sorted(agent.data.samples) != sorted(clients)):
                agent = _new_agent(opts, msg.fields, clients, agent_cls, local, outbox)
                agent.peer, agent.options, agent.sessions = peer, opts, SESSION_HANDLERS
            if not to_peer:  # this session's outbox (a reconnect keeps the agent)
                agent.notify = lambda message: outbox.put(encode(message))
            ready = {} if to_peer else _announce(opts, agent, msg.fields.get("data"), local)
            outbox.put(encode(Message("ready", ready)))
            silence.heard = time.monotonic()
            if isinstance(keepalive, int | float) and 0 < keepalive < 86400:
                silence.limit = SILENT_PERIODS * keepalive
            if not to_peer:
                log(f"splitfl device {opts.name}: connected, hosting clients {clients}")
            continue
        if msg.type == "bye":
            if msg.fields.get("refused"):
                raise Refused(str(msg.fields["refused"])[:300])
            if not to_peer:
                why = str(msg.fields.get("reason"))[:200]
                log(f"splitfl device {opts.name}: server said bye ({why})")
            return agent, True
        if msg.type == "abort" and agent is not None:
            agent.abort_event(msg.fields.get("session")).set()
            continue
        if agent is None:
            raise WireError(f"{msg.type!r} before welcome")
        workers.dispatch(agent, msg, len(data))
    return agent, False


def hello_clients(opts: DeviceOptions, local: LocalData | None) -> list[int]:
    """The clients a device asks to host: ``--client-id``, or those its own data names."""
    if local is None or None in local or opts.clients:
        return list(opts.clients)
    return sorted(local)


def _new_agent(opts, welcome: dict, clients, agent_cls, local, outbox) -> DeviceAgent:
    """The agent for the welcomed clients: the server's dataset partitioned by its seed, or
    the device's own data (a device that cannot serve the server's data mode tells the
    server why — it logs the same line — and exits 2)."""
    config = from_dict(ExperimentConfig, welcome["config"])
    device_imports(config)  # the modules and names the server's config needs
    spec = welcome.get("data") or {}
    try:
        if spec.get("own") and local is None:
            raise Refused("the server's clients train on the devices' own data: give --data")
        if local is None:
            return agent_cls(config, ClientData(config, clients, opts.data_root))
        local = load_local(opts.data, opts.data_format, container_options(config.data))
        return agent_cls(config, ClientData.from_local(local, clients, spec, config.data))
    except DatasetError as err:  # the server's data options on these files: tell it too
        outbox.put(encode(Message("refuse", {"reason": f"data: {err}"})))
        time.sleep(0.2)
        raise
    except Refused as err:
        outbox.put(encode(Message("refuse", {"reason": str(err)})))
        time.sleep(0.2)  # let the line reach the server before the stream closes
        raise


def _announce(opts: DeviceOptions, agent: DeviceAgent, spec: dict | None, local) -> dict:
    """``ready``'s fields: with own data, the announcement of the clients' data (computed
    once per process: a reconnect repeats it, noise included)."""
    if local is None or spec is None:
        return {}
    if getattr(agent, "announced", None) is None:
        eps = effective_epsilon(spec.get("histogram_epsilon"), opts.histogram_epsilon)
        seed = opts.noise_seed
        if seed is None:
            seed = int.from_bytes(os.urandom(8), "little") >> 1
        agent.announced = agent.announcement(spec, eps, seed)
    return {"data": agent.announced}


def start_in_thread(opts: DeviceOptions, agent_cls: type | None = None) -> DeviceThread:
    """A device in a thread of this process (tests, notebooks); ``.code`` is its exit code
    once it ends."""
    thread = DeviceThread(opts, agent_cls)
    thread.start()
    return thread


class DeviceThread(threading.Thread):
    def __init__(self, opts: DeviceOptions, agent_cls: type | None):
        super().__init__(daemon=True, name=f"splitfl-device-{opts.name}")
        self.opts, self.agent_cls = opts, agent_cls
        self.code: int | None = None
        self.lines: list[str] = []

    def run(self) -> None:
        self.code = run_device(self.opts, self.lines.append, self.agent_cls)

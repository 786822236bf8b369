"""The device process (``splitfl device``): one edge device hosting one or more clients.

It connects to the server, says hello (name, token, protocol version, the clients it asks to
host), receives the run's config, loads **only its own clients' samples** (its partition of a
dataset root, drawn exactly as the simulation draws it) and then answers the server's commands
with :class:`~splitfl.executors.roles.DeviceRole` — the same code the in-process executor runs:

* ``begin`` (task, device part, aux head, round seed) → ``ack``
* ``forward`` (step) → ``forwarded`` (smashed data, labels)
* ``backward`` (activation gradient) and ``head_update`` → no reply (the next reply follows)
* ``local_step`` (step) → ``local_done`` (loss sum, samples)
* ``finish`` → ``finished`` (trained device part and aux head)

Every reply carries ``compute_s``: device compute since the previous reply. The server never
sends code or pickles: commands are JSON fields plus raw tensors (:mod:`splitfl.net.wire`).
Imports stop at config, data, models and the executor roles: no matplotlib, scipy, Ray.
If the connection drops, the process reconnects with exponential backoff.
"""

from __future__ import annotations

import copy
import queue
import threading
import time
from dataclasses import dataclass

import grpc
import numpy as np
import torch

from splitfl.config import ConfigError, ExperimentConfig, from_dict
from splitfl.data import load_dataset
from splitfl.data.base import DatasetError
from splitfl.data.clients import client_partition
from splitfl.executors.roles import DeviceRole, Runtime, aux_from_state
from splitfl.models import ModelPart, build_model
from splitfl.net.d2d_device import SESSION_HANDLERS
from splitfl.net.emulation import FORWARD_SHARE, Profile, stretch, transfer
from splitfl.net.hub import METHOD
from splitfl.net.peer import PeerEndpoint, outgoing
from splitfl.net.wire import (
    PROTOCOL_VERSION,
    Message,
    Reassembler,
    WireError,
    decode,
    encode,
    state_from,
    state_tensors,
)
from splitfl.plan import ClientTask
from splitfl.seeding import derive_seed


@dataclass(frozen=True)
class DeviceOptions:
    """How a device process connects (``splitfl device`` flags)."""

    server: str
    name: str
    token: str
    clients: tuple[int, ...] = ()
    data_root: str | None = None
    credentials: grpc.ChannelCredentials | None = None
    max_message_bytes: int = 256 << 20
    retry_s: float = 60.0
    compression: str = "none"
    #: where this device accepts device-to-device links (RingSFL, ParallelSFL); None = none
    peer_listen: str | None = "127.0.0.1:0"
    #: the address peers dial (default: the listen address)
    peer_address: str | None = None


class Refused(RuntimeError):
    """The server refused this device (wrong token, protocol, name taken…): do not retry."""


class ClientData:
    """The samples of the clients this device hosts (and nothing else)."""

    def __init__(self, config: ExperimentConfig, clients: list[int], data_root: str | None):
        d = config.data
        bundle = load_dataset(d.dataset, data_root or d.root, verify=d.verify)
        parts = client_partition(config, bundle)
        self.input_shape, self.num_classes = bundle.input_shape, bundle.num_classes
        self.samples: dict[int, tuple[torch.Tensor, torch.Tensor, np.ndarray]] = {}
        for c in clients:
            idx = torch.as_tensor(parts[c], dtype=torch.long)
            # local copies; positions 0..n-1 draw the same batches as the global indices
            x, y = bundle.train.x[idx].clone(), bundle.train.y[idx].clone()
            self.samples[c] = (x, y, np.arange(len(idx)))


#: Share of the part's per-sample FLOPs each command computes (emulation).
_COMPUTE_SHARE = {
    "forward": FORWARD_SHARE,
    "backward": 1 - FORWARD_SHARE,
    "head_update": 1 - FORWARD_SHARE,
    "local_step": 1.0,
}
#: Commands a device answers.
COMMANDS = ("begin", "forward", "backward", "head_update", "local_step", "finish")
#: Commands that run a whole device-to-device session (:mod:`splitfl.net.d2d_device`): one
#: reply at the end, their time is not device compute.
SESSIONS = ("host", "join", "ring")


class DeviceAgent:
    """Answers the server's commands for this device's clients."""

    def __init__(self, config: ExperimentConfig, data: ClientData):
        self.config, self.data = config, data
        if config.threads:
            torch.set_num_threads(config.threads)  # as the simulation: same kernels, same digits
        torch.manual_seed(config.seed)
        self.model = build_model(config.model, data.input_shape, data.num_classes)
        self.runtime = Runtime(torch.device("cpu"))
        self.roles: dict[int, DeviceRole] = {}
        self.pending: dict[int, float] = {}
        self.profiles: dict[int, Profile | None] = {}
        self.last_batch: dict[int, int] = {}
        #: this process's listener for peers (set by :func:`run_device`)
        self.peer: PeerEndpoint | None = None
        #: the session options of this process (to open device-to-device links like it)
        self.options: DeviceOptions | None = None
        self.aborts: dict[int, threading.Event] = {}
        self.warm_up()

    def serve_peer(
        self, client: int, address: str, name: str, token: str, cert: str, session=None
    ) -> None:
        """Serve ``client``'s commands from a peer's listener (ParallelSFL: the bottom worker
        answering its top worker) until the peer says bye; raises if the link fails or the
        server aborts ``session`` (the seq of the command that asked for it)."""
        abort = self.abort_event(session)
        if abort.is_set():
            raise WireError("aborted by the server")
        base = self.options
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
            _, done = _session(opts, self, lambda line: None, type(self), None, True, watch)
        finally:
            abort.set()  # ends the watcher
        if not done:
            raise WireError(f"link to peer {address} ended before its bye")

    def abort_event(self, session) -> threading.Event:
        """The event that tells device-to-device session ``session`` (the seq of its command)
        to give up (the server's ``abort``); created by whichever comes first."""
        return self.aborts.setdefault(session, threading.Event())

    def warm_up(self) -> None:
        """One forward/backward on a batch of its samples before saying ready, so that
        one-time kernel set-up (per batch shape) is not measured as the first round's compute."""
        x = next(iter(self.data.samples.values()))[0][: self.config.train.batch_size]
        model = copy.deepcopy(self.model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # first use loads lazily
        model(x).sum().backward()
        optimizer.step()

    def handle(self, msg: Message) -> Message | None:
        """One command → its reply (None for ``backward``/``head_update``). With emulation,
        compute is stretched to the client's profile (:mod:`splitfl.net.emulation`)."""
        c = msg.fields.get("client")
        if msg.type in SESSIONS and c in self.data.samples:
            reply = SESSION_HANDLERS[msg.type](self, c, msg)
            reply.fields.update(client=c, seq=msg.fields.get("seq"), compute_s=0.0)
            self.aborts.pop(msg.fields.get("seq"), None)
            return reply
        if msg.type not in COMMANDS or c not in self.data.samples:
            raise WireError(f"unexpected command {msg.type!r} for client {c!r}")
        t0 = time.perf_counter()
        reply = getattr(self, f"_on_{msg.type}")(c, msg)
        self._stretch(c, msg.type, t0)
        self.pending[c] = self.pending.get(c, 0.0) + time.perf_counter() - t0
        if reply is None:
            return None
        reply.fields.update(client=c, seq=msg.fields.get("seq"), compute_s=self.pending.pop(c))
        return reply

    def _stretch(self, c: int, kind: str, started: float) -> None:
        profile = self.profiles.get(c)
        share = _COMPUTE_SHARE.get(kind)
        if profile is None or share is None or c not in self.roles:
            return
        samples = self.last_batch.get(c, 0)
        stretch(started, samples, share * profile.flops_per_sample, profile.flops)

    def link(self, c, kind: str, nbytes: int) -> None:
        """Hold a message for its emulated transfer on client ``c``'s link."""
        profile = self.profiles.get(c)
        if profile is not None:
            transfer(nbytes, profile.uplink if kind == "up" else profile.downlink)

    def _on_begin(self, c: int, msg: Message) -> Message:
        f = msg.fields
        task = ClientTask(c, f["cut"], f["group"], f["batch_size"], f["steps"], f["lr"])
        part = copy.deepcopy(ModelPart(self.model, 0, task.cut))
        part.load_state_dict(state_from("part", msg.tensors))
        aux_state = state_from("aux", msg.tensors)
        aux = aux_from_state(aux_state) if aux_state else None
        torch.manual_seed(derive_seed(f["round_seed"], "device-rng", c))  # dropout masks
        self.roles[c] = DeviceRole(
            task, part, aux, self.config.train, self.data.samples[c], f["round_seed"], self.runtime
        )
        return Message("ack")

    def _on_forward(self, c: int, msg: Message) -> Message:
        fx, y = self.roles[c].forward(msg.fields["step"])
        self.last_batch[c] = len(y)
        return Message("forwarded", {"step": msg.fields["step"]}, {"fx": fx, "y": y})

    def _on_backward(self, c: int, msg: Message) -> None:
        self.roles[c].backward(msg.tensors["grad"])

    def _on_head_update(self, c: int, msg: Message) -> None:
        self.roles[c].head_update()

    def _on_local_step(self, c: int, msg: Message) -> Message:
        loss_sum, samples = self.roles[c].local_step(msg.fields["step"])
        self.last_batch[c] = samples
        return Message("local_done", {"loss_sum": loss_sum, "samples": samples})

    def _on_finish(self, c: int, msg: Message) -> Message:
        part, aux = self.roles.pop(c).states()
        return Message("finished", {}, {**state_tensors("part", part), **state_tensors("aux", aux)})


def run_device(opts: DeviceOptions, log=print, agent_cls: type | None = None) -> int:
    """Serve until the server says bye; reconnect with backoff (up to ``retry_s`` without a
    connection). Returns the process exit code (0 after bye, 1 when it gave up, 2 refused).
    ``agent_cls`` replaces :class:`DeviceAgent` (custom devices, fault injection)."""
    try:
        peer = _peer_endpoint(opts)
    except (ValueError, OSError, RuntimeError, ConfigError) as err:
        log(f"splitfl device {opts.name}: cannot listen for peers: {err}")
        return 2
    try:
        return _serve_server(opts, log, agent_cls or DeviceAgent, peer)
    finally:
        if peer is not None:
            peer.stop()


def _peer_endpoint(opts: DeviceOptions) -> PeerEndpoint | None:
    """The listener for device-to-device links: TLS when the server link is TLS."""
    if not opts.peer_listen:
        return None
    tls = opts.credentials is not None
    wait = 30.0  # a peer's hello may arrive before the server told us to expect it
    return PeerEndpoint.start(
        opts.peer_listen, opts.peer_address, tls, opts.max_message_bytes, wait
    )


def _serve_server(opts: DeviceOptions, log, agent_cls, peer: PeerEndpoint | None) -> int:
    delay, gave_up_at = 0.5, time.monotonic() + opts.retry_s
    agent: DeviceAgent | None = None
    while True:
        try:
            agent, done = _session(opts, agent, log, agent_cls, peer)
            if done:
                return 0
            gave_up_at, delay = time.monotonic() + opts.retry_s, 0.5
        except Refused as err:
            log(f"splitfl device {opts.name}: refused: {err}")
            return 2
        except (ConfigError, DatasetError) as err:
            log(f"splitfl device {opts.name}: error: {err}")
            return 2
        except grpc.RpcError as err:
            log(f"splitfl device {opts.name}: connection: {err.code().name} {err.details()}")
        except WireError as err:
            log(f"splitfl device {opts.name}: bad message from the server: {err}")
        except OSError as err:
            log(f"splitfl device {opts.name}: connection: {err}")
        if time.monotonic() > gave_up_at:
            log(f"splitfl device {opts.name}: no server for {opts.retry_s:g} s, giving up")
            return 1
        time.sleep(delay)
        delay = min(delay * 2, 10.0)


_REFUSALS = {
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
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
) -> tuple[DeviceAgent | None, bool]:
    """One connection: hello, welcome, then commands until bye (True) or the stream ends.
    ``to_peer``: the connection is a device-to-device link to a peer's listener (ParallelSFL's
    top worker) serving ``agent``'s client ``opts.clients[0]``."""
    # chunks are at most the server's chunk size (told in welcome), messages at most ours
    limit = opts.max_message_bytes + 1024
    options = [("grpc.max_receive_message_length", limit), ("grpc.max_send_message_length", limit)]
    if opts.credentials is None:
        channel = grpc.insecure_channel(opts.server, options=options)
    else:
        channel = grpc.secure_channel(opts.server, opts.credentials, options=options)
    outbox: queue.Queue = queue.Queue()
    chunking = {"bytes": 1 << 16}  # until the server's welcome says its chunk size
    hello = {"protocol": PROTOCOL_VERSION, "name": opts.name, "token": opts.token}
    hello["clients"] = list(opts.clients)
    if peer is not None:
        hello["peer"] = peer.announce()
    outbox.put(encode(Message("hello", hello)))
    compression = grpc.Compression.Gzip if opts.compression == "gzip" else None
    stream = channel.stream_stream(METHOD)(outgoing(outbox, chunking), compression=compression)
    if watch is not None:
        watch(stream)
    try:
        return _serve(opts, stream, outbox, agent, log, agent_cls, chunking, peer, to_peer)
    except grpc.RpcError as err:
        if err.code() in _REFUSALS:
            raise Refused(err.details()) from None
        raise
    finally:
        outbox.put(None)
        stream.cancel()
        channel.close()


def _serve(opts, stream, outbox, agent, log, agent_cls, chunking, peer, to_peer):
    """Read the server's messages; commands go to the client's worker thread."""
    workers = ClientWorkers(outbox, stream.cancel)
    setup = (agent_cls, peer, to_peer)
    try:
        return _read_commands(opts, stream, outbox, agent, log, setup, chunking, workers)
    except grpc.RpcError:
        if workers.error is not None:
            raise workers.error from None
        raise
    finally:
        workers.close()


def _read_commands(
    opts, stream, outbox, agent, log, setup, chunking, workers
) -> tuple[DeviceAgent | None, bool]:
    agent_cls, peer, to_peer = setup
    assembler = Reassembler(opts.max_message_bytes)
    for chunk in stream:
        data = assembler.feed(chunk)
        if data is None:
            continue
        msg = decode(data)
        if msg.type == "welcome":
            clients = msg.fields["clients"]
            size = msg.fields.get("chunk_bytes")
            if not isinstance(size, int) or not 1 <= size <= opts.max_message_bytes:
                raise WireError(f"bad chunk size {size!r} in welcome")
            chunking["bytes"] = size
            if not to_peer and (agent is None or sorted(agent.data.samples) != sorted(clients)):
                config = from_dict(ExperimentConfig, msg.fields["config"])
                agent = agent_cls(config, ClientData(config, clients, opts.data_root))
                agent.peer, agent.options = peer, opts
            outbox.put(encode(Message("ready")))
            if not to_peer:
                log(f"splitfl device {opts.name}: connected, hosting clients {clients}")
            continue
        if msg.type == "bye":
            return agent, True
        if msg.type == "abort" and agent is not None:
            agent.abort_event(msg.fields.get("session")).set()
            continue
        if agent is None:
            raise WireError(f"{msg.type!r} before welcome")
        workers.dispatch(agent, msg, len(data))
    return agent, False


class ClientWorkers:
    """One thread per hosted client: a device process hosting several clients runs them
    concurrently, as separate devices would (their emulated transfers and compute overlap);
    each client's commands run in order. A worker's error ends the session."""

    def __init__(self, outbox: queue.Queue, stop_stream):
        self.outbox, self.stop_stream = outbox, stop_stream
        self.queues: dict[int, queue.Queue] = {}
        self.threads: list[threading.Thread] = []
        self.error: BaseException | None = None

    def dispatch(self, agent: DeviceAgent, msg: Message, nbytes: int) -> None:
        client = msg.fields.get("client")
        if client not in self.queues:
            if client not in agent.data.samples:
                raise WireError(f"command for client {client!r}, not hosted here")
            self.queues[client] = queue.Queue()
            thread = threading.Thread(target=self._run, args=(agent, client), daemon=True)
            self.threads.append(thread)
            thread.start()
        self.queues[client].put((msg, nbytes))

    def _run(self, agent: DeviceAgent, client: int) -> None:
        box = self.queues[client]
        try:
            while (item := box.get()) is not None:
                msg, nbytes = item
                if msg.type in ("begin", "ring"):
                    agent.profiles[client] = Profile.from_fields(msg.fields.get("emulate") or {})
                agent.link(client, "down", nbytes)  # emulated download, before use
                reply = agent.handle(msg)
                if reply is not None:
                    frame = encode(reply)
                    agent.link(client, "up", len(frame))  # leaves at the link's rate
                    self.outbox.put(frame)
        except BaseException as err:  # noqa: BLE001 (reported to the session, which ends)
            self.error = err
            self.stop_stream()

    def close(self) -> None:
        for box in self.queues.values():
            box.put(None)
        for thread in self.threads:
            thread.join(timeout=5)


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

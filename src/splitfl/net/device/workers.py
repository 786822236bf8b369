"""A connected device's per-session machinery: the hosted clients' worker threads
(:class:`ClientWorkers`: a client's commands in order, clients concurrently) and the keepalive
watchdog (:class:`Silence`: a silent server link is cancelled so the device redials). Split
from :mod:`splitfl.net.device.session`, which dials, says hello and reads the server's
messages."""

from __future__ import annotations

import queue
import threading
import time

from splitfl.net.device.agent import DeviceAgent
from splitfl.net.device.emulation import Profile
from splitfl.net.transport.wire import Message, WireError, encode


class Contact:
    """When the device last heard from its server, across sessions: the device gives up only
    ``--retry-s`` after that moment, so a link that breaks after a long session is redialled
    (not counted from the start of the session)."""

    def __init__(self) -> None:
        self.at = time.monotonic()


class Silence:
    """The device's end of the keepalive: cancels the stream (the device then redials) when
    the server has sent nothing — not even its ``ping`` — for ``limit`` seconds (0: never);
    the welcome sets ``limit`` to :data:`~splitfl.net.transport.hub.SILENT_PERIODS` × the server's
    ``keepalive_s``."""

    def __init__(self, stream, limit: float, log, name: str, contact: Contact | None = None):
        self.stream, self.limit, self.log, self.name = stream, limit, log, name
        self.contact = contact or Contact()
        self._heard = time.monotonic()  # the silence clock starts; no contact yet
        self.done = threading.Event()
        threading.Thread(target=self._watch, daemon=True, name="splitfl-silence").start()

    @property
    def heard(self) -> float:
        """When the server last sent anything (kept in :attr:`contact` across sessions)."""
        return self._heard

    @heard.setter
    def heard(self, at: float) -> None:
        self._heard = at
        self.contact.at = max(self.contact.at, at)

    def stirred(self, at: float) -> None:
        """The listener sent something before its welcome (its challenge): the stream is
        alive, but not contact with the server — one that challenges and then refuses does
        not reset the ``--retry-s`` clock."""
        self._heard = at

    def _watch(self) -> None:
        while not self.done.wait(0.25):
            silent = time.monotonic() - self.heard
            if self.limit > 0 and silent > self.limit:
                self.log(f"splitfl device {self.name}: server silent {silent:.0f} s, redialling")
                self.stream.cancel()
                return

    def stop(self) -> None:
        self.done.set()


class ClientWorkers:
    """One thread per hosted client: a device process hosting several clients runs them
    concurrently, as separate devices would (their emulated transfers and compute overlap);
    each client's commands run in order. A worker's error ends the session. A device hosting
    one client runs a command in the reading thread itself when that client's worker is idle
    (one thread hand-off less per message, same order); device-to-device session commands,
    which run until the server's ``abort`` or their end, always go to the worker."""

    def __init__(self, outbox: queue.SimpleQueue, stop_stream):
        self.outbox, self.stop_stream = outbox, stop_stream
        self.queues: dict[int, queue.SimpleQueue] = {}
        self.threads: list[threading.Thread] = []
        self.error: BaseException | None = None
        #: commands queued per client (written by the reader) and finished by its worker
        #: (written by the worker): the worker is idle when they are equal
        self.queued: dict[int, int] = {}
        self.finished: dict[int, int] = {}

    def dispatch(self, agent: DeviceAgent, msg: Message, nbytes: int) -> None:
        client = msg.fields.get("client")
        if client not in agent.data.samples:
            raise WireError(f"command for client {client!r}, not hosted here")
        idle = self.queued.get(client, 0) == self.finished.get(client, 0)
        if idle and len(agent.data.samples) == 1 and msg.type not in agent.sessions:
            self._serve(agent, client, msg, nbytes)
            return
        if client not in self.queues:
            self.queues[client] = queue.SimpleQueue()
            thread = threading.Thread(target=self._run, args=(agent, client), daemon=True)
            self.threads.append(thread)
            thread.start()
        self.queued[client] = self.queued.get(client, 0) + 1
        self.queues[client].put((msg, nbytes))

    def _run(self, agent: DeviceAgent, client: int) -> None:
        box = self.queues[client]
        try:
            while (item := box.get()) is not None:
                self._serve(agent, client, *item)
                self.finished[client] = self.finished.get(client, 0) + 1
        except BaseException as err:  # noqa: BLE001 (reported to the session, which ends)
            self.error = err
            self.stop_stream()

    def _serve(self, agent: DeviceAgent, client: int, msg: Message, nbytes: int) -> None:
        """Run one command and queue its reply (emulated transfers held on the way)."""
        if msg.type in ("begin", "ring"):
            agent.profiles[client] = Profile.from_fields(msg.fields.get("emulate") or {})
        agent.link(client, "down", nbytes)  # emulated download, before use
        reply = agent.handle(msg)
        if reply is not None:
            frame = _encode_reply(reply)
            agent.link(client, "up", len(frame))  # leaves at the link's rate
            self.outbox.put(frame)

    def close(self) -> None:
        """End the session's workers: commands still queued belong to a connection that is
        gone and are dropped (run after a reconnect, an old ``backward`` would step the new
        session's round); a command already running is waited for, so the next session
        starts on a quiet agent."""
        for box in self.queues.values():
            while True:
                try:
                    box.get_nowait()
                except queue.Empty:
                    break
            box.put(None)
        for thread in self.threads:
            thread.join(timeout=120)


def _encode_reply(reply: Message):
    """The reply's frame; one that cannot be sent (a NaN in its fields: strict JSON) becomes
    an ``error`` reply saying so."""
    try:
        return encode(reply)
    except WireError as err:
        f = reply.fields
        why = {"client": f.get("client"), "seq": f.get("seq"), "error": str(err)[:200]}
        return encode(Message("error", why))

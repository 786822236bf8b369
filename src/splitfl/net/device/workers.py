"""A connected device's per-session machinery: the hosted clients' worker threads
(:class:`ClientWorkers`: a client's commands in order, clients concurrently) and the keepalive
watchdog (:class:`Silence`: a silent server link is cancelled so the device redials), and
between sessions when the server was last heard (:class:`Contact`) and what the device says
while it is not (:class:`Outage`). Split
from :mod:`splitfl.net.device.session`, which dials, says hello and reads the server's
messages."""

from __future__ import annotations

import queue
import threading
import time

from splitfl.net.device.agent import EXTRA_COMMANDS, DeviceAgent, DeviceOptions
from splitfl.net.device.emulation import Profile
from splitfl.net.transport.wire import Message, WireError, encode


class Contact:
    """When the device last heard from its server, across sessions: the device gives up only
    ``--retry-s`` after that moment, so a link that breaks after a long session is redialled
    (not counted from the start of the session)."""

    def __init__(self) -> None:
        self.at = time.monotonic()
        #: the server welcomed this device once: it is part of a run, which may resume
        #: (``--resume-wait-s`` then bounds the redialling instead of ``--retry-s``)
        self.joined = False


#: Seconds between two lines of one outage (the first failed dial is always said).
OUTAGE_LOG_S = 60.0


class Outage:
    """What a device says while its server is unreachable: the first failed dial of an outage
    in full, then one line per :data:`OUTAGE_LOG_S` (not one per attempt) saying how long and
    until when it keeps redialling; ``--retry-s`` bounds an outage before the device joined a
    run, ``--resume-wait-s`` after (the run may resume: issue 51 item 5)."""

    def __init__(self, opts: DeviceOptions, log, contact: Contact):
        self.opts, self.log, self.contact = opts, log, contact
        self.said_at: float | None = None  # the last line's time (None: no outage yet)
        self.heard = contact.at

    def limit(self) -> float:
        """Seconds without the server before the device gives up."""
        return self.opts.resume_wait_s if self.contact.joined else self.opts.retry_s

    def failed(self, what: str) -> None:
        now, name = time.monotonic(), self.opts.name
        if self.contact.at != self.heard:  # heard since: a new outage
            self.said_at, self.heard = None, self.contact.at
        if self.said_at is None:
            self.log(f"splitfl device {name}: {what}")
        elif now - self.said_at >= OUTAGE_LOG_S:
            limit = self.limit()
            flag = "--resume-wait-s" if self.contact.joined else "--retry-s"
            self.log(
                f"splitfl device {name}: no server for {now - self.contact.at:.0f} s ({what}); "
                f"redialling until {limit:g} s without one ({flag})"
            )
        else:
            return
        self.said_at = now


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
        extra = EXTRA_COMMANDS.get(msg.type)
        if msg.type in ("begin", "ring") or (extra is not None and extra.begins):
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

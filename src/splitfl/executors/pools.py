"""The workers of ``executor: parallel`` and how the driver talks to them.

A pool starts ``n`` workers (:class:`~splitfl.executors.workers.UnitWorker`), sends a worker a
message (a list of :mod:`~splitfl.executors.channel` frames) and waits for the next answer
(a frame's bytes) from any worker:

* :class:`LocalPool` — processes on this machine (``python -m splitfl.executors.worker_process``),
  each on one end of a socket pair; their environment limits the math libraries to the
  worker's thread count before torch is imported and keeps freed memory for the next unit
  (:mod:`splitfl.core.allocator`).
* :class:`RayPool` — one Ray actor per worker asking for ``threads`` CPUs and
  ``gpus_per_worker`` GPUs, on a local Ray instance, the one this process runs in (a sweep
  trial) or the cluster at ``address`` (:func:`splitfl.ray_cluster.join_ray`). The actor
  calls carry the same frames as bytes (Ray moves bytes; no object of splitfl's is pickled).

Every wait is bounded (``timeout_s``); a worker that dies, closes its connection or does not
answer raises :class:`WorkerLost` naming it and what it was doing, never a hang, and
:meth:`LocalPool.respawn` / :meth:`RayPool.respawn` put a fresh worker in its place (the
executor deals its units again, :mod:`splitfl.executors.parallel`).
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import subprocess
import sys
from typing import Any

from splitfl.core.allocator import KEEP_FREED_MEMORY, keep_freed_memory
from splitfl.core.framing import Frame
from splitfl.executors.channel import ChannelError
from splitfl.executors.workers import UnitWorker, recv_message, send_message
from splitfl.ray_cluster import import_ray, join_ray


class WorkerError(RuntimeError):
    """A worker answered what it should not, or workers were lost too often."""


class WorkerLost(WorkerError):
    """Workers that died, closed their connection or did not answer within ``timeout_s``:
    ``reasons`` maps each to a line saying so (its description and what it was doing)."""

    def __init__(self, reasons: dict[int, str]) -> None:
        super().__init__("; ".join(reasons[w] for w in sorted(reasons)))
        self.reasons = reasons


class WorkersLostError(WorkerError):
    """Workers were lost more often than ``parallel.max_retries`` allows: the run stops (one
    line; the checkpoint of the finished rounds is kept)."""


class LocalPool:
    """Worker processes on this machine, one socket pair each; every send and receive on the
    driver's side is bounded by ``timeout_s``."""

    def __init__(self, n: int, threads: int, timeout_s: float):
        self.timeout_s = timeout_s
        self.env = {**KEEP_FREED_MEMORY, **os.environ, **{v: str(threads) for v in THREAD_VARS}}
        self.procs: list[subprocess.Popen] = []
        self.socks: list[socket.socket] = []
        for _ in range(n):
            proc, sock = self._spawn()
            self.procs.append(proc)
            self.socks.append(sock)

    def _spawn(self) -> tuple[subprocess.Popen, socket.socket]:
        """A worker process on one end of a new socket pair; the driver's end."""
        mine, theirs = socket.socketpair()
        proc = subprocess.Popen(
            [sys.executable, "-m", "splitfl.executors.worker_process", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=self.env,
        )
        theirs.close()
        mine.settimeout(self.timeout_s)
        return proc, mine

    def respawn(self, w: int) -> None:
        """Worker ``w`` is lost: end its process (killed if it still runs, e.g. stopped) and
        start a fresh one in its place, which knows nothing yet (it needs ``init``)."""
        self.socks[w].close()
        _end(self.procs[w])
        self.procs[w], self.socks[w] = self._spawn()

    def describe(self, w: int) -> str:
        return f"parallel worker {w} (local process {self.procs[w].pid})"

    def set_timeout(self, seconds: float) -> None:
        self.timeout_s = seconds
        for sock in self.socks:
            sock.settimeout(seconds)

    def submit(self, w: int, ops: list[Frame]) -> None:
        try:
            send_message(self.socks[w], ops)
        except TimeoutError:
            raise WorkerLost(_late(self, {w: "receiving work"}, self.timeout_s)) from None
        except OSError:
            raise WorkerLost({w: f"{self.describe(w)} {self._ended(w)}"}) from None

    def wait_any(self, busy: dict[int, str]) -> tuple[int, bytearray]:
        """The next answer from one of the ``busy`` workers (worker → what it is doing)."""
        by_sock = {self.socks[w]: w for w in busy}
        ready, _, _ = select.select(list(by_sock), [], [], self.timeout_s)
        if not ready:
            raise WorkerLost(_late(self, busy, self.timeout_s))
        w = by_sock[ready[0]]
        try:
            (answer,) = recv_message(self.socks[w])
        except TimeoutError:
            raise WorkerLost(_late(self, {w: busy[w]}, self.timeout_s)) from None
        except ChannelError as err:
            raise WorkerError(
                f"{self.describe(w)} sent a bad answer while {busy[w]}: {err}"
            ) from None
        except (EOFError, OSError, ValueError):
            raise WorkerLost({w: f"{self.describe(w)} {self._ended(w)} while {busy[w]}"}) from None
        return w, answer

    def _ended(self, w: int) -> str:
        try:
            code = self.procs[w].wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "closed its connection"
        return f"exited with code {code} (a negative code is the signal that killed it)"

    def close(self) -> None:
        for sock in self.socks:
            with contextlib.suppress(OSError):
                sock.settimeout(1)
                send_message(sock, [])
            sock.close()
        for proc in self.procs:
            _end(proc, 10)


def _end(proc: subprocess.Popen, grace_s: float = 0) -> None:
    """Wait up to ``grace_s`` for ``proc`` to exit, then kill it (a stopped one too)."""
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


#: Environment variables that size the math libraries' thread pools in a worker process.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


class _RayWorker:
    """The Ray actor around a :class:`UnitWorker`."""

    def __init__(self) -> None:
        keep_freed_memory()  # as a local worker's environment does (splitfl.core.allocator)
        self.worker = UnitWorker()

    def handle(self, ops: list[bytes]) -> bytes:
        return b"".join(self.worker.handle(ops).parts)


class RayPool:
    """One Ray actor per worker."""

    def __init__(
        self, n: int, threads: int, gpus: float, address: str | None, timeout_s: float
    ) -> None:
        self.ray = import_ray("parallel.backend", "parallel.backend: local")
        self.started = join_ray(self.ray, address)
        self.timeout_s = timeout_s
        self.actor = self.ray.remote(_RayWorker).options(
            num_cpus=threads, num_gpus=gpus, max_restarts=0, max_concurrency=1
        )
        self.actors = [self.actor.remote() for _ in range(n)]
        self.pending: dict[Any, int] = {}

    def describe(self, w: int) -> str:
        return f"parallel worker {w} (Ray actor)"

    def submit(self, w: int, ops: list[Frame]) -> None:
        blobs = [b"".join(op.parts) for op in ops]
        self.pending[self.actors[w].handle.remote(blobs)] = w

    def wait_any(self, busy: dict[int, str]) -> tuple[int, bytes]:
        """The next answer from one of the ``busy`` workers (worker → what it is doing)."""
        refs = [ref for ref, w in self.pending.items() if w in busy]
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=self.timeout_s)
        if not ready:
            raise WorkerLost(_late(self, busy, self.timeout_s, "; enough free CPUs/GPUs?"))
        w = self.pending.pop(ready[0])
        try:
            return w, self.ray.get(ready[0])
        except self.ray.exceptions.RayActorError as err:
            first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
            raise WorkerLost({w: f"{self.describe(w)} died while {busy[w]}: {first}"}) from None

    def respawn(self, w: int) -> None:
        """Worker ``w`` is lost: kill its actor (its calls are forgotten) and start a fresh
        one in its place, which knows nothing yet (it needs ``init``)."""
        self.ray.kill(self.actors[w])
        self.pending = {ref: v for ref, v in self.pending.items() if v != w}
        self.actors[w] = self.actor.remote()

    def close(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors, self.pending = [], {}
        if self.started:
            self.ray.shutdown()


def _late(pool, busy: dict[int, str], timeout_s: float, hint: str = "") -> dict[int, str]:
    """Each of the ``busy`` workers that did not answer in time, with a line saying so."""
    return {
        w: f"no answer within parallel.timeout_s={timeout_s:g} s ({pool.describe(w)} {what}){hint}"
        for w, what in busy.items()
    }

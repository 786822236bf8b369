"""The worker side of ``executor: parallel``: a process (or Ray actor) that trains units.

A :class:`UnitWorker` holds what it was sent once — the model's architecture, the training
hyperparameters and the data partitions of the clients it serves — and, per round, the global
model and the plan. It trains each unit (one group of the round) it is dealt with the same
code as the sequential executor (:func:`~splitfl.executors.sequential.run_unit`: the
:class:`~splitfl.executors.roles.DeviceRole` s and the group's
:class:`~splitfl.executors.roles.ServerRole` of :mod:`splitfl.executors.roles`) and sends
back the members' updates and the server copy's state.

Messages are lists of operations, each encoded with :func:`encode` (``torch.save``); the
worker answers the last one. The pipes of ``backend: local`` connect processes of this
machine started by the driver (trusted), so they carry pickles; nothing here listens on a
network (local processes: :mod:`splitfl.executors.worker_process`).
"""

from __future__ import annotations

import io
import os
import resource
import socket
import time
import traceback
from typing import Any

import numpy as np
import torch

from splitfl.executors.fleet import GroupRun, StartParts
from splitfl.executors.roles import Runtime
from splitfl.executors.sequential import device_maker, round_model, run_unit
from splitfl.seeding import derive_seed


def encode(obj: Any) -> bytes:
    """``obj`` (tensors, dataclasses, containers) as bytes (``torch.save``)."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def decode(blob: bytes) -> Any:
    """What :func:`encode` made. Full unpickling, so only bytes splitfl itself produced reach
    it: the ``local`` backend's messages travel over a ``socket.socketpair()`` (an unnamed
    Unix socket between the driver and the worker processes it spawned; nothing on a network
    can write to it), the ``ray`` backend's as arguments of the driver's own actor calls inside
    the Ray cluster the user started (Ray unpickles those itself). Device processes and the
    networked executor never use this: their bytes are checked by :mod:`splitfl.net.wire`."""
    return torch.load(io.BytesIO(blob), weights_only=False)


def send_message(sock: socket.socket, parts: list[bytes]) -> None:
    """A message on a stream socket: the part count, then each part's length and bytes (the
    socket's timeout bounds the whole send)."""
    sock.sendall(len(parts).to_bytes(8, "little"))
    for part in parts:
        sock.sendall(len(part).to_bytes(8, "little"))
        sock.sendall(part)


def recv_message(sock: socket.socket) -> list[bytes]:
    """A message :func:`send_message` sent; EOFError when the other end closed the socket."""
    count = int.from_bytes(_recv_exact(sock, 8), "little")
    return [_recv_exact(sock, int.from_bytes(_recv_exact(sock, 8), "little")) for _ in range(count)]


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        chunk = sock.recv_into(view[got:])
        if not chunk:
            raise EOFError("the other end closed the connection")
        got += chunk
    return bytes(buffer)


def peak_rss() -> int:
    """This process's peak resident memory in bytes: ``VmHWM`` (Linux; reset by ``exec``,
    unlike ``ru_maxrss``, which a worker process would inherit from the driver that started
    it), else ``ru_maxrss``."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class UnitWorker:
    """One worker's state and its operations (``init``, ``data``, ``setup``, ``unit``)."""

    def __init__(self) -> None:
        self.data: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.round: dict[str, Any] = {}

    def handle(self, ops: list[bytes]) -> bytes:
        """Apply the operations in order; the answer to the last one, or the error that
        stopped them (its type, message and traceback)."""
        answer: dict[str, Any] = {"ok": True}
        try:
            for blob in ops:
                op = decode(blob)
                answer = getattr(self, "op_" + op.pop("op"))(**op)
        except Exception as err:  # noqa: BLE001 - reported to the driver, which raises it
            answer = {
                "ok": False,
                "type": type(err).__name__,
                "message": str(err),
                "traceback": traceback.format_exc(),
            }
        answer["peak_rss"] = peak_rss()
        return encode(answer)

    def op_init(
        self, model, train, device: str, precision: str, channels_last: bool, threads, augment=None
    ):
        """The model's architecture (a template), the training hyperparameters, where to run,
        the training batches' augmentation (``data.transforms``)."""
        torch.set_num_threads(threads)
        self.template, self.train = model, train
        self.runtime = Runtime(torch.device(device), precision, channels_last, augment)
        return {"ok": True, "pid": os.getpid()}

    def op_data(self, partitions: dict[int, tuple[torch.Tensor, torch.Tensor]]):
        """Clients' samples ``(x, y)``, kept for every later round."""
        self.data.update(partitions)
        return {"ok": True}

    def op_setup(self, global_state, plan, round_seed: int):
        """A round: the global model every unit starts from and the plan's shared fields."""
        rt = self.runtime
        model = round_model(self.template, global_state, rt.device, rt.channels_last)
        self.round = {"model": model, "plan": plan, "seed": round_seed}
        return {"ok": True}

    def op_unit(self, group: int, tasks, aux):
        """Train one group of the round: its updates and server state, and the seconds."""
        start = time.perf_counter()
        model, plan, seed = self.round["model"], self.round["plan"], self.round["seed"]
        rt = self.runtime
        starts = StartParts(model)
        parts = {t.client: starts.of(t) for t in tasks}
        aux = {c: {k: v.to(rt.device) for k, v in s.items()} for c, s in aux.items()}
        run = GroupRun(group, tasks, parts, aux)
        make = device_maker(model, self.train, self._data_of, seed, rt)
        gen = np.random.default_rng(derive_seed(seed, "mix"))  # never dealt: mixup is coupled
        updates, server_state = run_unit(model, run, plan, self.train, rt, gen, make, seed)
        seconds = time.perf_counter() - start
        return {"ok": True, "updates": updates, "server_state": server_state, "seconds": seconds}

    def _data_of(self, client: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """A client's samples with positions as its indices: the sequential executor's
        batches ``x_all[indices[perm]]`` are this client's ``x[perm]``."""
        x, y = self.data[client]
        return x, y, np.arange(len(y))

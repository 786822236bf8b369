"""The worker side of ``executor: parallel``: a process (or Ray actor) that trains units.

A :class:`UnitWorker` holds what it was sent once — the run's config (it builds the model
and takes the training hyperparameters from it) and the data partitions of the clients it
serves — and, per round, the global model (loaded into one working model) and the plan. It
trains each unit (one group of the round) it is dealt with the same code as the sequential
executor (:func:`~splitfl.executors.sequential.run_unit`: the
:class:`~splitfl.roles.sides.DeviceRole` s and the group's
:class:`~splitfl.roles.sides.ServerRole` of :mod:`splitfl.roles.sides`) and sends
back the members' updates and the server copy's state.

Messages are lists of operations, each a :mod:`splitfl.executors.channel` message (a JSON
header and raw tensor bytes, checked when read; nothing is unpickled); the worker answers
the last one. Local processes: :mod:`splitfl.executors.worker_process`.
"""

from __future__ import annotations

import os
import resource
import socket
import time
import traceback
from typing import Any

import numpy as np
import torch

from splitfl.core.framing import Frame, Message
from splitfl.core.seeding import derive_seed
from splitfl.executors import channel
from splitfl.executors.channel import ChannelError, Init
from splitfl.executors.sequential import run_unit, working_model
from splitfl.extensions import build_model, import_config_modules
from splitfl.models.registry import Split
from splitfl.roles.cut_record import RelayTap
from splitfl.roles.fleet import GroupRun, StartParts
from splitfl.roles.parts import PartPool, load_state
from splitfl.roles.sides import Runtime
from splitfl.topologies import UnitEnv, family_of

#: Most frames in one message, and largest frame accepted from the other end of a socket.
MAX_FRAMES, MAX_FRAME_BYTES = 64, 1 << 40


def send_message(sock: socket.socket, frames: list[Frame | bytes]) -> None:
    """A message on a stream socket: the frame count, then each frame's length and bytes, its
    parts written as they are (no joined copy; the socket's timeout bounds the whole send)."""
    sock.sendall(len(frames).to_bytes(8, "little"))
    for frame in frames:
        sock.sendall(len(frame).to_bytes(8, "little"))
        for part in frame.parts if isinstance(frame, Frame) else [frame]:
            sock.sendall(part)


def recv_message(sock: socket.socket) -> list[bytearray]:
    """A message :func:`send_message` sent, each frame in a buffer of its own (decoded in
    place); EOFError when the other end closed the socket, ChannelError for a count or a
    length beyond the limits."""
    count = int.from_bytes(_recv_exact(sock, 8), "little")
    if count > MAX_FRAMES:
        raise ChannelError(f"a message of {count} frames (at most {MAX_FRAMES})")
    frames = []
    for _ in range(count):
        size = int.from_bytes(_recv_exact(sock, 8), "little")
        if size > MAX_FRAME_BYTES:
            raise ChannelError(f"a frame of {size} bytes (at most {MAX_FRAME_BYTES})")
        frames.append(_recv_exact(sock, size))
    return frames


def _recv_exact(sock: socket.socket, n: int) -> bytearray:
    buffer = bytearray(n)
    view, got = memoryview(buffer), 0
    while got < n:
        chunk = sock.recv_into(view[got:])
        if not chunk:
            raise EOFError("the other end closed the connection")
        got += chunk
    return buffer


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
        self.init: Init | None = None

    def handle(self, ops: list[bytes | bytearray]) -> Frame:
        """Apply the operations in order; the answer to the last one, or the error that
        stopped them (its type, message and traceback)."""
        answer: Frame | None = None
        try:
            for blob in ops:
                msg = channel.read(blob, channel.OPERATIONS)
                if msg.type != "init" and self.init is None:
                    raise ChannelError(f"{msg.type!r} before 'init'")
                answer = getattr(self, "op_" + msg.type)(msg)
            return answer or channel.ok_answer(peak_rss())
        except Exception as err:  # noqa: BLE001 - reported to the driver, which raises it
            return channel.error_answer(err, traceback.format_exc(), peak_rss())

    def op_init(self, msg: Message) -> Frame:
        """Build the run's model (``config.model``, with the config's ``imports``) as the
        driver's: same architecture, same dtype; the training hyperparameters, where to run,
        the training batches' augmentation (``data.transforms``)."""
        init = channel.read_init(msg)
        torch.set_num_threads(init.threads)
        import_config_modules(init.config)
        c = init.config
        built = build_model(
            c.model, init.input_shape, init.num_classes, Split.of(c.split), c.train.lora, hf=c.hf
        )
        if repr(built) != init.architecture:
            raise ChannelError(differs(repr(built), init.architecture, init.config.model))
        self.runtime = Runtime(
            torch.device(init.device), init.precision, init.channels_last, init.augment
        )
        self.model = working_model(built.to(init.dtype), self.runtime.device, init.channels_last)
        self.specs = channel.specs_of(self.model.state_dict())
        self.pool, self.init = PartPool(), init
        return channel.ok_answer(peak_rss(), pid=os.getpid())

    def op_data(self, msg: Message) -> Frame:
        """Clients' samples ``(x, y)``, kept for every later round."""
        self.data.update(channel.read_data(msg, self.init.input_shape))
        return channel.ok_answer(peak_rss())

    def op_setup(self, msg: Message) -> Frame:
        """A round: the global model every unit starts from and the plan (without its tasks)."""
        state, plan, seed = channel.read_setup(msg, self.specs)
        load_state(self.model, state)
        self.model.train()
        self.round = {"plan": plan, "seed": seed, "starts": StartParts(self.model)}
        return channel.ok_answer(peak_rss())

    def op_unit(self, msg: Message) -> Frame:
        """Train one group of the round: its updates and server state, and the seconds."""
        start = time.perf_counter()
        group, tasks, aux = channel.read_unit(msg, self.specs, self.init.num_classes)
        record = channel.read_unit_record(msg)
        tap = None if record is None else RelayTap(record[0], frozenset(record[1]))
        if not self.round:
            raise ChannelError("'unit' before 'setup'")
        missing = sorted({t.client for t in tasks} - self.data.keys())
        if missing:
            raise ChannelError(f"unit: no data for clients {missing[:5]}")
        model, plan, seed, rt = self.model, self.round["plan"], self.round["seed"], self.runtime
        family = family_of(plan)
        parts = {t.client: family.start_of(self.round["starts"], t, plan) for t in tasks}
        aux = {c: {k: v.to(rt.device) for k, v in s.items()} for c, s in aux.items()}
        run = GroupRun(group, tasks, parts, aux)
        env = UnitEnv(
            model=model,
            plan=plan,
            train=self.init.config.train,
            runtime=rt,
            gen=np.random.default_rng(derive_seed(seed, "mix")),  # never dealt: mixup is coupled
            round_seed=seed,
            data_of=self._data_of,
            pool=self.pool,
            tap=tap,
        )
        updates, server = run_unit(family, run, env)
        seconds = time.perf_counter() - start
        recorded = None if tap is None else tap.items
        return channel.trained_answer(updates, server, seconds, peak_rss(), recorded)

    def _data_of(self, client: int) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """A client's samples with positions as its indices: the sequential executor's
        batches ``x_all[indices[perm]]`` are this client's ``x[perm]``."""
        x, y = self.data[client]
        return x, y, np.arange(len(y))


def differs(built: str, driver: str, spec: str) -> str:
    """Why a worker refuses the driver's model: the first line where the architectures differ."""
    pairs = zip(built.splitlines() + [""], driver.splitlines() + [""], strict=False)
    mine, theirs = next((a, b) for a, b in pairs if a != b)
    return (
        f"config.model {spec!r} builds {mine.strip()!r} where the driver's model has "
        f"{theirs.strip()!r}: the workers build the model from the config, so a model "
        "changed after it was built cannot reach them (give it as config.model)"
    )

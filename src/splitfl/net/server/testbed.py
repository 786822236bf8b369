"""A networked run on this machine with devices in threads of this process (tests, notebooks).

:class:`Testbed` writes a tokens file for named devices on a free loopback port; its
:meth:`Testbed.device` starts a :class:`~splitfl.net.device.session.DeviceThread` and
:meth:`Testbed.server_overrides` are the config values that make a run the server of those
devices (``executor: networked``, ``network.devices: 0``). The traffic is real gRPC over
loopback; only the process boundary is missing (``splitfl launch`` has it).
:class:`FreezingRelay` stands between devices and the server to cut their links (a partition:
bytes swallowed, not a reset), for link-break tests and ``benchmarks/bench_attacks.py``.
"""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from splitfl.net.device.agent import DeviceOptions
from splitfl.net.device.session import DeviceThread, start_in_thread
from splitfl.net.transport.auth import new_token, token_hash


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Testbed:
    """Tokens and address for thread devices (``tokens_file`` is the server's)."""

    __test__ = False  # not a pytest test class

    #: ``network.round_deadline_min_s`` of every run :meth:`server_overrides` makes, unless
    #: the call names it (None: the config's default, 2 s). splitfl's own test suite raises
    #: it (tests/conftest.py): on a busy machine an honest round of a test can take longer
    #: than 2 s, and the deadline would drop every client of it.
    round_deadline_min_s: ClassVar[float | None] = None

    folder: Path
    port: int
    tokens: dict[str, str]

    @property
    def tokens_file(self) -> Path:
        return self.folder / "tokens.txt"

    @classmethod
    def create(cls, folder: Path, names: list[str]) -> Testbed:
        folder.mkdir(parents=True, exist_ok=True)
        tokens = {name: new_token() for name in names}
        lines = [f"{name}:{token_hash(token)}" for name, token in tokens.items()]
        (folder / "tokens.txt").write_text("\n".join(lines) + "\n")
        return cls(folder, free_port(), tokens)

    def server_overrides(self, **network: Any) -> dict[str, Any]:
        base = {
            "executor": "networked",
            "network.devices": 0,
            "network.listen": f"127.0.0.1:{self.port}",
            "network.tokens": str(self.tokens_file),
            "network.timeout_s": 30.0,
            "network.connect_timeout_s": 60.0,
        }
        if self.round_deadline_min_s is not None:
            base["network.round_deadline_min_s"] = self.round_deadline_min_s
        return {**base, **{f"network.{k}": v for k, v in network.items()}}

    def device(
        self, name: str, clients: list[int], agent_cls: type | None = None, **opts: Any
    ) -> DeviceThread:
        retry_s = opts.pop("retry_s", 30.0)
        options = DeviceOptions(
            server=f"{opts.pop('host', '127.0.0.1')}:{self.port}",
            name=name,
            token=opts.pop("token", self.tokens.get(name, "")),
            clients=tuple(clients),
            retry_s=retry_s,
            # a test bed's server does not come back after its run: a device it dropped or
            # said bye to gives up after retry_s, not DeviceOptions' hours-long resume wait
            resume_wait_s=opts.pop("resume_wait_s", retry_s),
            **opts,
        )
        return start_in_thread(options, agent_cls)


class FreezingRelay:
    """A TCP relay on loopback to ``target`` that can go silent: while ``frozen`` is set,
    bytes are swallowed in both directions and new connections are held unanswered (a
    partition, not a reset). Devices dial ``127.0.0.1:<port>``; :meth:`stop` closes it."""

    def __init__(self, target: int):
        self.target, self.port = target, free_port()
        self.frozen = threading.Event()
        self.stopped = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self.listener.settimeout(0.2)
        self.sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                near, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            while self.frozen.is_set() and not self.stopped.is_set():
                time.sleep(0.1)  # a partition: the connection hangs
            try:
                far = socket.create_connection(("127.0.0.1", self.target))
            except OSError:  # the server is not listening yet: the caller redials
                near.close()
                continue
            self.sockets += [near, far]
            for a, b in ((near, far), (far, near)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                if not self.frozen.is_set():
                    dst.sendall(data)
        except OSError:
            pass

    def stop(self) -> None:
        self.stopped.set()
        for s in self.sockets:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

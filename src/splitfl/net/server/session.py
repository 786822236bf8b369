"""A networked run's server session: the hub, its credentials and any local device processes.

:class:`NetworkSession` reads the ``network`` section: it loads the tokens file (or, for device
processes it starts itself, makes one token per process in a private temporary folder), the
TLS key and certificate, starts the :class:`~splitfl.net.transport.hub.Hub`, starts
``network.devices`` device processes on this machine (``splitfl launch``), waits for enough devices
(a line ``waiting for devices k/N`` on stderr as they come) and writes ``network.json`` (address,
local device processes) into the run directory; ``audit.log`` there gets one line per
refusal, dropped link and reconnection (:class:`~splitfl.net.transport.guard.Audit`). Devices are
welcomed with the run's config less the server's own ``network`` and ``output`` sections
(:func:`device_config`: no paths of the tokens file, keys or run directories).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from splitfl.config import ConfigError, ExperimentConfig
from splitfl.data.local import launch_format
from splitfl.extensions import child_env
from splitfl.net.transport.auth import AuthSetupError, TokenBook, new_token, server_credentials
from splitfl.net.transport.connections import ConnectionTally
from splitfl.net.transport.guard import Audit
from splitfl.net.transport.hub import Hub, HubSettings


def deal_block(num_clients: int, need: int, bound: dict[str, frozenset[int]], names: int) -> int:
    """How many clients the server deals a device that names none and has no bound clients:
    ⌈clients / need⌉; when the tokens file names exactly the ``need`` devices awaited
    (``names <= need``), the clients bound to no token shared among the unbound devices, so
    a bound token's few clients do not leave the rest unhosted (at least 1)."""
    bound = {name: {c for c in ids if 0 <= c < num_clients} for name, ids in bound.items()}
    bound = {name: ids for name, ids in bound.items() if ids}
    if names > need or not bound:
        return math.ceil(num_clients / need)
    taken = set().union(*bound.values())
    return max(1, math.ceil((num_clients - len(taken)) / max(1, need - len(bound))))


#: Audit events the server's console shows too (one line each): a device's link dropped, and
#: a device back after one (its join is counted by "waiting for devices k/n").
CONSOLE_EVENTS = ("dropped", "reconnected")


def console_line(line: str) -> None:
    """An audit line (``<UTC time> <event> peer=<address> <detail>``) of
    :data:`CONSOLE_EVENTS` on stderr, as ``splitfl server: <event> ...``."""
    _, event, rest = (line.split(" ", 2) + ["", ""])[:3]
    if event in CONSOLE_EVENTS:
        print(f"splitfl server: device {event}: {rest}", file=sys.stderr, flush=True)


class StartError(ConfigError):
    """The server side could not start: listen address, TLS files, tokens, too few devices
    or announcements in time (a one-line error, exit 2). A fresh run removes the run
    directory it created (:func:`splitfl.experiment.run`); a resumed one is left as it was,
    to be resumed again once the devices are back."""


class NoDevicesError(StartError):
    """Too few devices connected in time."""


#: The ``network`` fields a device is told (:func:`device_config`).
DEVICE_NETWORK_FIELDS = ("bounds", "trust", "untrusted_aggregation")


def device_config(config: ExperimentConfig) -> dict:
    """What a device is told of the run's config: all but the server's ``output`` section and
    its ``network`` section, of which only what a top worker needs is sent: ``bounds`` (what
    it checks its members' replies against), ``trust`` and ``untrusted_aggregation`` (the
    rule it averages them with, the server's: :meth:`~splitfl.aggregation.robust.Rule.of_run`);
    the device keeps its own defaults for the rest (no paths of the tokens file, keys or run
    directories). ``import_dirs`` (the server's folders) stays
    behind too: a device imports from its own environment."""
    fields = config.to_dict()
    out = {k: v for k, v in fields.items() if k not in ("network", "output", "import_dirs")}
    out["network"] = {k: fields["network"][k] for k in DEVICE_NETWORK_FIELDS}
    return out


def hub_settings(n, names: int = 0) -> HubSettings:
    """The hub's limits from the config's ``network`` section; the unauthenticated slots
    grow with the devices expected (2 per device awaited or named in the tokens file)."""
    expected = max(n.devices, n.min_devices or 0, names)
    return HubSettings(
        max_message_bytes=int(n.max_message_mb * 2**20),
        chunk_bytes=n.chunk_kb * 1024,
        rate_limit=n.rate_limit,
        auth_timeout_s=n.auth_timeout_s,
        max_hello_bytes=n.max_hello_kb * 1024,
        max_pending=max(n.max_pending, 2 * expected),
        max_links=max(n.max_devices, n.devices),
        auth_failures=n.auth_failures,
        keepalive_s=n.keepalive_s,
    )


class NetworkSession:
    """Start/stop the server side of a networked run."""

    def __init__(
        self, config: ExperimentConfig, num_clients: int, run_dir: Path, data: dict | None = None
    ):
        """``data``: the model's ``input_shape`` and ``num_classes``, whether the devices bring
        their own data (``own``) and the server's ``histogram_epsilon`` (sent in the welcome;
        the hub checks the devices' announcements against it)."""
        self.config, self.num_clients, self.run_dir = config, num_clients, Path(run_dir)
        self.data = data
        self.net = config.network
        self.hub: Hub | None = None
        self.procs: list[tuple[str, list[int], subprocess.Popen]] = []
        self.tmp: tempfile.TemporaryDirectory | None = None
        self.address = ""

    def start(self) -> None:
        n = self.net
        try:
            book = TokenBook.read(n.tokens) if n.tokens else TokenBook()
            tally = ConnectionTally()  # connections that never opened a stream, audited
            creds = server_credentials(n.tls_cert, n.tls_key, tally) if n.tls_cert else None
        except AuthSetupError as err:
            raise StartError("network", str(err)) from None
        if n.devices:
            self.tmp = tempfile.TemporaryDirectory(prefix="splitfl-tokens-")
        tokens = {}
        for i in range(n.devices):
            tokens[f"local-{i}"] = new_token()
            book.add(f"local-{i}", tokens[f"local-{i}"])
        self.need = n.min_devices or n.devices or 1
        if not book.hashes:
            raise StartError("network.tokens", "no device can connect: give a tokens file")
        need = self.need
        welcome = {"config": device_config(self.config)}
        welcome["block"] = deal_block(self.num_clients, need, book.bound, len(book.hashes))
        if self.data is not None:
            welcome["data"] = self.data
        audit = Audit(self.run_dir / "audit.log", sink=console_line)
        settings = hub_settings(n, len(book.hashes))
        self.hub = Hub(settings, book, self.num_clients, welcome, audit, tally)
        host = n.listen.rpartition(":")[0]
        try:
            port = self.hub.start(n.listen, creds)
        except (OSError, RuntimeError) as err:
            raise StartError("network.listen", f"cannot listen on {n.listen}: {err}") from None
        self.address = f"{host}:{port}"
        self._spawn(tokens, port)
        self._wait(need)
        self._wait_data()
        self._write_info()

    def _spawn(self, tokens: dict[str, str], port: int) -> None:
        """Start the local device processes (clients dealt round-robin)."""
        n, logs = self.net, self.run_dir / "devices"
        if not tokens:
            return
        logs.mkdir(parents=True, exist_ok=True)
        host = "localhost" if n.tls_cert else "127.0.0.1"
        env = child_env(self.config)  # they find the run's modules where the server did
        for i, (name, token) in enumerate(tokens.items()):
            token_file = Path(self.tmp.name) / f"{name}.token"
            token_file.write_text(token)
            os.chmod(token_file, 0o600)
            clients = [k for k in range(self.num_clients) if k % n.devices == i]
            cmd = [sys.executable, "-m", "splitfl.net.device.cli", "--server", f"{host}:{port}"]
            cmd += ["--name", name, "--token-file", str(token_file), "--retry-s", "10"]
            if n.data_dir:  # the device's own files name its clients
                folder = Path(n.data_dir) / name
                fmt = launch_format(folder, self.config.data.format)
                cmd += ["--data", str(folder), "--format", fmt]
            else:
                cmd += ["--client-id", ",".join(map(str, clients))]
            cmd += ["--max-message-mb", str(n.max_message_mb)]
            if n.tls_cert:
                cmd += ["--ca-cert", n.ca_cert or n.tls_cert]
            if n.compression != "none":
                cmd += ["--compression", n.compression]
            with open(logs / f"{name}.log", "w") as log:  # the child keeps its own handle
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
            self.procs.append((name, clients, proc))

    def _wait(self, need: int) -> None:
        start = time.monotonic()
        shown = -1
        while True:
            ready = len(self.hub.live())
            if ready != shown and ready < need:
                print(f"waiting for devices {ready}/{need}", file=sys.stderr, flush=True)
                shown = ready
            try:
                self.hub.wait_for(need, 1.0)
                return
            except TimeoutError:
                dead = [(name, p.returncode) for name, _, p in self.procs if p.poll() is not None]
                waited = time.monotonic() - start
                limit = self.net.connect_timeout_s  # 0: wait for ever
                if dead or (limit and waited > limit):
                    ready = len(self.hub.live())
                    self.stop()
                    if dead:  # one line: which device ended, and the last line it wrote
                        raise NoDevicesError(
                            "network.devices",
                            f"{ready} of {need} devices ready after {waited:.0f} s; device "
                            f"processes exited: {self._exits(dead)}",
                        ) from None
                    raise NoDevicesError(
                        "network.min_devices",
                        f"{ready} of {need} devices ready after {self.net.connect_timeout_s:g} s",
                    ) from None

    def _wait_data(self) -> None:
        """``data.source: devices``: every client's data must be announced before the first
        round (the algorithm plans with every client's sample count and histogram)."""
        if not (self.data or {}).get("own"):
            return
        missing = self.hub.wait_announced(self.net.connect_timeout_s)
        if missing:
            self.stop()
            raise StartError(
                "network.connect_timeout_s",
                f"no device announced the data of clients {missing[:20]} within "
                f"{self.net.connect_timeout_s:g} s (data.num_clients={self.num_clients})",
            )

    def _exits(self, dead: list[tuple[str, int]]) -> str:
        """``name (exit code: last line of its log)`` for each ended device process."""
        out = []
        for name, code in dead:
            try:
                lines = (self.run_dir / "devices" / f"{name}.log").read_text().splitlines()
            except OSError:
                lines = []
            last = next((x.strip() for x in reversed(lines) if x.strip()), "")
            out.append(f"{name} (exit {code}{': ' + last if last else ''})")
        return "; ".join(out)

    def wait_ready(self) -> None:
        """Before a round: wait (up to ``rejoin_s``) until ``min_devices`` devices are ready
        again — a device that lost its link reconnects by itself; one that does not come back
        only costs its clients the round (they are recorded as dropped)."""
        try:
            self.hub.wait_for(self.need, self.net.rejoin_s)
        except TimeoutError:
            pass

    def _write_info(self) -> None:
        devices = [{"name": n, "pid": p.pid, "clients": c} for n, c, p in self.procs]
        info = {"address": self.address, "local_devices": devices}
        (self.run_dir / "network.json").write_text(json.dumps(info, indent=1) + "\n")

    def stop(self) -> None:
        """Say bye to the devices, stop listening, end the local device processes."""
        if self.hub is not None:
            self.hub.stop()
            self.hub = None
        for _, _, proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []
        if self.tmp is not None:
            self.tmp.cleanup()
            self.tmp = None

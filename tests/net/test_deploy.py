"""Deployment rough edges of the networked runtime (issue 34, items 2, 3, 5), on loopback.

Devices with their own data as docs/how-to/devices-own-data.md shows them (a server that reads
only its test set needs no ``data.root``; ``launch --data-dir`` runs as written), a device whose
data format needs a package it lacks (one line naming the extra, exit 2), the server's wait for
devices (``--wait-devices-s``, 0 = for ever), a failed server start removing its run directory,
a device and a server of which only one speaks TLS (one line each way, exit 2), TLS files
checked before binding, ``--server`` without a port, and who trained which client per round
(``measured_device`` in the rows, ``rounds`` in ``devices.json``). Each networked test binds
its own loopback port, bounds its waits and stops what it starts.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import tomllib
from pathlib import Path

import numpy as np
import pytest
import yaml

import splitfl
from splitfl.cli.main import main as cli_main
from splitfl.config import ConfigError
from splitfl.core.plan import ClientTask, RoundPlan, RoundResult
from splitfl.data.base import DatasetError
from splitfl.data.formats.packages import FORMAT_MODULES, PACKAGES
from splitfl.data.local import load_local
from splitfl.experiment.device_data import write_devices
from splitfl.experiment.round_step import measured_row
from splitfl.experiment.runner import as_config, prepare
from splitfl.net.server.session import NetworkSession
from splitfl.net.server.testbed import Testbed
from splitfl.net.transport.auth import AuthSetupError, channel_credentials, server_credentials
from splitfl.net.transport.certs import write_self_signed
from splitfl.testing import config_for

ROOT = Path(__file__).resolve().parents[2]
OWN = {"data.source": "devices"}
ENV = {**os.environ, "PYTHONPATH": str(ROOT / "src")}


def _digits_parts(folder: Path, clients: int = 4, per_client: int = 30) -> Path:
    """A server test set and ``local-<i>/<client>.npz`` for two devices (digits-shaped)."""
    rng = np.random.default_rng(0)
    for k in range(clients):
        (folder / f"local-{k % 2}").mkdir(parents=True, exist_ok=True)
        x = rng.normal(size=(per_client, 1, 8, 8)).astype(np.float32)
        y = np.arange(per_client) % 10
        np.savez(folder / f"local-{k % 2}" / f"{k}.npz", x=x, y=y)
    test = folder / "test.npz"
    x = rng.normal(size=(40, 1, 8, 8)).astype(np.float32)
    np.savez(test, x=x, y=np.arange(40) % 10, num_classes=10)
    return test


# ------------------------------------------------------------------ 2: own data as documented


@pytest.mark.parametrize("fmt", ["npz", None])
def test_server_with_only_a_test_set_needs_no_data_root(tmp_path, fmt):
    """``data.source: devices`` with ``data.test_path``: the server reads only the test set,
    so neither ``data.root`` nor a registered ``data.dataset`` is demanded."""
    test = _digits_parts(tmp_path)
    changes = {**OWN, "executor": "networked", "data.dataset": "my_data"}
    changes |= {"data.test_path": str(test), "data.format": fmt}
    ctx = prepare(as_config(config_for("fedavg", **changes))).ctx
    assert len(ctx.bundle.test) == 40 and len(ctx.bundle.train) == 0
    with pytest.raises(ConfigError, match="data.root"):  # without a test set it reads root
        as_config(config_for("fedavg", **{**changes, "data.test_path": None, "data.format": "npz"}))


def test_readme_own_data_launch_runs_as_written(tmp_path):
    """``splitfl launch my.yaml --devices 2 --data-dir parts``: a config naming its own data
    (``dataset: my_data``, ``format: npz``, ``test_path``) and no ``data.root`` runs."""
    test = _digits_parts(tmp_path / "parts")
    config = config_for("fedavg", rounds=1, **{"data.num_clients": 4})
    config["data"] |= {"dataset": "my_data", "format": "npz", "test_path": str(test)}
    config["train"]["clients_per_round"] = 4
    (tmp_path / "my.yaml").write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "splitfl", "launch", "my.yaml", "--devices", "2"]
    cmd += ["--data-dir", "parts", "--out", "net", "--no-progress"]
    done = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    record = json.loads((tmp_path / "net" / "devices.json").read_text())
    assert [d["name"] for d in record["devices"]] == ["local-0", "local-1"]
    assert record["rounds"] == [{"round": 1, "trained": {"local-0": [0, 2], "local-1": [1, 3]}}]


# ------------------------------------------------------------------ 3: optional packages


def test_every_extra_named_for_a_format_is_defined_in_pyproject():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = extras["optional-dependencies"]
    for requirement, extra in PACKAGES.values():
        assert requirement in extras[extra], (requirement, extra)
    assert set(FORMAT_MODULES) == {"image_folder", "hf", "parquet"}


def test_device_without_pillow_says_which_extra_in_one_line_and_exits_2(tmp_path):
    """A minimal device install lacks Pillow: ``--data`` of image folders is one line naming
    the package and the extra (not an ImportError traceback), exit 2, before connecting."""
    for c in ("a", "b"):
        (tmp_path / "pets" / c).mkdir(parents=True)
        (tmp_path / "pets" / c / "0.png").write_bytes(b"not read")
    (tmp_path / "t.token").write_text("x" * 32)
    code = "import sys; sys.modules['PIL'] = None\n"
    code += (
        "from splitfl.net.device import cli as device_cli; sys.exit(device_cli.main(sys.argv[1:]))"
    )
    cmd = [sys.executable, "-c", code, "--server", "127.0.0.1:9", "--name", "d0"]
    cmd += ["--token-file", "t.token", "--data", "pets", "--format", "image_folder"]
    done = subprocess.run(cmd, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    assert "image_folder needs the Pillow package" in lines[0]
    assert "pip install 'pillow>=9'" in lines[0] and "[images]" in lines[0]


@pytest.mark.parametrize("fmt, module", [("parquet", "datasets"), ("hf", "datasets")])
def test_missing_datasets_package_is_one_line_naming_the_hf_extra(
    tmp_path, monkeypatch, fmt, module
):
    monkeypatch.setitem(sys.modules, module, None)
    with pytest.raises(DatasetError) as err:
        load_local(tmp_path, fmt)
    assert "needs the datasets package" in str(err.value) and "[hf]" in str(err.value)
    assert "\n" not in str(err.value)


# ------------------------------------------------------------------ 5: server start


def test_wait_devices_flag_sets_the_wait_and_zero_waits_for_ever(tmp_path):
    bed = Testbed.create(tmp_path / "bed", ["a"])
    net = bed.server_overrides(min_devices=1, connect_timeout_s=0)
    config = as_config(config_for("splitfed_v1", rounds=1, **net))
    assert config.network.connect_timeout_s == 0
    session = NetworkSession(config, 4, tmp_path / "run")
    (tmp_path / "run").mkdir()
    errors: list[BaseException] = []

    def start() -> None:
        try:
            session.start()
        except BaseException as err:  # noqa: BLE001 (reported by the assertion below)
            errors.append(err)

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    device = None
    try:
        time.sleep(2.5)  # longer than any limit 0 could be read as
        assert starter.is_alive() and not errors
        device = bed.device("a", [], retry_s=20.0)
        starter.join(30)
        assert not starter.is_alive() and not errors
    finally:
        session.stop()
        if device is not None:
            device.join(30)
    assert device.code == 0


def _server_argv(tmp_path: Path, bed: Testbed, *extra: str) -> list[str]:
    config = tmp_path / "c.yaml"
    config.write_text(yaml.safe_dump(config_for("splitfed_v1", rounds=1)))
    argv = ["server", str(config), "--listen", f"127.0.0.1:{bed.port}"]
    argv += ["--tokens", str(bed.tokens_file), "--no-progress", *extra]
    return argv


def test_server_command_waits_as_long_as_wait_devices_s(tmp_path, capsys):
    """``--wait-devices-s 1``: one line after about a second, and the run directory it
    created is removed (nothing of the failed start is left)."""
    bed = Testbed.create(tmp_path / "bed", ["a"])
    out = tmp_path / "runs" / "r"
    start = time.monotonic()
    code = cli_main(_server_argv(tmp_path, bed, "--wait-devices-s", "1", "--out", str(out)))
    assert code == 2 and time.monotonic() - start < 30
    err = capsys.readouterr().err
    assert "0 of 1 devices ready after 1 s" in err
    assert not out.exists()


def test_failed_server_start_removes_the_run_directory(tmp_path, capsys):
    """A port in use: one line, exit 2, and no run directory left under ``output.out_dir``."""
    bed = Testbed.create(tmp_path / "bed", ["a"])
    with socket.socket() as held:
        held.bind(("127.0.0.1", bed.port))
        held.listen()
        runs = tmp_path / "runs"
        code = cli_main(_server_argv(tmp_path, bed, f"output.out_dir={runs}"))
    assert code == 2
    assert "cannot listen on" in capsys.readouterr().err
    assert not runs.exists() or not any(runs.iterdir())


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> tuple[Path, Path]:
    pytest.importorskip("cryptography")
    return write_self_signed(tmp_path_factory.mktemp("certs"), ["localhost", "127.0.0.1"], 2)


def test_swapped_tls_files_are_named_before_binding(tmp_path, certs, capsys):
    cert, key = certs
    with pytest.raises(AuthSetupError, match="swapped") as err:
        server_credentials(key, cert)
    assert str(key) in str(err.value) and str(cert) in str(err.value)
    with pytest.raises(AuthSetupError, match="no PEM PRIVATE KEY"):
        server_credentials(cert, cert)
    server_credentials(cert, key)  # the right way round
    bed = Testbed.create(tmp_path / "bed", ["a"])
    runs = tmp_path / "runs"
    argv = _server_argv(tmp_path, bed, "--tls-cert", str(key), "--tls-key", str(cert))
    assert cli_main([*argv, f"output.out_dir={runs}"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "swapped" in lines[-1] and "Failed to bind" not in lines[-1]
    assert not runs.exists() or not any(runs.iterdir())


def _tls_mismatch(tmp_path: Path, certs, server_tls: bool) -> tuple[int, list[str]]:
    """A server with (or without) TLS and a device with the opposite: the device's code and
    log lines."""
    cert, key = certs
    bed = Testbed.create(tmp_path / "bed", ["a"])
    tls = {"tls_cert": str(cert), "tls_key": str(key)} if server_tls else {}
    net = bed.server_overrides(min_devices=1, connect_timeout_s=30.0, **tls)
    session = NetworkSession(as_config(config_for("splitfed_v1", **net)), 4, tmp_path)
    starter = threading.Thread(target=lambda: _quiet(session.start), daemon=True)
    starter.start()
    time.sleep(1.0)
    creds = None if server_tls else channel_credentials(cert)
    device = bed.device("a", [], retry_s=20.0, credentials=creds)
    try:
        device.join(20)
        assert not device.is_alive(), device.lines
    finally:
        session.stop()
        starter.join(30)
    return device.code, device.lines


def _quiet(fn) -> None:
    try:
        fn()
    except (ConfigError, AttributeError):  # stopped while waiting for devices
        pass


def test_plain_text_device_against_a_tls_server_is_told_to_pass_ca_cert(tmp_path, certs):
    code, lines = _tls_mismatch(tmp_path, certs, server_tls=True)
    assert code == 2 and "requires TLS: pass --ca-cert" in lines[-1], lines


def test_tls_device_against_a_plain_text_server_is_told_to_drop_ca_cert(tmp_path, certs):
    code, lines = _tls_mismatch(tmp_path, certs, server_tls=False)
    assert code == 2 and "speaks plain text" in lines[-1], lines


@pytest.mark.parametrize("server", ["10.231.0.1", "10.231.0.1:", "host:x", "::1"])
def test_device_server_without_a_port_is_one_line(tmp_path, capsys, server):
    (tmp_path / "t.token").write_text("x" * 32)
    argv = ["device", "--server", server, "--name", "d0", "--token-file", str(tmp_path / "t.token")]
    assert cli_main([*argv, "--retry-s", "2"]) == 2  # bounded: the old code dialled port 443
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--server: expected HOST:PORT" in err[0] and ":7070" in err[0]


# ------------------------------------------------------------------ 5: who trained which client


def _plan(clients: list[int]) -> RoundPlan:
    tasks = [ClientTask(client=c, cut=1, group=0, batch_size=4, steps=1, lr=0.1) for c in clients]
    return RoundPlan(round_idx=1, tasks=tasks)


def test_rows_and_devices_json_record_who_trained_each_client_per_round(tmp_path):
    """A device that took over another's clients shows from the round it trained them: the
    row's ``measured_device`` (aligned with ``clients``) and ``devices.json``'s ``rounds``."""
    before = RoundResult([], {}, measured={0: {}, 1: {}}, devices={0: "a", 1: "a"})
    after = RoundResult([], {}, measured={0: {}, 1: {}}, devices={0: "b", 1: "a"})
    rows = []
    for r, result in enumerate([before, after]):
        row = {"round": r + 1, "clients": [0, 1], **measured_row(_plan([0, 1]), result)}
        rows.append(row)
    assert rows[1]["measured_device"] == ["b", "a"]

    class Announcing:
        def announced(self) -> dict:
            return {}

    config = as_config(config_for("fedavg", **OWN, executor="networked"))
    write_devices(config, Announcing(), tmp_path, rows)
    record = json.loads((tmp_path / "devices.json").read_text())
    assert record["rounds"] == [
        {"round": 1, "trained": {"a": [0, 1]}},
        {"round": 2, "trained": {"a": [1], "b": [0]}},
    ]


def test_networked_rows_name_the_device_of_every_trained_client(tmp_path):
    bed = Testbed.create(tmp_path / "bed", ["a", "b"])
    threads = [bed.device("a", [0, 2]), bed.device("b", [1, 3])]
    changes = {"data.num_clients": 4, "train.clients_per_round": 4}
    net = bed.server_overrides(min_devices=2)
    try:
        result = splitfl.run(
            config_for("fedavg", rounds=2, **changes, **net), run_dir=tmp_path / "n"
        )
    finally:
        for t in threads:
            t.join(30)
    assert len(result.metrics) == 2
    for row in result.metrics:
        trained = dict(zip(row["clients"], row["measured_device"], strict=True))
        assert trained == {c: "a" if c % 2 == 0 else "b" for c in row["clients"]}

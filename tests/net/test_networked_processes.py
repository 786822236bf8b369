"""Networked runs with real processes on loopback: ``splitfl launch``, a device process
killed mid-run, and a killed server resumed while its device processes reconnect.

Every process is started with a time limit and killed in ``finally``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

import splitfl
from splitfl.core.plan import RING_MEMBER_FAILED
from splitfl.net.server.testbed import Testbed
from splitfl.testing import config_for

pytestmark = pytest.mark.slow

#: A device process as on an edge board: plotting, sweeps and progress bars are not
#: importable (scikit-learn stays: the digits data set is scikit-learn's).
LIGHT_DEVICE = (
    "import sys\n"
    "for m in ('matplotlib', 'ray', 'tqdm', 'tensorboard', 'mlflow'): sys.modules[m] = None\n"
    "from splitfl.cli.entry import main\n"
    "sys.exit(main(sys.argv[1:]))\n"
)


def _write_config(path: Path, algorithm: str, **changes) -> Path:
    path.write_text(yaml.safe_dump(config_for(algorithm, **changes)))
    return path


def _cli(*args: str, **kwargs) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "splitfl", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **kwargs)


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def _wait_rows(run_dir: Path, n: int, proc: subprocess.Popen, limit: float = 120.0) -> None:
    deadline = time.monotonic() + limit
    while len(_rows(run_dir)) < n:
        assert proc.poll() is None, proc.stdout.read().decode()[-2000:]
        assert time.monotonic() < deadline, f"no round {n} within {limit} s"
        time.sleep(0.05)


def _launch_and_kill_device(cfg: Path, run_dir: Path, devices: int) -> dict:
    """``splitfl launch`` with ``devices`` device processes; SIGKILL the second one once
    round 1 is recorded; the run must still exit 0. Returns the victim's network.json entry."""
    proc = _cli("launch", str(cfg), "--devices", str(devices), "--out", str(run_dir))
    try:
        _wait_rows(run_dir, 1, proc)
        victim = json.loads((run_dir / "network.json").read_text())["local_devices"][1]
        os.kill(victim["pid"], signal.SIGKILL)
        out, _ = proc.communicate(timeout=240)
    finally:
        _stop(proc)
    assert proc.returncode == 0, out.decode()[-2000:]
    return victim


def test_launch_with_device_processes_equals_sequential(tmp_path, sequential_run):
    cfg = _write_config(tmp_path / "c.yaml", "s2fl", rounds=2)
    proc = _cli("launch", str(cfg), "--devices", "3", "--out", str(tmp_path / "net"))
    try:
        # the sequential reference in this process while the launch runs
        seq = sequential_run(config_for("s2fl", rounds=2))
        out, _ = proc.communicate(timeout=240)
    finally:
        _stop(proc)
    assert proc.returncode == 0, out.decode()[-2000:]
    info = json.loads((tmp_path / "net" / "network.json").read_text())
    assert [d["clients"] for d in info["local_devices"]] == [
        [0, 3, 6, 9],
        [1, 4, 7, 10],
        [2, 5, 8, 11],
    ]
    net_model = torch.load(tmp_path / "net" / "model.pt", weights_only=True)
    assert _max_diff(net_model, torch.load(seq.run_dir / "model.pt", weights_only=True)) <= 1e-5


def test_killed_device_process_is_dropped_and_the_run_completes(tmp_path):
    changes = {"rounds": 4, "train.local_steps": 25, "network.rejoin_s": 1.0}
    cfg = _write_config(tmp_path / "c.yaml", "splitfed_v1", **changes)
    run_dir = tmp_path / "net"
    victim = _launch_and_kill_device(cfg, run_dir, devices=2)
    rows = _rows(run_dir)
    assert len(rows) == 4
    dropped = [set(r["dropped_clients"]) for r in rows]
    assert dropped[0] == set() and dropped[-1]  # lost from then on (the process is gone)
    lost = set().union(*dropped)
    assert lost <= set(victim["clients"])
    summary = json.loads((run_dir / "summary.json").read_text())
    status = summary["status"]  # finished, and says what was lost (issue 35.10)
    assert status.startswith("ok (clients ") and "without a connected device in" in status
    model = torch.load(run_dir / "model.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in model.values() if v.is_floating_point())


def test_killed_server_resumes_and_devices_reconnect(tmp_path):
    bed = Testbed.create(tmp_path / "bed", ["a", "b"])
    changes = {"rounds": 4, "train.local_steps": 10, "output.checkpoint_every": 1}
    cfg = _write_config(tmp_path / "c.yaml", "splitfed_v1", **changes)
    run_dir = tmp_path / "net"
    address = f"127.0.0.1:{bed.port}"
    server_flags = ["--listen", address, "--tokens", str(bed.tokens_file), "--min-devices", "2"]
    devices = []
    for name, clients in (("a", "0,2,4,6,8,10"), ("b", "1,3,5,7,9,11")):
        token = bed.folder / f"{name}.token"
        token.write_text(bed.tokens[name])
        args = ["device", "--server", address, "--name", name, "--token-file", str(token)]
        args += ["--client-id", clients, "--retry-s", "120"]
        devices.append(
            subprocess.Popen(
                [sys.executable, "-c", LIGHT_DEVICE, *args],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    server = _cli("server", str(cfg), *server_flags, "--out", str(run_dir), "--no-progress")
    resumed = None
    try:
        _wait_rows(run_dir, 2, server)
        server.kill()
        server.wait(10)
        resumed = _cli("server", *server_flags, "--resume", str(run_dir), "--no-progress")
        out, _ = resumed.communicate(timeout=240)
        assert resumed.returncode == 0, out.decode()[-2000:]
        codes = [d.wait(30) for d in devices]
    finally:
        _stop(server, *devices, *([resumed] if resumed else []))
    assert codes == [0, 0]  # both devices reconnected by themselves and ended on bye
    assert len(_rows(run_dir)) == 4
    seq = splitfl.run(config_for("splitfed_v1", **changes), run_dir=tmp_path / "seq")
    net_model = torch.load(run_dir / "model.pt", weights_only=True)
    assert _max_diff(net_model, torch.load(seq.run_dir / "model.pt", weights_only=True)) <= 1e-5


def test_ring_member_process_killed_mid_run_is_left_out_and_the_run_completes(tmp_path):
    """RingSFL over device-to-device links between 3 device processes; one is SIGKILLed
    after round 1: the ring round it breaks (if one was running) is abandoned naming it, and
    every later round forms its ring of the other two and trains; the run ends ok."""
    changes = {"rounds": 4, "train.local_steps": 30, "network.rejoin_s": 1.0}
    changes |= {"data.num_clients": 3, "train.clients_per_round": 3}
    cfg = _write_config(tmp_path / "c.yaml", "ringsfl", **changes)
    run_dir = tmp_path / "net"
    victim = _launch_and_kill_device(cfg, run_dir, devices=3)
    (lost,) = victim["clients"]
    rows = _rows(run_dir)
    assert len(rows) == 4 and rows[0]["dropped_clients"] == []
    abandoned = [i for i, r in enumerate(rows) if r["dropped_clients"]]
    assert len(abandoned) <= 1  # the round it broke, if it was in one
    for i in abandoned:
        assert rows[i]["dropped_reasons"][str(lost)].startswith(RING_MEMBER_FAILED)
    later = rows[abandoned[0] + 1 :] if abandoned else rows[-1:]
    others = [c for c in range(3) if c != lost]
    assert later and all(r["clients"] == others and not r["dropped_clients"] for r in later)
    status = json.loads((run_dir / "summary.json").read_text())["status"]
    assert status.startswith("ok")
    model = torch.load(run_dir / "model.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in model.values() if v.is_floating_point())

"""Issue 52 item 8: what an operator sees. The server's console says when a device drops or
comes back; ``tokens.txt`` (a credential) is created mode 600; a server key passed as
``--ca-cert`` is one line, exit 2, before dialling; gRPC's C-core logging stays off the
console unless ``GRPC_VERBOSITY`` asks for it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from splitfl.cli.main import main
from splitfl.net.device import cli as device_cli
from splitfl.net.server.session import console_line
from splitfl.net.transport.audit import Audit
from splitfl.net.transport.certs import write_self_signed

SRC = str(Path(__file__).resolve().parents[2] / "src")


def test_the_server_console_shows_drops_and_rejoins_in_one_line_each(tmp_path, capsys):
    audit = Audit(tmp_path / "audit.log", sink=console_line)
    audit("joined", "127.0.0.1:5001", "device=d0 clients=[0, 1]")
    audit("dropped", "127.0.0.1:5001", "device=d0 no keepalive for 30 s")
    audit("reconnected", "127.0.0.1:5002", "device=d0 clients=[0, 1]")
    audit("refused", "10.0.0.9:4000", "UNAUTHENTICATED bad proof")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "splitfl server: device dropped: peer=127.0.0.1:5001 device=d0 no keepalive for 30 s",
        "splitfl server: device reconnected: peer=127.0.0.1:5002 device=d0 clients=[0, 1]",
    ]
    assert len((tmp_path / "audit.log").read_text().splitlines()) == 4  # all four, as before


def test_the_tokens_file_is_created_mode_600(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    old = os.umask(0o022)  # the usual umask: a plain open() would make it 644
    try:
        assert main(["token", "d1", "--tokens", "tokens.txt"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "tokens.txt").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "d1.token").stat().st_mode) == 0o600


def test_a_server_key_given_as_ca_cert_is_one_line_before_dialling(tmp_path, capsys):
    cert, key = write_self_signed(tmp_path, ["localhost"], 2)
    (tmp_path / "t.token").write_text("x" * 32)
    args = ["--server", "127.0.0.1:9", "--name", "d0", "--token-file", str(tmp_path / "t.token")]
    assert device_cli.main([*args, "--ca-cert", str(key)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: --ca-cert {key} holds a private key"), err


def test_grpc_core_logging_is_off_unless_asked():
    code = "import os, splitfl.net, grpc; print(os.environ['GRPC_VERBOSITY'])"
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"} | {"PYTHONPATH": SRC}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "NONE", out.stderr
    env["GRPC_VERBOSITY"] = "DEBUG"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "DEBUG", out.stderr

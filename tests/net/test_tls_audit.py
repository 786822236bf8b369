"""Connections to a TLS listener that never open a stream — failed handshakes, port probes —
are audited as a count (issue 51 item 6: "TLS handshake failures leave no audit line"; grpc
names no peer of them: :mod:`splitfl.net.transport.connections`). Loopback, bounded."""

from __future__ import annotations

import socket
import ssl
import time

from splitfl.experiment.runner import as_config
from splitfl.net.server.testbed import Testbed
from splitfl.net.transport.auth import TokenBook, channel_credentials, server_credentials
from splitfl.net.transport.certs import write_self_signed
from splitfl.net.transport.connections import ConnectionTally
from splitfl.net.transport.guard import Audit
from splitfl.net.transport.hub import Hub, HubSettings
from splitfl.testing import config_for


def test_a_connection_counts_once_it_stayed_streamless_across_two_looks():
    """By hand: 3 connections, 1 with a stream; the first look confirms none (each needs two
    looks), the second confirms 2; a connection streamless at one look and streaming by the
    next is never counted, nor a second stream of one connection."""
    tally, lines = ConnectionTally(), []

    def audit(event: str, peer: str, detail: str) -> None:
        lines.append((event, peer, detail))

    for _ in range(3):
        tally.opened()
    tally.streamed("ipv4:127.0.0.1:5000")
    assert tally.report(audit) == 0
    assert tally.report(audit) == 2 and lines[-1][:2] == ("tls", "?")
    assert lines[-1][2].startswith("2 connections in the last")
    tally.opened()  # a device between two looks: streamless at this look ...
    assert tally.report(audit) == 0
    tally.streamed("ipv4:127.0.0.1:5001")  # ... streaming by the next
    tally.streamed("ipv4:127.0.0.1:5001")
    assert tally.report(audit) == 0 and tally.report(audit) == 0 and len(lines) == 1
    tally.opened()
    assert tally.report(audit) == 0 and tally.report(audit) == 1
    assert lines[-1][2].startswith("1 connection in the last")


def _probe(port: int, cert) -> None:
    """Three connections that never open a stream: plain bytes, a TLS client that does not
    trust the server's certificate, a bare connect."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET / HTTP/1.1\r\n\r\n")
        s.recv(1)
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
            ssl.create_default_context().wrap_socket(raw, server_hostname="localhost")
    except ssl.SSLError:
        pass
    socket.create_connection(("127.0.0.1", port), timeout=5).close()


def test_failed_tls_handshakes_are_audited_and_a_device_is_not(tmp_path):
    """Three streamless connections and one TLS device: one audit line counting 3 (the
    device's connection opened its stream). Without the counting credentials, no line."""
    cert, key = write_self_signed(tmp_path / "certs", ["localhost"])
    bed = Testbed.create(tmp_path / "bed", ["a"])
    config = as_config(
        config_for("splitfed_v1", **{"data.num_clients": 4, "train.clients_per_round": 4})
    )
    lines: list[str] = []
    tally = ConnectionTally()
    settings = HubSettings(1 << 20, 1 << 16, keepalive_s=1.0)
    hub = Hub(
        settings,
        TokenBook.read(bed.tokens_file),
        4,
        {"config": config.to_dict()},
        Audit(sink=lines.append),
        tally,
    )
    hub.start(f"127.0.0.1:{bed.port}", server_credentials(cert, key, tally))
    try:
        device = bed.device("a", [0], host="localhost", credentials=channel_credentials(cert))
        hub.wait_for(1, 30)
        _probe(bed.port, cert)
        deadline = time.monotonic() + 15
        while not any(" tls " in line for line in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(2.5)  # two more looks: nothing else to count
        assert device.is_alive()
    finally:
        hub.stop()
    tls = [line for line in lines if " tls " in line]  # "<UTC time> tls peer=? ..."
    assert len(tls) == 1 and " tls peer=? 3 connections in the last" in tls[0], lines

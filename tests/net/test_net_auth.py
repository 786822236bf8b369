"""Authentication under attack (issue 35, items 7–10), on loopback with bounded streams.

Replay and token sharing (8): a captured opening replayed on another stream, the token on
the wire, a second process with a live device's token, a replaced device's exit code, a
squatter on the clients of a device that dropped, ``splitfl token``'s default binding.
Lock-out (7): silent streams renewed as they are cancelled, wrong tokens from a shared
address, streams closed before their hello, a flood at a device's peer listener. The audit
log (9): repeated refusals summarised, the file bounded. Small (10): a protocol given as a
string. Each test is written against the wire (``net_raw``) so it runs on older code, where
it fails.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from net_raw import RawStream, silent_streams
from splitfl.experiment.runner import as_config
from splitfl.net.device import session as device_session
from splitfl.net.device.agent import DeviceOptions
from splitfl.net.server.testbed import Testbed
from splitfl.net.transport.auth import TokenBook, new_token, token_hash
from splitfl.net.transport.guard import Audit
from splitfl.net.transport.hub import Hub, HubSettings
from splitfl.net.transport.peer import PeerChannel, PeerEndpoint
from splitfl.net.transport.wire import PROTOCOL_VERSION, Message, decode
from splitfl.testing import config_for


def _hub(bed: Testbed, book: TokenBook | None = None, block: int = 1, **limits) -> Hub:
    config = as_config(
        config_for("splitfed_v1", **{"data.num_clients": 4, "train.clients_per_round": 4})
    )
    fields = HubSettings.__dataclass_fields__
    settings = HubSettings(4 << 20, 1 << 16, **{k: v for k, v in limits.items() if k in fields})
    book = book or TokenBook.read(bed.tokens_file)
    hub = Hub(settings, book, 4, {"config": config.to_dict(), "block": block}, Audit())
    hub.start(f"127.0.0.1:{bed.port}", None)
    return hub


def _opts(**values) -> dict:
    """DeviceOptions fields the code under test knows (the same test runs on older code)."""
    return {k: v for k, v in values.items() if k in DeviceOptions.__dataclass_fields__}


def _code(thread, limit: float = 30.0):
    thread.join(limit)
    assert not thread.is_alive()
    return thread.code


def _until(check, limit: float = 20.0) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return check()


# ------------------------------------------------------------------ 8: replay, token sharing


def test_a_replayed_opening_is_refused_and_the_token_never_crosses_the_wire(tmp_path, monkeypatch):
    """What a device sends to open its link, replayed on another stream, is refused (another
    nonce); the device keeps its link. Neither its token nor the token's hash is on the wire.
    Old code: the replayed hello (token inside) was welcomed and the device replaced."""
    bed = Testbed.create(tmp_path / "bed", ["a"])
    hub = _hub(bed)
    sent: list[bytes] = []
    real = device_session.outgoing

    def recording(outbox, state):
        for chunk in real(outbox, state):
            sent.append(bytes(chunk))
            yield chunk

    monkeypatch.setattr(device_session, "outgoing", recording)
    try:
        device = bed.device("a", [0, 1])
        hub.wait_for(1, 30)
        link = hub.link_of(0)
        opening = [c for c in sent if decode(c[:-1]).type in ("hello", "proof")]
        replay = RawStream(bed.port)
        replay.answer = False
        for chunk in opening:
            replay.out.put(chunk)
        assert replay.outcome(10) == grpc.StatusCode.UNAUTHENTICATED
        replay.close()
        assert device.is_alive() and hub.link_of(0) is link and link.alive
        token = bed.tokens["a"]
        assert not any(token.encode() in c or token_hash(token).encode() in c for c in sent)
    finally:
        hub.stop()


def test_a_second_holder_of_a_live_name_is_refused_and_the_first_keeps_its_link(tmp_path):
    """Token sharing: a second process with a connected device's token is refused while the
    first answers keepalives — it exits 2 with one line — and the first keeps its link
    (old code: the second replaced it, and the first exited 0 for good)."""
    bed = Testbed.create(tmp_path / "bed", ["a"])
    hub = _hub(bed, keepalive_s=1.0)
    try:
        first = bed.device("a", [0, 1], **_opts(keepalive_s=1.0))
        hub.wait_for(1, 30)
        link = hub.link_of(0)
        second = bed.device("a", [2], retry_s=20.0, **_opts(duplicate_wait_s=3.0))
        assert _code(second) == 2
        assert "connected already" in second.lines[-1] and "exiting" in second.lines[-1]
        assert first.is_alive() and hub.link_of(0) is link and link.alive
    finally:
        hub.stop()


def test_a_device_whose_silent_link_is_replaced_exits_non_zero_with_one_line(tmp_path):
    """A link that stopped answering keepalives (half-open) is replaced by a new hello of its
    name; if its process still hears the server, it is told so and exits 2, never 0."""
    bed = Testbed.create(tmp_path / "bed", ["a"])
    hub = _hub(bed)
    try:
        first = bed.device("a", [0, 1])
        hub.wait_for(1, 30)
        hub.link_of(0).heard -= 1000.0  # as if silent for 1000 s
        again = bed.device("a", [2])
        assert _code(first) == 2 and "replaced by a connection" in first.lines[-1]
        assert _until(lambda: hub.link_of(2) is not None and hub.link_of(2).name == "a")
        assert hub.link_of(0) is None and again.is_alive()
    finally:
        hub.stop()


def test_auto_bound_clients_wait_for_their_device_not_for_a_squatter(tmp_path):
    """``clients=auto`` (``splitfl token``'s default) binds the clients a device is first
    given: when it drops, a device with an any-client token cannot take them, and the
    restarted owner gets them back (old code: the squatter was welcomed with them and the
    owner waited on ALREADY_EXISTS)."""
    bed = Testbed.create(tmp_path / "bed", ["owner", "other", "squat"])
    lines = bed.tokens_file.read_text().splitlines()
    bed.tokens_file.write_text("\n".join([lines[0] + ":clients=auto", *lines[1:]]) + "\n")
    hub = _hub(bed, block=2)
    try:
        owner = RawStream(bed.port).hello("owner", bed.tokens["owner"])
        assert owner.outcome(10) == "welcome" and hub.links["owner"].clients == [0, 1]
        other = RawStream(bed.port).hello("other", bed.tokens["other"])
        assert other.outcome(10) == "welcome" and hub.links["other"].clients == [2, 3]
        owner.close()  # the owner drops (its device restarts)
        assert _until(lambda: not hub.links["owner"].alive)
        squat = RawStream(bed.port).hello("squat", bed.tokens["squat"])
        assert squat.outcome(10) == grpc.StatusCode.RESOURCE_EXHAUSTED  # it may wait
        back = RawStream(bed.port).hello("owner", bed.tokens["owner"])
        assert back.outcome(10) == "welcome" and hub.links["owner"].clients == [0, 1]
        for s in (other, squat, back):
            s.close()
    finally:
        hub.stop()


def test_token_command_binds_clients_by_default_and_any_client_opts_out(tmp_path):
    from splitfl.cli.main import main

    tokens = tmp_path / "tokens.txt"
    assert main(["token", "a", "--tokens", str(tokens), "--out", str(tmp_path / "a")]) == 0
    flags = ["--tokens", str(tokens), "--out", str(tmp_path / "b"), "--any-client"]
    assert main(["token", "b", *flags]) == 0
    a, b = tokens.read_text().splitlines()
    assert a.endswith(":clients=auto") and "clients" not in b
    book = TokenBook.read(tokens)
    assert book.auto == {"a"} and book.bound == {}
    flags = ["--tokens", str(tokens), "--out", str(tmp_path / "c"), "--any-client"]
    assert main(["token", "c", *flags, "--clients", "1"]) == 2


# ------------------------------------------------------------------ 7: lock-out


def _flood(port: int, n: int, stop: threading.Event, opened: list) -> None:
    """Keep ``n`` silent streams open, renewing each as the listener cancels it."""
    streams = silent_streams(port, n)
    opened.append(n)
    while not stop.wait(0.05):
        for i, s in enumerate(streams):
            if s.outcome(0.001) != "open":
                s.close()
                (streams[i],) = silent_streams(port, 1)
                opened.append(1)
    for s in streams:
        s.close()


def test_a_flood_of_silent_streams_does_not_keep_a_device_out(tmp_path):
    """16 streams that never say hello, renewed as they are cancelled, fill the 16
    unauthenticated slots: a device still gets in at once (old code: refused while they
    held the slots, 10 s at a time)."""
    bed = Testbed.create(tmp_path / "bed", ["a"])
    hub = _hub(bed, max_pending=16)
    stop, opened = threading.Event(), []
    flooder = threading.Thread(target=_flood, args=(bed.port, 16, stop, opened), daemon=True)
    flooder.start()
    try:
        time.sleep(1.0)
        device = bed.device("a", [0], retry_s=30.0)
        hub.wait_for(1, 8)
        assert device.is_alive()
    finally:
        stop.set()
        flooder.join(10)
        hub.stop()
    assert sum(opened) >= 16


def test_wrong_tokens_from_a_shared_address_do_not_lock_an_honest_device_out(tmp_path):
    """12 wrong tokens for ``a`` from this address (one NAT for everyone) throttle that
    (address, name) — yet ``a``'s right token gets in at once (old code: the address was
    refused for 60 s)."""
    bed = Testbed.create(tmp_path / "bed", ["a"])
    hub = _hub(bed, auth_failures=3)
    try:
        for _ in range(12):
            wrong = RawStream(bed.port).hello("a", new_token(), [0])
            assert wrong.outcome(10) == grpc.StatusCode.UNAUTHENTICATED
            wrong.close()
        device = bed.device("a", [0], retry_s=4.0)
        hub.wait_for(1, 8)
        assert device.is_alive()
    finally:
        hub.stop()


def test_streams_closed_before_their_hello_are_not_failed_authentications(tmp_path):
    bed = Testbed.create(tmp_path / "bed", ["a"])
    hub = _hub(bed, auth_failures=2)
    try:
        for _ in range(5):  # half-closed before a whole message: the call ends
            (s,) = silent_streams(bed.port, 1)
            s.out.put(None)
            assert s.outcome(5) != "open"
            s.close()
        device = bed.device("a", [0], retry_s=4.0)
        hub.wait_for(1, 8)  # old code: the address was throttled for a minute
        assert device.is_alive()
    finally:
        hub.stop()


def test_a_flood_at_a_peer_listener_does_not_stop_a_peers_dial(tmp_path):
    """80 silent streams at a ring member's peer listener: its predecessor still dials in
    (old code: RESOURCE_EXHAUSTED, no retry, and the ring round was abandoned)."""
    end = PeerEndpoint.start("127.0.0.1:0", None, False, 1 << 20, wait_s=2.0)
    port = int(end.address.rpartition(":")[2])
    flood = silent_streams(port, 80)
    try:
        time.sleep(0.5)
        token = new_token()
        end.hub.expect({"edge": token_hash(token)})
        channel = PeerChannel(end.address, "edge", token, 0, "", 1 << 20, 5.0)
        assert channel.welcomed.is_set()
        channel.close()
    finally:
        for s in flood:
            s.close()
        end.stop()


# ------------------------------------------------------------------ 9: the audit log


def test_repeated_refusals_are_summarised_in_the_audit_log(tmp_path):
    """100 wrong tokens from one address: a few lines and a summary, not 100 lines."""
    bed = Testbed.create(tmp_path / "bed", ["a"])
    log = tmp_path / "audit.log"
    config = as_config(
        config_for("splitfed_v1", **{"data.num_clients": 4, "train.clients_per_round": 4})
    )
    settings = HubSettings(4 << 20, 1 << 16, auth_failures=0)
    hub = Hub(
        settings, TokenBook.read(bed.tokens_file), 4, {"config": config.to_dict()}, Audit(log)
    )
    hub.start(f"127.0.0.1:{bed.port}", None)
    try:
        for _ in range(100):
            wrong = RawStream(bed.port).hello("a", new_token(), [0])
            assert wrong.outcome(10) == grpc.StatusCode.UNAUTHENTICATED
            wrong.close()
    finally:
        hub.stop()
    lines = log.read_text().splitlines()
    assert len(lines) <= 10, lines  # old code: 100
    assert any("95 more refused lines" in line for line in lines), lines


def test_the_audit_log_is_bounded_and_survives_an_unwritable_file(tmp_path, capsys):
    path = tmp_path / "audit.log"
    audit = Audit(path, max_bytes=4096)
    for i in range(2000):  # distinct addresses: nothing to summarise, the size cap holds
        audit("refused", f"10.0.{i // 250}.{i % 250}", "UNAUTHENTICATED wrong token")
    audit.flush(force=True)
    size = path.stat().st_size + (tmp_path / "audit.log.1").stat().st_size
    assert path.stat().st_size <= 4096 and size <= 2 * 4096
    (tmp_path / "dir").mkdir()
    broken = Audit(tmp_path / "dir", sink=None)  # a folder: every write fails
    broken("refused", "10.0.0.1", "UNAUTHENTICATED wrong token")
    broken("refused", "10.0.0.2", "UNAUTHENTICATED wrong token")
    assert capsys.readouterr().err.count("cannot write") == 1


# ------------------------------------------------------------------ 10: small


@pytest.mark.parametrize(
    "protocol, words",
    [("3", "'3' (a str, not a version)"), (3, "protocol version 3 not supported")],
)
def test_a_foreign_protocol_is_one_clear_line(tmp_path, protocol, words):
    """An old device (protocol 3, its token in the hello) or a protocol given as a string:
    one line naming what was said and what this server speaks (old code, for "3": "protocol
    version 3 not supported; this server speaks 3")."""
    bed = Testbed.create(tmp_path / "bed", ["a"])
    hub = _hub(bed)
    try:
        raw = RawStream(bed.port)
        raw.send(Message("hello", {"protocol": protocol, "name": "a", "token": bed.tokens["a"]}))
        assert raw.outcome(10) == grpc.StatusCode.FAILED_PRECONDITION
        speaks = f"this server speaks {PROTOCOL_VERSION}"
        assert words in raw.details and speaks in raw.details, raw.details
        raw.close()
    finally:
        hub.stop()


def _row(k: int, dropped: dict) -> dict:
    return {"round": k, "avg_waiting": 0.0, "dropped_reasons": dropped}


def test_a_finished_run_that_lost_a_device_or_its_ring_says_so_in_its_status():
    """A device gone for 9 of 14 rounds, or every ring round abandoned: the status still
    starts with ``ok`` (a finished run, for sweeps and reports) and says what was lost (old
    code: plain ``ok``)."""
    from splitfl.metrics import summary as summaries

    gone = {"4": "device not connected", "5": "device not connected"}
    rows = [_row(k, gone if k > 5 else {}) for k in range(1, 15)]
    status = summaries.summarize(rows, None, "ok", 14)["status"]
    assert status == "ok (clients 4, 5 without a connected device in 9 of 14 rounds)"
    ring = {"0": "ring round abandoned: client 2 not connected"}
    status = summaries.summarize([_row(k, ring) for k in (1, 2)], None, "ok", 2)["status"]
    assert status == "ok (every ring round abandoned)"
    assert summaries.summarize([_row(1, {})], None, "ok", 1)["status"] == "ok"
    assert summaries.is_ok(status) and not summaries.is_ok("okay")


def test_an_expired_server_certificate_stops_the_device_at_once(tmp_path):
    """Old code: retried as transient until ``--retry-s``, then exit 1."""
    pytest.importorskip("cryptography")
    from splitfl.net.transport.auth import channel_credentials, server_credentials
    from splitfl.net.transport.certs import write_self_signed

    cert, key = write_self_signed(tmp_path / "certs", ["localhost"], days=0)  # ends now
    bed = Testbed.create(tmp_path / "bed", ["a"])
    book = TokenBook.read(bed.tokens_file)
    hub = Hub(HubSettings(1 << 20, 1 << 16), book, 4, {"config": {}}, Audit())
    hub.start(f"127.0.0.1:{bed.port}", server_credentials(cert, key))
    try:
        time.sleep(1.1)
        creds = channel_credentials(cert)
        device = bed.device("a", [0], host="localhost", credentials=creds, retry_s=20.0)
        assert _code(device, 10) == 2
        assert "certificate was refused (certificate has expired)" in device.lines[-1]
    finally:
        hub.stop()


def test_measured_round_time_includes_the_wait_for_devices_to_rejoin(tmp_path, monkeypatch):
    """The wait before a round (up to ``network.rejoin_s``) is part of its measured time
    (old code: left out)."""
    import json

    import splitfl
    from splitfl.net.server.session import NetworkSession

    real = NetworkSession.wait_ready

    def slow(self) -> None:
        time.sleep(2.0)
        real(self)

    monkeypatch.setattr(NetworkSession, "wait_ready", slow)
    bed = Testbed.create(tmp_path / "bed", ["a"])
    device = bed.device("a", [0, 1, 2, 3])
    changes = {"rounds": 1, "data.num_clients": 4, "train.clients_per_round": 4}
    net = bed.server_overrides(min_devices=1)
    result = splitfl.run(config_for("splitfed_v1", **changes, **net), run_dir=tmp_path / "run")
    device.join(30)
    row = json.loads((result.run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert row["measured_round_time"] >= 2.0

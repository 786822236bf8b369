"""Wire format, tokens, the hub's admission rules and TLS (no experiment runs here)."""

from __future__ import annotations

import math
import pickle
import queue
import struct
import threading
import time

import grpc
import numpy as np
import pytest
import torch

from splitfl.config import ConfigError
from splitfl.experiment.runner import as_config
from splitfl.net.device import session as device_module
from splitfl.net.device import workers as device_workers
from splitfl.net.server.testbed import Testbed
from splitfl.net.transport.auth import (
    AuthSetupError,
    TokenBook,
    channel_credentials,
    server_credentials,
    token_proof,
)
from splitfl.net.transport.certs import write_self_signed
from splitfl.net.transport.hub import Hub, HubSettings
from splitfl.net.transport.wire import (
    DTYPES,
    Message,
    Reassembler,
    WireError,
    all_finite,
    chunks,
    decode,
    encode,
    extremes,
    payload_bytes,
)
from splitfl.testing import config_for

# ----------------------------------------------------------------------------- wire format


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
def test_tensors_round_trip_bit_exactly(dtype):
    x = (torch.randn(3, 4, 5) * 100).to(dtype)
    msg = Message("t", {"a": 1, "b": [1.5, "x"]}, {"x": x, "empty": torch.zeros(0, 2, dtype=dtype)})
    back = decode(encode(msg))
    assert back.type == "t" and back.fields == {"a": 1, "b": [1.5, "x"]}
    assert back.tensors["x"].dtype == dtype and torch.equal(back.tensors["x"], x)
    assert back.tensors["empty"].shape == (0, 2)
    assert payload_bytes(back) == x.numel() * x.element_size()


def test_scalar_and_non_contiguous_tensors_round_trip():
    t = torch.arange(12.0).reshape(3, 4).t()  # a transposed view
    back = decode(encode(Message("t", {}, {"t": t, "s": torch.tensor(7)})))
    assert torch.equal(back.tensors["t"], t) and back.tensors["s"].item() == 7


@pytest.mark.parametrize("dtype", list(DTYPES.values()))
def test_one_dim_zero_dim_and_grad_tensors_round_trip(dtype):
    vec = (torch.randn(5) * 100).to(dtype)
    scalar = torch.tensor(3).to(dtype)
    grad = torch.randn(2, 3, requires_grad=True)  # sent without its graph
    back = decode(encode(Message("t", {}, {"v": vec, "s": scalar, "g": grad * 2})))
    assert back.tensors["v"].shape == (5,) and torch.equal(back.tensors["v"], vec)
    assert back.tensors["s"].shape == () and torch.equal(back.tensors["s"], scalar)
    assert not back.tensors["g"].requires_grad and torch.equal(back.tensors["g"], grad * 2)


def _chunk_at(chunk: bytes, tensor_offset: int, alignment: int) -> memoryview:
    """``chunk``'s bytes in a buffer placed so that the tensor at ``tensor_offset`` of the
    message starts at an address that is ``alignment`` modulo 64 (as a received chunk may)."""
    buf = torch.zeros(len(chunk) + 128, dtype=torch.uint8)  # 64-byte aligned (torch's allocator)
    start = (alignment - tensor_offset) % 64
    buf[start : start + len(chunk)] = torch.frombuffer(bytearray(chunk), dtype=torch.uint8)
    return memoryview(buf.numpy())[start : start + len(chunk)]


def _tensor_offset(chunk: bytes) -> int:
    (size,) = struct.unpack("<I", chunk[4:8])
    return -(-(8 + size) // 8) * 8


def test_decoded_tensors_are_views_of_the_received_buffer():
    """Where a tensor starts 64-byte aligned in the received buffer, it is read in place."""
    frame = encode(Message("t", {}, {"x": torch.zeros(4)})).tobytes()
    data = _chunk_at(bytes(frame), _tensor_offset(bytes(frame)), 0)
    x = decode(data).tensors["x"]
    data[-4:] = struct.pack("<f", 2.5)  # the last float of the (aligned) message
    assert x.tolist() == [0.0, 0.0, 0.0, 2.5]


def _raw(header: bytes, body: bytes = b"") -> bytes:
    return b"SFL1" + struct.pack("<I", len(header)) + header + body


@pytest.mark.parametrize(
    "data, problem",
    [
        (b"XXXX" + bytes(8), "magic"),
        (b"SFL1" + struct.pack("<I", 1 << 30), "header length"),
        (_raw(b"{not json"), "not JSON"),
        (_raw(b"[1, 2]"), "object"),
        (_raw(b'{"type": "t", "tensors": [["x", "object", [1]]]}'), "bad tensor spec"),
        (_raw(b'{"type": "t", "tensors": [["x", "float32", [-1]]]}'), "bad shape"),
        (_raw(b'{"type": "t", "tensors": [["x", "float32", [4]]]}', bytes(8)), "too short"),
        (_raw(b'{"type": "t", "tensors": [["x", "float32", [1]]]}', bytes(24)), "trailing"),
        (_raw(b'{"type": "t", "tensors": [["x", "float32", [1099511627775, 9]]]}'), "too short"),
    ],
)
def test_malformed_messages_are_refused(data, problem):
    with pytest.raises(WireError, match=problem):
        decode(data)


def test_pickled_bytes_are_not_a_message():
    with pytest.raises(WireError):
        decode(pickle.dumps({"x": torch.zeros(2)}))


def test_chunks_reassemble_and_oversized_messages_are_refused():
    frame = encode(
        Message(
            "big", {"k": "v" * 300}, {"x": torch.randn(1000), "b": torch.ones(3, dtype=torch.bool)}
        )
    )
    data = frame.tobytes()
    parts = list(chunks(frame, 512))
    assert list(chunks(data, 512)) == parts  # a frame and its bytes chunk alike
    assert len(parts) == -(-len(data) // 512) and all(len(p) <= 513 for p in parts)
    joined = Reassembler(10**6)
    outs = [joined.feed(p) for p in parts]
    assert outs[:-1] == [None] * (len(parts) - 1) and outs[-1] == data
    small = Reassembler(1000)
    with pytest.raises(WireError, match="limit"):
        for p in parts:
            small.feed(p)
    with pytest.raises(WireError, match="flag"):
        Reassembler(100).feed(b"\x07abc")


def test_all_finite_finds_nan_and_inf_and_survives_overflowing_sums():
    big = torch.full((10,), 3e38)
    assert (
        all_finite(big)
        and all_finite(torch.zeros(0))
        and all_finite(torch.ones(3, dtype=torch.long))
    )
    for bad in (float("nan"), float("inf"), -float("inf")):
        x = torch.ones(100)
        x[17] = bad
        assert not all_finite(x)


@pytest.mark.parametrize("n", [1, 5, 1024, 1025, 5000])
def test_extremes_of_labels_by_list_and_by_one_pass_agree(n):
    y = torch.arange(n, dtype=torch.long) * 7 % 11 - 3  # -3 … 7, in no order
    want = (int(y.min()), int(y.max()))
    assert extremes(y) == want and extremes(y.view(1, n)) == want
    small = y.abs().to(torch.uint8)
    assert extremes(small) == (int(small.min()), int(small.max()))
    x = y.double()
    assert extremes(x) == want
    x[n // 2] = float("nan")
    assert all(math.isnan(v) for v in extremes(x))  # NaN propagates to both
    assert extremes(torch.zeros(0, dtype=torch.long)) == (0.0, 0.0)


def test_tensor_of_a_foreign_dtype_is_not_sent():
    with pytest.raises(WireError, match="cannot be sent"):
        encode(Message("t", {}, {"x": torch.zeros(2, dtype=torch.complex64)}))


# ----------------------------------------------------------------------------- tokens


def test_tokens_file_holds_hashes_only_and_checks_in_constant_time(tmp_path):
    bed = Testbed.create(tmp_path, ["a", "b"])
    text = bed.tokens_file.read_text()
    assert bed.tokens["a"] not in text and "a:" in text
    book = TokenBook.read(bed.tokens_file)
    hello, nonce = {"protocol": 4, "name": "a", "clients": [0]}, "n" * 64

    def check(name, token, nonce=nonce, hello=hello):
        return book.check(name, nonce, hello, token_proof(token, nonce, hello))

    assert check("a", bed.tokens["a"]) and not check("a", bed.tokens["b"])
    assert not check("c", bed.tokens["a"]) and not book.check("a", nonce, hello, None)
    # a proof answers one nonce and one hello: not another nonce, not a changed hello
    answer = token_proof(bed.tokens["a"], nonce, hello)
    assert not book.check("a", "m" * 64, hello, answer)
    assert not book.check("a", nonce, {**hello, "clients": [1]}, answer)


@pytest.mark.parametrize("text", ["", "# only a comment\n", "a:123\n", "nocolon\n"])
def test_bad_tokens_file_is_one_line_naming_the_file(tmp_path, text):
    path = tmp_path / "tokens.txt"
    path.write_text(text)
    with pytest.raises(AuthSetupError, match="tokens.txt"):
        TokenBook.read(path)


# ----------------------------------------------------------------------------- admission


def _bare_hub(bed: Testbed, credentials=None) -> Hub:
    """A hub without an experiment on the bed's port; its welcome carries a digits config."""
    config = as_config(
        config_for("splitfed_v1", **{"data.num_clients": 4, "train.clients_per_round": 4})
    )
    settings = HubSettings(max_message_bytes=1 << 20, chunk_bytes=1 << 16)
    server = Hub(settings, TokenBook.read(bed.tokens_file), 4, {"config": config.to_dict()})
    server.start(f"127.0.0.1:{bed.port}", credentials)
    return server


@pytest.fixture
def hub(tmp_path):
    bed = Testbed.create(tmp_path / "bed", ["a", "b"])
    server = _bare_hub(bed)
    yield server, bed
    server.stop()


def _wait_code(thread, limit=30.0):
    thread.join(limit)
    assert not thread.is_alive()
    return thread.code


def test_wrong_or_missing_token_is_refused(hub):
    _, bed = hub
    assert _wait_code(bed.device("a", [0], token="f" * 64)) == 2
    assert _wait_code(bed.device("nobody", [0], token="f" * 64)) == 2
    wrong = bed.device("a", [0], token="")
    assert _wait_code(wrong) == 2 and "wrong token" in " ".join(wrong.lines)


def test_other_protocol_version_is_refused_with_a_clear_message(hub, monkeypatch):
    _, bed = hub
    monkeypatch.setattr(device_module, "PROTOCOL_VERSION", 99)
    old = bed.device("a", [0])
    assert _wait_code(old) == 2
    assert "protocol version 99 not supported" in " ".join(old.lines)


def test_taken_clients_are_waited_for(hub):
    """Clients hosted by another device are retried for, up to ``retry_s`` (exit 1)."""
    server, bed = hub
    holder = bed.device("a", [2])
    server.wait_for(1, 30)
    taken = bed.device("b", [2], retry_s=2.0)
    assert _wait_code(taken) == 1 and "already hosted" in " ".join(taken.lines)
    assert holder.is_alive() and server.link_of(2).name == "a"


def test_plain_text_device_cannot_reach_a_tls_server(tmp_path):
    cert, key = write_self_signed(tmp_path / "certs", ["localhost"])
    bed = Testbed.create(tmp_path / "bed", ["a"])
    server = _bare_hub(bed, server_credentials(cert, key))
    try:
        start = time.monotonic()
        plain = bed.device("a", [0], retry_s=1.0)
        assert _wait_code(plain) == 2 and time.monotonic() - start < 30  # told, not retried
        assert "requires TLS: pass --ca-cert" in plain.lines[-1]
        assert server.live() == []
        tls = bed.device("a", [0], host="localhost", credentials=channel_credentials(cert))
        server.wait_for(1, 30)
        assert server.link_of(0).name == "a" and tls.is_alive()
    finally:
        server.stop()


# ----------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    "changes, field, words",
    [
        ({"network.listen": "0.0.0.0:7070"}, "network.listen", "without TLS"),
        ({"network.listen": "7070"}, "network.listen", "host:port"),
        ({"network.tls_cert": "x.pem"}, "network.tls_cert", "both"),
        ({"network.tokens": "/nonexistent/tokens"}, "network.tokens", "no such file"),
        ({"network.timeout_s": 0}, "network.timeout_s", "must be >"),
        ({"network.compression": "zstd"}, "network.compression", "allowed"),
        ({"network.trust": "lab"}, "network.trust", "allowed"),
        ({"network.bounds.min_cosine": 2}, "network.bounds.min_cosine", "allowed"),
        ({"network.bounds.peer_loss_factor": 0.5}, "network.bounds.peer_loss_factor", "allowed"),
        ({"network.keepalive_s": -1}, "network.keepalive_s", "allowed"),
        ({"network.max_pending": 0}, "network.max_pending", "must be >= 1"),
        ({"network.auth_failures": -1}, "network.auth_failures", "must be >= 0"),
    ],
)
def test_bad_network_settings_are_one_line_errors(changes, field, words):
    cfg = config_for("splitfed_v1", executor="networked", **changes)
    with pytest.raises(ConfigError, match=words) as err:
        as_config(cfg)
    assert err.value.field_path == field


def test_non_loopback_listen_is_allowed_with_insecure_or_tls(tmp_path):
    cert, key = write_self_signed(tmp_path, ["example.org"])
    as_config(
        config_for(
            "splitfed_v1",
            executor="networked",
            **{"network.listen": "0.0.0.0:1", "network.insecure": True},
        )
    )
    tls = {
        "network.listen": "0.0.0.0:1",
        "network.tls_cert": str(cert),
        "network.tls_key": str(key),
    }
    as_config(config_for("splitfed_v1", executor="networked", **tls))


def test_measured_clock_needs_the_networked_executor():
    with pytest.raises(ConfigError, match="measured needs executor: networked"):
        as_config(config_for("s2fl", clock="measured"))


class _Agent:
    """Records which thread ran each command (ClientWorkers' scheduling only)."""

    def __init__(self, clients):
        self.data = type("D", (), {"samples": {c: None for c in clients}})()
        self.sessions = {"host": None}
        self.profiles, self.ran = {}, []

    def link(self, client, kind, nbytes):
        pass

    def handle(self, msg):
        self.ran.append((msg.type, threading.current_thread()))
        return Message("done", {"type": msg.type})


@pytest.mark.parametrize(
    "clients, kind, inline",
    [([0], "forward", True), ([0], "host", False), ([0, 1], "forward", False)],
)
def test_device_runs_a_lone_clients_command_in_the_reading_thread(clients, kind, inline):
    agent, out = _Agent(clients), queue.SimpleQueue()
    workers = device_workers.ClientWorkers(out, lambda: None)
    workers.dispatch(agent, Message(kind, {"client": 0}), 10)
    assert decode(out.get(timeout=10)).fields == {"type": kind}  # the reply was queued
    workers.close()
    assert (agent.ran[0][1] is threading.current_thread()) == inline
    with pytest.raises(WireError, match="not hosted"):
        workers.dispatch(agent, Message(kind, {"client": 7}), 10)


class _SlowAgent(_Agent):
    """The first command blocks until released; records what ran."""

    def __init__(self, clients):
        super().__init__(clients)
        self.started, self.release = threading.Event(), threading.Event()

    def handle(self, msg):
        if not self.started.is_set():
            self.started.set()
            self.release.wait(10)
        return super().handle(msg)


def test_closing_a_session_drops_its_queued_commands_and_waits_for_the_running_one():
    """After a lost connection, commands queued for it must not run on the agent the next
    session uses (an old ``backward`` would step the new round's part)."""
    agent, out = _SlowAgent([0, 1]), queue.SimpleQueue()
    workers = device_workers.ClientWorkers(out, lambda: None)
    for kind in ("forward", "backward", "finish"):
        workers.dispatch(agent, Message(kind, {"client": 0}), 10)
    assert agent.started.wait(10)  # the first command runs; two are queued behind it
    closing = threading.Thread(target=workers.close)
    closing.start()
    time.sleep(0.2)
    assert closing.is_alive()  # waits for the running command
    agent.release.set()
    closing.join(10)
    assert not closing.is_alive()
    assert [kind for kind, _ in agent.ran] == ["forward"]


def test_a_one_chunk_message_is_read_in_place_where_its_tensor_is_64_byte_aligned():
    """Protocol 3: the flag byte ends the chunk, so a one-chunk message is decoded from the
    received chunk itself; a tensor that lands 64-byte aligned there is a view of it."""
    x = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    (chunk,) = chunks(encode(Message("forwarded", {"step": 1}, {"fx": x})), 1 << 20)
    assert chunk[-1] == 1
    received = _chunk_at(bytes(chunk), _tensor_offset(bytes(chunk)), 0)
    data = Reassembler(1 << 20).feed(received)
    got = decode(data).tensors["fx"]
    assert torch.equal(got, x)
    start = np.frombuffer(data, np.uint8).ctypes.data
    assert start <= got.data_ptr() < start + len(data)  # a view of the chunk itself
    assert got.data_ptr() % 64 == 0


@pytest.mark.parametrize("alignment", [8, 16, 24, 32, 40, 48, 56])
def test_a_tensor_not_64_byte_aligned_in_the_message_is_decoded_as_a_copy(alignment):
    x = torch.arange(4096, dtype=torch.float32).reshape(64, 64)
    (chunk,) = chunks(encode(Message("forwarded", {"step": 1}, {"fx": x})), 1 << 20)
    received = _chunk_at(bytes(chunk), _tensor_offset(bytes(chunk)), alignment)
    data = Reassembler(1 << 20).feed(received)
    got = decode(data).tensors["fx"]
    start = np.frombuffer(data, np.uint8).ctypes.data
    assert not start <= got.data_ptr() < start + len(data)  # copied ...
    assert got.data_ptr() % 64 == 0 and torch.equal(got, x)  # ... to an aligned tensor


def test_a_received_tensor_computes_exactly_as_the_sent_one_wherever_it_lands():
    """Smashed data of a small batch read in place at an 8-byte aligned (not 16-byte) offset
    gave MKL products one ulp off the sender's, which split training amplified (a networked
    run 1.8e-4 off the sequential one after 4 rounds): decoded tensors compute as sent."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 256, generator=gen)
    w, b = torch.randn(128, 256, generator=gen), torch.randn(128, generator=gen)
    expected = torch.nn.functional.linear(x, w, b)
    (chunk,) = chunks(encode(Message("forwarded", {"step": 9}, {"fx": x})), 1 << 20)
    for alignment in range(0, 64, 8):
        received = _chunk_at(bytes(chunk), _tensor_offset(bytes(chunk)), alignment)
        got = decode(Reassembler(1 << 20).feed(received)).tensors["fx"]
        assert torch.equal(torch.nn.functional.linear(got, w, b), expected), alignment


def test_a_misaligned_buffer_is_decoded_from_an_aligned_copy():
    frame = encode(Message("m", {}, {"w": torch.arange(6, dtype=torch.float64)}))
    shifted = memoryview(bytearray(1) + frame.tobytes())[1:]  # starts at an odd address
    got = decode(shifted).tensors["w"]
    assert got.data_ptr() % 8 == 0 and got.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_protocol_2_framing_is_named_in_the_refusal():
    old_chunk = b"\x01" + encode(Message("hello", {"protocol": 2})).tobytes()  # flag first
    with pytest.raises(WireError, match="protocol 2"):
        Reassembler(1 << 20).feed(old_chunk)


def test_a_device_refused_by_a_protocol_2_server_says_to_install_the_same_version():
    """A server from before protocol 3 reads a protocol-3 chunk's first byte as its flag and
    refuses the hello with 'bad chunk flag': the device names the version mismatch."""
    from concurrent import futures

    from splitfl.net.device.agent import DeviceOptions
    from splitfl.net.device.session import run_device
    from splitfl.net.transport.hub import METHOD

    def old_hub(requests, context):
        next(requests)
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad hello: bad chunk flag")
        yield b""  # pragma: no cover

    server = grpc.server(futures.ThreadPoolExecutor(2))
    service, method = METHOD.strip("/").split("/")
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                service, {method: grpc.stream_stream_rpc_method_handler(old_hub)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    lines: list[str] = []
    try:
        opts = DeviceOptions(server=f"127.0.0.1:{port}", name="d", token="t", retry_s=5)
        assert run_device(opts, lines.append) == 2
    finally:
        server.stop(0)
    assert "bad chunk flag" in lines[-1] and "older splitfl" in lines[-1], lines

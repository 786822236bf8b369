"""Hostile devices (issue 24 B.1, 2, 6, 7, 8): everything a device sends is checked for type,
shape and magnitude before use; a poisoned update or smashed batch drops that client for the
round, never the run; strict JSON on the wire and in the metrics; bounded inboxes; a device
refuses bad commands and keeps serving. Loopback gRPC, devices in threads of this process
(an insider holding a valid token is a :class:`~splitfl.net.device.agent.DeviceAgent` subclass or a
raw stream speaking the wire protocol)."""

from __future__ import annotations

import json
import math
import queue
import time
import types

import grpc
import pytest
import torch

import splitfl
import splitfl.core.framing as framing
import splitfl.net.transport.wire as wire
from net_raw import RawStream
from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.core.plan import ClientUpdate
from splitfl.experiment.runner import as_config, prepare
from splitfl.net.device.agent import DeviceAgent
from splitfl.net.server.testbed import Testbed, free_port
from splitfl.net.transport.auth import TokenBook
from splitfl.net.transport.hub import LOST, METHOD, Hub, HubSettings
from splitfl.net.transport.inbox import INBOX_BYTES, INBOX_MAX, Inbox
from splitfl.net.transport.peer import outgoing
from splitfl.net.transport.wire import Message, WireError, decode, encode
from splitfl.testing import config_for

SMALL = {"rounds": 2, "data.num_clients": 4, "train.clients_per_round": 4}
DROPPED_0 = (
    "2 client updates dropped in 2 of 2 rounds (clients 0; dropped_reasons in metrics.jsonl)"
)


def _strict_rows(run_dir) -> list[dict]:
    """metrics.jsonl read as strict JSON (a NaN/Infinity literal fails)."""

    def refuse(literal):
        raise ValueError(f"{literal} in metrics.jsonl")

    text = (run_dir / "metrics.jsonl").read_text()
    return [json.loads(line, parse_constant=refuse) for line in text.splitlines() if line]


def _run(tmp_path, algorithm, agent_cls, devices=None, retry_s=20.0, **changes):
    """A networked run with an insider (``evil``, client 0) and an honest device; a device
    still redialling when the run ends gives up ``retry_s`` after it last heard the server."""
    devices = devices or {"evil": [0], "ok": [1, 2, 3]}
    bed = Testbed.create(tmp_path / "bed", list(devices))
    threads = [
        bed.device(name, clients, agent_cls if name == "evil" else None, retry_s=retry_s)
        for name, clients in devices.items()
    ]
    net = bed.server_overrides(min_devices=len(devices))
    result = splitfl.run(
        config_for(algorithm, **{**SMALL, **changes, **net}), run_dir=tmp_path / "n"
    )
    for t in threads:
        t.join(30)
    return result


def _final(result) -> dict[str, torch.Tensor]:
    return torch.load(result.run_dir / "model.pt", weights_only=True)


# -- B.1: a finite but huge model part ----------------------------------------------------------
class _HugePart(DeviceAgent):
    def _on_finish(self, c, msg):
        reply = super()._on_finish(c, msg)
        for name, t in reply.tensors.items():
            if t.is_floating_point():
                reply.tensors[name] = torch.full_like(t, 3e38)
        return reply


def test_a_huge_model_part_drops_that_client_and_never_reaches_the_model(tmp_path):
    result = _run(tmp_path, "splitfed_v1", _HugePart)
    rows = _strict_rows(result.run_dir)
    assert result.summary["status"] == f"ok ({DROPPED_0})"  # finished, and says what it lost
    for row in rows:
        assert row["dropped_clients"] == [0]
        assert "update norm" in row["dropped_reasons"]["0"]
        assert math.isfinite(row["test_loss"]) and row["train_loss"] > 0
    assert all(torch.isfinite(v).all() for v in _final(result).values() if v.is_floating_point())


def test_a_round_every_client_was_dropped_from_trains_nothing_and_says_so(tmp_path):
    changes = {"data.num_clients": 2, "train.clients_per_round": 2}
    result = _run(tmp_path, "splitfed_v1", _HugePart, {"evil": [0, 1]}, **changes)
    rows = _strict_rows(result.run_dir)
    assert [row["dropped_clients"] for row in rows] == [[0, 1], [0, 1]]
    assert [row["train_loss"] for row in rows] == [None, None]  # old code: 0.0
    start = prepare(as_config(config_for("splitfed_v1", **{**SMALL, **changes}))).ctx.model
    final = _final(result)
    assert all(torch.equal(v, final[k]) for k, v in start.state_dict().items())


def test_a_nan_in_the_aggregated_model_ends_the_run_as_diverged():
    from splitfl.executors import NonFiniteLossError
    from splitfl.experiment.round_step import check_finite_state

    check_finite_state({"w": torch.ones(2), "n": torch.tensor(3)})
    check_finite_state({"w": torch.tensor([1.0, math.inf])})  # left to the explosion check
    with pytest.raises(NonFiniteLossError, match="NaN in the aggregated model"):
        check_finite_state({"w": torch.tensor([1.0, math.nan])})


# -- B.2: finite but huge smashed data ----------------------------------------------------------
class _HugeSmashed(DeviceAgent):
    def _on_forward(self, c, msg):
        reply = super()._on_forward(c, msg)
        reply.tensors["fx"] = torch.full_like(reply.tensors["fx"], 3e38)
        return reply


def test_huge_smashed_data_drops_that_client_never_the_run(tmp_path):
    result = _run(tmp_path, "splitfed_v1", _HugeSmashed)
    rows = _strict_rows(result.run_dir)
    assert result.summary["status"] == f"ok ({DROPPED_0})" and len(rows) == 2
    for row in rows:
        assert row["dropped_clients"] == [0]
        assert "activation" in row["dropped_reasons"]["0"]
        assert math.isfinite(row["test_loss"])


# -- B.6: NaN in a reply's fields, and in the metrics -------------------------------------------
class _NaNTime(DeviceAgent):
    def handle(self, msg):
        reply = super().handle(msg)
        if reply is not None and msg.fields.get("client") == 0:
            reply.fields["compute_s"] = float("nan")
        return reply


def test_a_nan_in_a_reply_is_refused_and_metrics_stay_strict_json(tmp_path, monkeypatch):
    # the insider's encoder writes NaN literals (splitfl's own never does)
    lenient = types.SimpleNamespace(
        dumps=lambda *a, **k: json.dumps(*a, **{**k, "allow_nan": True}), loads=json.loads
    )
    monkeypatch.setattr(framing, "json", lenient)
    monkeypatch.setattr(framing, "_HEADER", json.JSONEncoder(separators=(",", ":"), allow_nan=True))
    # the insider's link is closed each round and it redials: after the run, 3 s (not 20)
    result = _run(tmp_path, "s2fl", _NaNTime, retry_s=3.0, clock="measured")
    rows = _strict_rows(result.run_dir)  # old code: NaN literals, not JSON
    assert rows  # the loop below is not vacuous
    for row in rows:
        assert "non-finite" in row["dropped_reasons"]["0"]
        assert all(t is None or math.isfinite(t) for t in row["measured_compute_s"])
        times = dict(zip(row["clients"], row["client_times"], strict=True))
        assert all(math.isfinite(t) for c, t in times.items() if c != 0)


def test_strict_json_on_the_wire():
    def raw(header: bytes) -> bytes:
        header += b" " * (-(8 + len(header)) % 8)
        return wire.MAGIC + len(header).to_bytes(4, "little") + header

    for bad in (b"NaN", b"Infinity", b"-Infinity", b"1e999"):
        with pytest.raises(WireError, match="strict JSON"):
            decode(raw(b'{"type": "t", "fields": {"x": ' + bad + b"}}"))
    with pytest.raises(WireError, match="nests deeper than 16"):
        decode(raw(b'{"type": "t", "fields": {"x": ' + b"[" * 30 + b"]" * 30 + b"}}"))
    with pytest.raises(WireError, match="nests deeper"):  # Python's recursion limit
        decode(raw(b'{"type": "t", "fields": {"x": ' + b"[" * 50000 + b"]" * 50000 + b"}}"))
    with pytest.raises(WireError, match="cannot be sent"):
        encode(Message("t", {"x": float("inf")}))
    assert decode(raw(b'{"type": "t", "fields": {"x": [1, {"y": 2.5}]}}')).fields == {
        "x": [1, {"y": 2.5}]
    }


def test_metrics_write_null_for_non_finite_numbers_with_a_warning(tmp_path, capsys):
    from splitfl.experiment.recorder import Recorder

    config = as_config(config_for("fedavg"))
    rec = Recorder(tmp_path, config, [], [], 0)
    rec.record({"round": 1, "train_loss": 1.5, "measured_compute_s": [0.1, float("nan")]})
    (row,) = _strict_rows(tmp_path)
    assert row["measured_compute_s"] == [0.1, None] and row["train_loss"] == 1.5
    assert "measured_compute_s[1] is nan; written as null" in capsys.readouterr().err


# -- B.7 and B.8: raw streams and a real device against a bare hub ----------------------------
@pytest.fixture
def hub():
    config = as_config(config_for("splitfed_v1", **SMALL))
    book = TokenBook()
    book.add("dev", "secret")
    settings = HubSettings(max_message_bytes=1 << 24, chunk_bytes=1 << 16)
    hub = Hub(settings, book, 4, {"config": config.to_dict(), "block": 2})
    port = hub.start(f"127.0.0.1:{free_port()}", None)
    yield hub, port
    hub.stop()


def _raw_stream(port: int, frames: queue.Queue):
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    return channel, channel.stream_stream(METHOD)(outgoing(frames, {"bytes": 1 << 16}))


def test_unsolicited_replies_are_bounded(hub):
    hub, port = hub
    raw = RawStream(port).hello("dev", "secret", [0])
    assert raw.outcome(10) == "welcome"
    raw.send(Message("ready"))
    blob = torch.zeros(1 << 16, dtype=torch.uint8)  # 64 KiB each, nobody asked for them
    for seq in range(200):
        raw.send(Message("ack", {"client": 0, "seq": seq}, {"x": blob}))
    deadline = time.monotonic() + 15
    link = None
    while time.monotonic() < deadline:
        link = hub.link_of(0)
        if link is not None and link.inbox[0].qsize() >= 16:
            time.sleep(1.0)  # let the rest arrive
            break
        time.sleep(0.05)
    assert link is not None and link.alive
    assert link.inbox[0].qsize() <= 16  # old code: all 200 (12.8 MiB) held
    raw.close()


def test_an_inbox_holds_at_most_its_bound_and_frees_what_is_taken():
    box, msg = Inbox(), Message("ack")
    assert box.offer(msg, INBOX_BYTES + 1)  # an empty inbox takes the awaited reply, any size
    assert not box.offer(msg, 1)  # ... and nothing beside it beyond the byte bound
    assert box.get(timeout=1)[1] == INBOX_BYTES + 1 and (box.held, box.held_bytes) == (0, 0)
    assert all(box.offer(msg, 10) for _ in range(INBOX_MAX))
    assert not box.offer(msg, 10)  # one message too many
    box.put(LOST)  # markers always go in, uncounted
    assert (box.held, box.held_bytes, box.qsize()) == (INBOX_MAX, 10 * INBOX_MAX, INBOX_MAX + 1)
    for _ in range(INBOX_MAX):
        box.get(timeout=1)
    assert (box.held, box.held_bytes) == (0, 0) and box.get(timeout=1) is LOST
    with pytest.raises(queue.Empty):
        box.get(timeout=0.01)


def test_a_json_bomb_hello_is_a_one_line_refusal(hub):
    _, port = hub
    frames: queue.Queue = queue.Queue()
    header = b'{"type": "hello", "fields": ' + b"[" * 20000 + b"]" * 20000 + b"}"
    header += b" " * (-(8 + len(header)) % 8)
    frames.put(wire.MAGIC + len(header).to_bytes(4, "little") + header)
    channel, stream = _raw_stream(port, frames)
    with pytest.raises(grpc.RpcError) as caught:
        next(iter(stream))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # old: UNKNOWN
    assert "nests deeper" in caught.value.details()
    assert "Error" not in caught.value.details()  # no Python exception text
    frames.put(None)
    channel.close()


def _ask(link, client: int, msg: Message, seq: int) -> Message:
    msg.fields.update(client=client, seq=seq)
    link.send(msg)
    got = link.reply(client, seq, 20.0)
    assert got is not None and got is not LOST, "no reply"
    return got[0]


def test_a_device_refuses_bad_commands_and_keeps_serving(hub, tmp_path):
    hub, port = hub
    bed = Testbed(tmp_path, port, {"dev": "secret"})
    device = bed.device("dev", [0, 1], retry_s=5.0)
    hub.wait_for(1, 30)
    link = hub.link_of(0)
    got = _ask(link, 0, Message("backward", {}, {"grad": torch.zeros(2, 3)}), 1)
    assert got.type == "error" and "before 'begin'" in got.fields["error"]
    got = _ask(link, 0, Message("begin", {"group": 0, "steps": 1, "lr": 0.1}), 2)
    assert got.type == "error" and "cut" in got.fields["error"]
    got = _ask(link, 0, Message("frobnicate"), 3)
    assert got.type == "error" and "unknown command" in got.fields["error"]
    assert device.is_alive() and link.alive  # old code: the device died with a traceback
    # a header nested deeper than the limit: the device drops the link and reconnects
    header = b'{"type": "forward", "fields": ' + b"[" * 20000 + b"]" * 20000 + b"}"
    header += b" " * (-(8 + len(header)) % 8)
    link.outbox.put(wire.MAGIC + len(header).to_bytes(4, "little") + header)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (hub.link_of(0) in (None, link)):
        time.sleep(0.1)
    again = hub.link_of(0)
    assert again is not None and again is not link and device.is_alive()
    assert any("bad message from the server" in line for line in device.lines)
    hub.stop()
    device.join(20)
    assert device.code == 0


# -- robust aggregation: exact values on hand-made inputs ---------------------------------------
def _updates(values, weights):
    ups = [
        ClientUpdate(i, 1, 0, 1, 1, {"blocks.0.w": torch.tensor(v, dtype=torch.float64)}, 0.0)
        for i, v in enumerate(values)
    ]
    return ups, dict(enumerate(weights))


A, B, C = [1.0, 10.0], [2.0, -4.0], [100.0, 0.0]
W = [1.0, 1.0, 2.0]
ZERO = {"blocks.0.w": torch.zeros(2, dtype=torch.float64)}


def Rule(*args, **kwargs):  # noqa: N802 (imported late: the old code has no module to import)
    from splitfl.aggregation.robust import Rule as rule

    return rule(*args, **kwargs)


def _agg(rule) -> list[float]:
    ups, weights = _updates([A, B, C], W)
    return layerwise_aggregate(ZERO, ups, {}, weights, rule)["blocks.0.w"].tolist()


def test_mean_is_the_weighted_average():
    assert _agg(Rule("mean")) == pytest.approx([(1 + 2 + 200) / 4, (10 - 4 + 0) / 4])


def test_weighted_median_takes_the_middle_of_the_cumulative_weight():
    # coordinate 0: 1 (w 1), 2 (w 1), 100 (w 2): cumulative 1, 2, 4 reaches half (2) exactly
    # at 2 → the mean of 2 and the next value; coordinate 1: -4, 0 (w 2), 10 → 0
    assert _agg(Rule("median")) == [51.0, 0.0]
    ups, weights = _updates([[1.0], [3.0], [7.0], [100.0]], [1, 1, 1, 1])
    one = {"blocks.0.w": torch.zeros(1, dtype=torch.float64)}
    assert layerwise_aggregate(one, ups, {}, weights, Rule("median"))["blocks.0.w"].item() == 5.0


def test_trimmed_mean_drops_the_extremes_and_weights_the_rest():
    assert _agg(Rule("trimmed_mean", trim_fraction=0.34)) == [2.0, 0.0]  # one dropped each end
    assert _agg(Rule("trimmed_mean", trim_fraction=0.2)) == pytest.approx(_agg(Rule("mean")))
    ups, weights = _updates([[1.0], [3.0], [7.0], [100.0], [-50.0]], [1, 2, 3, 1, 1])
    one = {"blocks.0.w": torch.zeros(1, dtype=torch.float64)}
    got = layerwise_aggregate(one, ups, {}, weights, Rule("trimmed_mean", trim_fraction=0.2))
    assert got["blocks.0.w"].item() == pytest.approx((1 * 1 + 3 * 2 + 7 * 3) / 6)


def test_clip_mean_clips_each_update_to_the_norm():
    na, nc = math.sqrt(101), 100.0  # ‖A‖, ‖C‖ (‖B‖ = √20 < 5)
    got = _agg(Rule("clip_mean", clip_norm=5.0))
    sa, sc = 5 / na, 5 / nc
    want = [(1 * sa + 2 + 2 * 100 * sc) / 4, (10 * sa - 4 + 0) / 4]
    assert got == pytest.approx(want, rel=1e-12)
    # null: the round's median update norm (√101), so only C is scaled
    got = _agg(Rule("clip_mean"))
    want = [(1 + 2 + 2 * 100 * na / nc) / 4, (10 - 4) / 4]
    assert got == pytest.approx(want, rel=1e-12)


def test_centered_clip_clips_each_distance_from_the_median_by_hand():
    """Centre: the coordinate-wise median of A, B, C, (2, 0); distances from it √101, 4 and
    98; τ null: their median √101, so only C's (98, 0) is scaled, to length √101; the
    weighted (1, 1, 2) mean of the clipped deviations is added to the centre. τ = 5 scales
    A's (−1, 10) by 5/√101 and C's by 5/98; B (distance 4) is kept whole."""
    r = math.sqrt(101)
    want = [2 + (-1 + 0 + 2 * r) / 4, (10 - 4 + 0) / 4]
    assert _agg(Rule("centered_clip")) == pytest.approx(want, rel=1e-12)
    sa = 5 / r
    want = [2 + (-sa + 0 + 2 * 5) / 4, (10 * sa - 4) / 4]
    assert _agg(Rule("centered_clip", clip_norm=5.0)) == pytest.approx(want, rel=1e-12)
    # a liar far out moves the result by at most τ × its weight share: 0, 1, 2, 100 → 1.25
    # (the lower median 1; distances 1, 0, 1, 99; τ the median 1; the mean would be 25.75)
    ups, weights = _updates([[0.0], [1.0], [2.0], [100.0]], [1, 1, 1, 1])
    one = {"blocks.0.w": torch.zeros(1, dtype=torch.float64)}
    got = layerwise_aggregate(one, ups, {}, weights, Rule("centered_clip"))
    assert got["blocks.0.w"].item() == pytest.approx(1.25, rel=1e-12)


@pytest.mark.parametrize("rule", ["clip_mean", "median", "trimmed_mean", "centered_clip"])
def test_every_rule_runs_an_experiment(tmp_path, rule):
    config = config_for("splitfed_v1", rounds=1, **{"train.aggregation": rule})
    result = splitfl.run(config, run_dir=tmp_path / rule)
    assert result.summary["status"] == "ok"
    assert all(torch.isfinite(v).all() for v in _final(result).values() if v.is_floating_point())


@pytest.mark.parametrize(
    ("where", "value", "problem"),
    [
        ((0, 0), float("nan"), "non-finite"),
        ((1, 2), float("inf"), "non-finite"),
        ((3, 1), -float("inf"), "non-finite"),
        ((2, 3), -7.5, "activation 7.5 above 5"),  # the peak is |min| when it is negative
        ((0, 3), 7.5, "activation 7.5 above 5"),
        ((1, 1), -5.0, None),  # at the limit
        (None, 0.0, None),
    ],
)
def test_smashed_data_checks_by_hand(where, value, problem):
    from splitfl.net.trust.checks import TensorSpec, smashed_problem

    fx, y = torch.zeros(4, 4), torch.tensor([0, 9, 3, 1])
    if where is not None:
        fx[where] = value
    got = smashed_problem(fx, y, [TensorSpec((4,), torch.float32, 5.0)], 4, 10)
    assert got == problem if problem is None else problem in got


@pytest.mark.parametrize("label", [-1, 10])
def test_labels_out_of_range_are_refused(label):
    from splitfl.net.trust.checks import TensorSpec, smashed_problem

    y = torch.tensor([0, label, 3])
    spec = [TensorSpec((4,), torch.float32, 5.0)]
    assert smashed_problem(torch.zeros(3, 4), y, spec, 4, 10) == ("label out of range")


def _tuple_case(change):
    fx = (
        torch.zeros(3, 4),
        torch.zeros(3, 4, dtype=torch.bool),
        torch.zeros(3, 2, dtype=torch.int64),
    )
    fx = change(list(fx))
    return tuple(fx) if isinstance(fx, list) else fx


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        (lambda fx: fx, None),
        (lambda fx: fx[:2], "2 tensors for 3"),
        (lambda fx: fx[0], "1 tensors for 3"),
        (lambda fx: [fx[0], None, fx[2]], "missing tensor"),
        (lambda fx: [fx[0], fx[1].float(), fx[2]], "dtype torch.float32/torch.float32/torch.int64"),
        (lambda fx: [fx[0], fx[1], fx[2][:, :1]], "shape"),
        (lambda fx: [fx[0], fx[1], fx[2] + 50], "integer value 50 above 49"),
        (lambda fx: [fx[0], fx[1], fx[2] - 50], "integer value 50 above 49"),
        (lambda fx: [fx[0].fill_(float("nan")), fx[1], fx[2]], "non-finite values"),
        (lambda fx: [fx[0] + 6, fx[1], fx[2]], "activation 6 above 5"),
        (lambda fx: [fx[0], ~fx[1], fx[2]], None),  # a bool mask has no magnitude
    ],
)
def test_several_tensors_across_a_cut_are_checked_one_by_one(change, problem):
    """A graph-split model's cut sends a tuple (activation, bool mask, int64 ids): each is
    checked against its own spec — float magnitude, integer range, bool dtype only."""
    from splitfl.net.trust.checks import TensorSpec, smashed_problem

    specs = [
        TensorSpec((4,), torch.float32, 5.0),
        TensorSpec((4,), torch.bool),
        TensorSpec((2,), torch.int64, 49.0),
    ]
    got = smashed_problem(_tuple_case(change), torch.tensor([0, 1, 2]), specs, 4, 10)
    assert got == problem if problem is None else problem in got

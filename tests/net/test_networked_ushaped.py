"""U-shaped split learning on the networked runtime (issue 47 item 5): real gRPC on loopback,
devices in threads of the test process (that a networked run equals the sequential one, with
the cost model's bytes: ``tests/conformance/test_topologies.py``). No label ever reaches the
server (every message it receives is recorded); a device whose head gradient is malformed is
dropped for the round in one line and the run goes on; emulated devices and the middle are
stretched to their profiles; with LoRA only the adapters travel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import splitfl
import splitfl.net.transport.inbox as inbox
from splitfl.experiment.runner import as_config
from splitfl.models import ModelPart, block_index
from splitfl.net.device.agent import ClientData, DeviceAgent
from splitfl.net.device.emulation import Profile
from splitfl.net.server.remote_fleet import Meter
from splitfl.net.server.testbed import Testbed
from splitfl.net.server.ushaped import TimedMiddle
from splitfl.net.transport.wire import Message, state_tensors
from splitfl.roles.sides import DeviceRole
from splitfl.testing import config_for
from splitfl.topologies.ushaped.roles import Sent

DEVICES = {"d0": [0, 3, 6, 9], "d1": [1, 4, 7, 10], "d2": [2, 5, 8, 11]}
SMALL = {"data.num_clients": 4, "train.clients_per_round": 4}


def _networked(tmp_path, algorithm, devices=DEVICES, agent_cls=None, **changes):
    bed = Testbed.create(tmp_path / "bed", list(devices))
    retry_s = 20.0 if agent_cls is None else 3.0
    threads = [bed.device(n, clients, agent_cls, retry_s=retry_s) for n, clients in devices.items()]
    net = bed.server_overrides(min_devices=len(devices))
    result = splitfl.run(config_for(algorithm, **{**changes, **net}), run_dir=tmp_path / "net")
    for t in threads:
        t.join(30)
    return result, threads


def _final(result) -> dict[str, torch.Tensor]:
    return torch.load(result.run_dir / "model.pt", weights_only=True)


def _rows(result) -> list[dict]:
    lines = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line]


def test_emulated_ushaped_devices_take_at_least_their_profiles_eq1_time(tmp_path):
    """``network.emulate``: a U-shaped device stretches its front's forward and backward and
    its head's step to its profile, the server its middle's forward and backward, and every
    transfer is held for bytes / R, so each client's measured busy time is at least the
    clock's time for it (both hops each way; no contention, no jitter)."""
    changes = {
        **SMALL,
        "rounds": 2,
        "devices.preset": "s2fl_table1",
        "devices.contention": False,
        "devices.jitter": 0.0,
        "network.emulate": True,
    }
    devices = {"d0": [0, 2], "d1": [1, 3]}
    net, threads = _networked(tmp_path, "ushaped_sl", devices, **changes)
    assert [t.code for t in threads] == [0, 0]
    rows = _rows(net)
    assert len(rows) == 2
    for row in rows:
        assert row["dropped_clients"] == [] and len(row["client_times"]) == 4
        for measured, predicted in zip(row["measured_busy_s"], row["client_times"], strict=True):
            assert measured >= predicted * 0.999
        assert row["measured_round_time"] >= row["round_time"] * 0.999


def _record(monkeypatch) -> tuple[list, list]:
    """Every message the server decodes off a device stream, and the labels of every batch
    a device drew."""
    received, labels = [], []
    decode, forward = inbox.decode, DeviceRole.forward

    def recording_decode(data):
        message = decode(data)
        received.append(message)
        return message

    def recording_forward(self, step):
        fx, y = forward(self, step)
        labels.append(y.clone())
        return fx, y

    monkeypatch.setattr(inbox, "decode", recording_decode)
    monkeypatch.setattr(DeviceRole, "forward", recording_forward)
    return received, labels


def _label_hits(received, labels) -> list[tuple[str, str]]:
    """(message type, tensor name) of every received tensor named ``y`` or holding the values
    of a batch's labels (in any dtype or shape)."""
    hits = []
    for msg in received:
        for name, t in msg.tensors.items():
            same = any(
                t.numel() == y.numel() and torch.equal(t.flatten().double(), y.double())
                for y in labels
            )
            if name == "y" or name.endswith("/y") or same:
                hits.append((msg.type, name))
    return hits


def test_labels_never_leave_a_ushaped_device(tmp_path, monkeypatch):
    received, labels = _record(monkeypatch)
    _networked(tmp_path / "u", "ushaped_sl", {"a": [0, 2], "b": [1, 3]}, rounds=1, **SMALL)
    assert labels and sum(len(m.tensors) for m in received) > 0
    assert _label_hits(received, labels) == []
    types = {m.type for m in received}
    assert {"u_forwarded", "u_headed", "u_finished"} <= types and "forwarded" not in types
    # the same check on a SplitFed V1 round finds the labels its devices send
    received.clear(), labels.clear()
    _networked(tmp_path / "s", "splitfed_v1", {"a": [0, 2], "b": [1, 3]}, rounds=1, **SMALL)
    hits = _label_hits(received, labels)
    assert hits and {h for h in hits} == {("forwarded", "y")}
    assert len(hits) == sum(m.type == "forwarded" for m in received)


def _corrupting(how):
    class BadHead(DeviceAgent):
        """Client 0's head gradient corrupted (``how``) before it is sent."""

        def handle(self, msg):
            reply = super().handle(msg)
            if reply is not None and reply.type == "u_headed" and reply.fields["client"] == 0:
                reply.tensors["grad"] = how(reply.tensors["grad"])
            return reply

    return BadHead


@pytest.mark.parametrize(
    "how,reason",
    [
        (lambda g: g[:, :1], "shape"),
        (lambda g: torch.full_like(g, float("nan")), "non-finite values"),
        (lambda g: g * 1e6, "gradient RMS"),
    ],
    ids=["wrong_shape", "nan", "huge"],
)
def test_a_malformed_head_gradient_drops_the_client_and_the_run_goes_on(tmp_path, how, reason):
    devices = {"evil": [0], "ok": [1, 2, 3]}
    net, _ = _networked(tmp_path, "ushaped_sl", devices, _corrupting(how), rounds=2, **SMALL)
    rows = _rows(net)
    assert len(rows) == 2
    for row in rows:
        assert row["dropped_clients"] == [0]
        why = row["dropped_reasons"]["0"]
        assert why.startswith("rejected head gradient: ") and reason in why and "\n" not in why
        assert len(row["clients"]) == 4  # the honest three trained
    final = _final(net)
    assert all(torch.isfinite(v).all() for v in final.values() if v.is_floating_point())


def test_a_ushaped_device_refuses_the_commands_that_would_send_its_labels():
    """On the device: after ``u_begin``, the split round's ``forward`` (smashed data and
    labels) and ``local_step`` are refused; ``u_forward`` answers the smashed data alone."""
    config = as_config(config_for("ushaped_sl", **SMALL))
    agent = DeviceAgent(config, ClientData(config, [0], None))
    cut, tail, n = 1, 3, agent.model.num_blocks
    state = {k: v for k, v in agent.model.state_dict().items() if not cut <= block_index(k) < tail}
    fields = {"cut": cut, "tail": tail, "group": 0, "batch_size": 4, "steps": 2, "lr": 0.1}
    fields |= {"round_seed": 5, "client": 0, "seq": 1}
    assert agent.handle(Message("u_begin", fields, state_tensors("part", state))).type == "ack"
    for refused in ("forward", "local_step"):
        reply = agent.handle(Message(refused, {"step": 0, "client": 0, "seq": 2}))
        assert reply.type == "error" and "refused" in reply.fields["error"]
        assert agent.handle(Message("u_begin", fields, state_tensors("part", state))).type == "ack"
    reply = agent.handle(Message("u_forward", {"step": 0, "client": 0, "seq": 3}))
    assert reply.type == "u_forwarded" and set(reply.tensors) == {"fx"}
    bad = dict(fields, tail=n)
    reply = agent.handle(Message("u_begin", bad, state_tensors("part", state)))
    assert reply.type == "error" and "tail" in reply.fields["error"]


def test_an_emulated_ushaped_device_stretches_front_and_head_to_its_profile():
    """``network.emulate`` on the device: ``u_forward`` takes the front's forward share of
    its per-sample FLOPs, ``u_head`` the head's whole step (``head_flops``), ``backward`` the
    front's rest, each at the profile's FLOPS (batch 4 at 1e6 FLOPS: 0.1 s, 0.2 s, 0.2 s; the
    real compute of this tiny model is milliseconds)."""
    config = as_config(config_for("ushaped_sl", **SMALL))
    agent = DeviceAgent(config, ClientData(config, [0], None))
    cut, tail = 1, 3
    state = {k: v for k, v in agent.model.state_dict().items() if not cut <= block_index(k) < tail}
    fields = {"cut": cut, "tail": tail, "group": 0, "batch_size": 4, "steps": 1, "lr": 0.1}
    fields |= {"round_seed": 5, "client": 0, "seq": 1, "head_flops": 5e4}
    agent.profiles[0] = Profile(1e6, 1e12, 1e12, 7.5e4)  # set from u_begin's fields by workers
    assert agent.handle(Message("u_begin", fields, state_tensors("part", state))).type == "ack"
    forwarded = agent.handle(Message("u_forward", {"step": 0, "client": 0, "seq": 2}))
    assert forwarded.fields["compute_s"] >= 0.1 * 0.999
    out = ModelPart(agent.model, cut, tail)(forwarded.tensors["fx"]).detach()
    headed = agent.handle(Message("u_head", {"client": 0, "seq": 3}, {"out": out}))
    assert headed.type == "u_headed" and headed.fields["compute_s"] >= 0.2 * 0.999
    grad = torch.zeros_like(forwarded.tensors["fx"])
    assert agent.handle(Message("backward", {"client": 0, "seq": 4}, {"grad": grad})) is None
    finished = agent.handle(Message("u_finish", {"client": 0, "seq": 5}))
    assert finished.type == "u_finished" and finished.fields["compute_s"] >= 0.2 * 0.999
    bad = dict(fields, head_flops=-1.0)
    reply = agent.handle(Message("u_begin", bad, state_tensors("part", state)))
    assert reply.type == "error" and "head_flops" in reply.fields["error"]


def test_an_emulated_middle_is_stretched_to_the_server_flops():
    """The server's middle under emulation: forward ``Σ samples × FORWARD_SHARE × FLOPs /
    Comp_s``, backward the rest, charged to each member it served."""

    class Instant:
        def forward(self, sent):
            return [None for _ in sent]

        def backward(self, grads):
            return dict(grads)

    meters = {0: Meter(), 1: Meter()}
    middle = TimedMiddle(Instant(), meters, ({0: 1.5e5, 1: 1.5e5}, 1e6))
    sent = [Sent(c, 1, None, 2) for c in (0, 1)]  # 2 samples each: 4 × 1.5e5 / 1e6 = 0.6 s
    middle.forward(sent)
    middle.backward({0: None, 1: None})
    for m in meters.values():
        assert m.server_s >= 0.6 * 0.999


def test_networked_ushaped_lora_sends_only_the_adapters(tmp_path, sequential_run):
    """U-shaped split learning of a LoRA-adapted RoBERTa: front and head travel without
    their frozen base (each device builds it from its own model files), the bytes are the
    cost model's, and the run equals the sequential one."""
    from hf_fixtures import save_tiny

    folder = save_tiny(tmp_path / "roberta", "roberta", dropout=0.0)
    changes = {
        **SMALL,
        "rounds": 2,
        "model": f"hf:{folder}",
        "data.dataset": "hf_fixtures:token_classification_data",
        "data.partition": "iid",
        "import_dirs": [str(Path(__file__).parents[1])],
        "train.lora": {"r": 2, "alpha": 4, "target_modules": ["query", "value"]},
        "options.ushaped_sl.cut": 1,
        "options.ushaped_sl.tail": 2,
    }
    net, threads = _networked(tmp_path, "ushaped_sl", {"d0": [0, 3], "d1": [1, 2]}, **changes)
    seq = sequential_run(config_for("ushaped_sl", **changes))
    a, b = _final(net), _final(seq)
    assert a.keys() == b.keys()
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-5
    assert [t.code for t in threads] == [0, 0]
    rows = _rows(net)
    assert len(rows) == 2
    for row in rows:
        assert row["dropped_clients"] == []
        assert row["payload_model_down"] == row["bytes_model_down"] > 0
        assert row["payload_model_up"] == row["bytes_model_up"]

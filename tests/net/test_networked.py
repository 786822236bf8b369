"""Networked execution over real gRPC on loopback, devices in threads of the test process.

Equivalence: a networked run gives the sequential run's final model (same seed) for every
parameter-server algorithm, and the payload the devices actually sent equals the cost model's
traffic. Faults and security: lost, stalled and lying devices are dropped without touching the
model; bad tokens, versions, duplicate names and oversized messages are refused.
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import torch

import splitfl
from splitfl.experiment.runner import as_config, prepare
from splitfl.net.device.agent import DeviceAgent
from splitfl.net.device.emulation import Profile
from splitfl.net.server.testbed import Testbed
from splitfl.testing import config_for

#: Networked ≡ sequential for these algorithms; each topology's representative (SplitFed V1,
#: SplitFed V2, …) is checked in tests/conformance/test_topologies.py.
SCOPE = [
    "fedavg",
    "splitfed_ringsfl",
    "vanilla_sl",
    "s2fl",
    "mergesfl",
    "locfedmix_sl",
    "adasfl",
    "pyramidfl",
    "ifca",
    "adasampling",
    "splitlora",
]
DEVICES = {"d0": [0, 3, 6, 9], "d1": [1, 4, 7, 10], "d2": [2, 5, 8, 11]}


def _final(result) -> dict[str, torch.Tensor]:
    return torch.load(result.run_dir / "model.pt", weights_only=True)


def _rows(result) -> list[dict]:
    lines = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line]


def _networked(tmp_path, algorithm, devices=DEVICES, agent_cls=None, network=None, **changes):
    """The run on thread devices; an ``agent_cls`` with a ``woken`` event (:class:`_Stall`)
    has it set once the run has returned, before the threads are joined."""
    bed = Testbed.create(tmp_path / "bed", list(devices))
    # Honest devices wait long enough for a loaded machine's server to start listening; a
    # device cut off at the end (misbehaving, stalled, oversized) retries briefly, then gives up.
    retry_s = 20.0 if agent_cls is None and network is None else 3.0
    threads = [
        bed.device(name, clients, agent_cls, retry_s=retry_s) for name, clients in devices.items()
    ]
    net = bed.server_overrides(min_devices=len(devices), **(network or {}))
    woken = getattr(agent_cls, "woken", None)
    try:
        result = splitfl.run(config_for(algorithm, **{**changes, **net}), run_dir=tmp_path / "net")
    finally:
        if woken is not None:
            woken.set()
    for t in threads:
        t.join(30)
    return result, threads


@pytest.mark.parametrize("algorithm", SCOPE)
def test_networked_run_equals_sequential_run(tmp_path, algorithm, sequential_run):
    net, threads = _networked(tmp_path, algorithm, rounds=2)
    seq = sequential_run(config_for(algorithm, rounds=2))
    a, b = _final(net), _final(seq)
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-5
    assert [t.code for t in threads] == [0, 0, 0]  # every device ended on the server's bye
    rows = _rows(net)
    assert len(rows) == 2
    for row in rows:
        assert row["dropped_clients"] == []
        # the tensors the devices sent are the cost model's activation traffic, byte for byte
        assert row["payload_activations_up"] == row["bytes_activations_up"]
        assert row["payload_gradients_down"] == row["bytes_gradients_down"]
        if algorithm != "locfedmix_sl":  # its devices keep their parts between aggregations
            # in the cost model; networked, the part still travels every round (a gap:
            # docs/explanation/trust-model.md)
            assert row["payload_model_up"] >= row["bytes_model_up"]
        # encoded messages on the wire carry at least the payload (headers on top)
        sent_up = row["payload_activations_up"] + row["payload_labels_up"]
        assert row["wire_bytes_up"] >= sent_up + row["payload_model_up"]
        assert row["wire_bytes_down"] >= row["payload_model_down"] + row["payload_gradients_down"]
        assert all(t is not None and t > 0 for t in row["measured_busy_s"])


def test_measured_clock_feeds_the_algorithm_the_measured_times(tmp_path):
    net, _ = _networked(tmp_path, "s2fl", rounds=2, clock="measured")
    rows = _rows(net)
    assert len(rows) == 2
    for row in rows:
        assert row["client_times"] == pytest.approx(row["measured_busy_s"])
        assert row["round_time"] == pytest.approx(row["measured_round_time"])
    assert rows[-1]["sim_time"] == pytest.approx(sum(r["measured_round_time"] for r in rows))


class _LyingDevice(DeviceAgent):
    """Sends NaN smashed data for client 0 and an update of the wrong shape for client 3."""

    def _on_forward(self, c, msg):
        reply = super()._on_forward(c, msg)
        if c == 0:
            reply.tensors["fx"] = torch.full_like(reply.tensors["fx"], float("nan"))
        return reply

    def _on_finish(self, c, msg):
        reply = super()._on_finish(c, msg)
        if c == 3:
            name = next(k for k in reply.tensors if k.startswith("part/"))
            reply.tensors[name] = torch.zeros(1)
        return reply


def test_lying_device_is_rejected_and_never_touches_the_model(tmp_path):
    devices = {"liar": [0, 3], "honest": [1, 2, 4, 5]}
    changes = {"rounds": 1, "data.num_clients": 6, "train.clients_per_round": 6}
    net, _ = _networked(tmp_path, "splitfed_v1", devices, _LyingDevice, **changes)
    (row,) = _rows(net)
    assert row["dropped_clients"] == [0, 3]
    assert "non-finite" in row["dropped_reasons"]["0"]
    assert "rejected model update" in row["dropped_reasons"]["3"]
    # same as the honest clients alone: a round of the run restricted to them (in-process)
    final = _final(net)
    assert all(torch.isfinite(v).all() for v in final.values() if v.is_floating_point())


def test_rejected_smashed_data_leaves_the_global_model_unchanged(tmp_path):
    class WrongShape(DeviceAgent):
        def _on_forward(self, c, msg):
            reply = super()._on_forward(c, msg)
            reply.tensors["fx"] = reply.tensors["fx"][:, :1]
            return reply

    changes = {"rounds": 1, "data.num_clients": 2, "train.clients_per_round": 2}
    net, _ = _networked(tmp_path, "splitfed_v1", {"a": [0], "b": [1]}, WrongShape, **changes)
    (row,) = _rows(net)
    assert row["dropped_clients"] == [0, 1]
    assert all("shape" in why for why in row["dropped_reasons"].values())
    start = prepare(as_config(config_for("splitfed_v1", **changes))).ctx.model.state_dict()
    final = _final(net)
    assert all(torch.equal(start[k], final[k]) for k in start)


class _CrashOnce(DeviceAgent):
    """Loses its connection at round 2's first forward of client 1, then reconnects."""

    crashed = False

    def _on_forward(self, c, msg):
        if c == 1 and msg.fields["step"] == 0 and self.rounds_seen == 2 and not _CrashOnce.crashed:
            _CrashOnce.crashed = True
            raise ConnectionResetError("simulated link loss")
        return super()._on_forward(c, msg)

    def _on_begin(self, c, msg):
        if c == 1:
            self.rounds_seen = getattr(self, "rounds_seen", 0) + 1
        return super()._on_begin(c, msg)


def test_lost_device_is_dropped_for_the_round_and_selectable_after_reconnecting(tmp_path):
    changes = {"rounds": 4, "data.num_clients": 4, "train.clients_per_round": 4}
    devices = {"a": [0, 2], "b": [1, 3]}
    net, threads = _networked(tmp_path, "splitfed_v1", devices, _CrashOnce, **changes)
    rows = _rows(net)
    assert [r["dropped_clients"] for r in rows] == [[], [1, 3], [], []]
    assert "lost" in rows[1]["dropped_reasons"]["1"]
    assert [len(r["clients"]) for r in rows] == [4, 4, 4, 4]
    final = _final(net)
    assert all(torch.isfinite(v).all() for v in final.values() if v.is_floating_point())
    assert [t.code for t in threads] == [0, 0]


class _Stall(DeviceAgent):
    """Client 0 stalls ``STALL_S`` in its forward, or until ``woken`` (set once the run has
    returned: the rest of the stall is not waited out before the threads are joined)."""

    woken = threading.Event()

    def _on_forward(self, c, msg):
        if c == 0:
            _Stall.woken.wait(STALL_S)
        return super()._on_forward(c, msg)


#: The stall and the server's timeout: an honest device's reply to one tiny forward must
#: come within the timeout on a loaded machine (at 1 s the honest device was dropped too,
#: 2 shared cores running the suite beside four other jobs), and the stall must outlast it.
STALL_S, TIMEOUT_S = 12.0, 4.0


def test_stalled_device_is_dropped_within_the_timeout(tmp_path):
    changes = {"rounds": 1, "data.num_clients": 2, "train.clients_per_round": 2}
    start = time.monotonic()
    _Stall.woken.clear()
    net, _ = _networked(
        tmp_path,
        "splitfed_v1",
        {"slow": [0], "ok": [1]},
        _Stall,
        {"timeout_s": TIMEOUT_S},
        **changes,
    )
    (row,) = _rows(net)
    assert row["dropped_clients"] == [0]
    assert "no reply within 4 s" in row["dropped_reasons"]["0"]
    assert time.monotonic() - start < 60


def test_oversized_message_is_refused(tmp_path):
    changes = {"rounds": 1, "data.num_clients": 2, "train.clients_per_round": 2}
    # 0.002 MiB: a hello, ready or ack passes; 16 samples of smashed data do not
    net, _ = _networked(
        tmp_path, "splitfed_v1", {"a": [0], "b": [1]}, None, {"max_message_mb": 0.002}, **changes
    )
    (row,) = _rows(net)
    assert row["dropped_clients"] == [0, 1]
    assert all("limit" in why for why in row["dropped_reasons"].values())


def test_emulated_devices_take_at_least_their_profiles_eq1_time(tmp_path):
    """With emulation every measured term is held to at least its Eq. 1 value (compute
    stretched to Comp_c, transfers held for bytes / R, the server step to Comp_s), so each
    client's measured busy time is at least its cost-model time (no contention, no jitter)."""
    changes = {
        "rounds": 2,
        "data.num_clients": 6,
        "train.clients_per_round": 6,
        "devices.preset": "s2fl_table1",
        "devices.contention": False,
        "devices.jitter": 0.0,
    }
    devices = {"a": [0, 2, 4], "b": [1, 3, 5]}
    net, _ = _networked(tmp_path, "s2fl", devices, None, {"emulate": True}, **changes)
    rows = _rows(net)
    assert len(rows) == 2 and all(len(row["client_times"]) == 6 for row in rows)
    for row in rows:
        for measured, predicted in zip(row["measured_busy_s"], row["client_times"], strict=True):
            assert measured >= predicted * 0.999
        assert row["measured_round_time"] >= row["round_time"] * 0.999


def test_emulation_profile_fields_round_trip_and_reject_nonsense():
    p = Profile(1e9, 2e6, 3e6, 5e4)
    assert Profile.from_fields(p.to_fields()) == p
    assert Profile.from_fields({}) is None
    assert Profile.from_fields({**p.to_fields(), "flops": 0}) is None
    assert Profile.from_fields({**p.to_fields(), "uplink": "fast"}) is None


GRAPH_SPLIT = {"model": "graph_models:unet", "split.cut_points": ["mid", "up"], "split.cut": "mid"}


def test_networked_model_with_a_graph_per_mode_trains(tmp_path, sequential_run):
    """The EfficientNet pattern (drop-connect and dropout under ``if self.training``: pieces
    with one graph per mode) on device processes: the round completes and gives the
    sequential run's parameter names with finite values (the draws of dropout on devices
    are not the sequential run's, for any model with dropout: not compared)."""
    model = {"model": "graph_models:efficientnet"}
    net, threads = _networked(tmp_path, "splitfed_v1", rounds=1, **model)
    seq = sequential_run(config_for("splitfed_v1", rounds=1, **model))
    a, b = _final(net), _final(seq)
    assert a.keys() == b.keys() and all(torch.isfinite(t).all() for t in a.values())
    assert [t.code for t in threads] == [0, 0, 0]
    rows = _rows(net)
    assert len(rows) == 1 and rows[0]["train_loss"] > 0 and rows[0]["dropped_clients"] == []


@pytest.mark.parametrize("algorithm", ["s2fl", "mergesfl"])
def test_networked_graph_split_model_equals_sequential(tmp_path, algorithm, sequential_run):
    """A model with its own forward, cut where two tensors cross (the U-Net's activation and
    skip): they travel as fx.0/fx.1 and grad.0/grad.1, are checked one by one, and the run
    equals the sequential one; the bytes sent are the cost model's."""
    net, threads = _networked(tmp_path, algorithm, rounds=2, **GRAPH_SPLIT)
    seq = sequential_run(config_for(algorithm, rounds=2, **GRAPH_SPLIT))
    a, b = _final(net), _final(seq)
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-5
    assert [t.code for t in threads] == [0, 0, 0]
    rows = _rows(net)
    assert len(rows) == 2
    for row in rows:
        assert row["dropped_clients"] == []
        assert row["payload_activations_up"] == row["bytes_activations_up"] > 0
        assert row["payload_gradients_down"] == row["bytes_gradients_down"] > 0

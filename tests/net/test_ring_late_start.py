"""A RingSFL member slow to start the ring (issue 35, item 6's ring staller): a member that
answers the ring command late from the first round sets the measured ring round itself, so
the round deadline grows with it; its start acknowledgement (``ring_started``, timed on the
server's clock) names it. The round's work is kept, the member is benched for the next
rounds (``network.late_bench_rounds``, doubling). Loopback gRPC, devices in threads."""

from __future__ import annotations

import time

import pytest
from test_networked_d2d import RING_DEVICES, _assert_named, _breaking, _DiesInRing

import splitfl
from splitfl.metrics import summary
from splitfl.net.device import ring as ring_device
from splitfl.net.device.agent import DeviceAgent
from splitfl.net.server import lateness
from splitfl.net.server.clusters import D2DRound
from splitfl.net.server.remote_fleet import Meter
from splitfl.net.server.ring import (
    RingEmulation,
    _acknowledged,
    _collect,
    late_starts,
    start_latency,
)
from splitfl.net.server.testbed import Testbed
from splitfl.net.transport.wire import Message
from splitfl.testing import config_for


def test_late_starts_by_hand():
    """Latencies 0.01, 0.02, 0.03, 1.5: lower median 0.02; the limit max(10 × 0.02, 0.02 + 1)
    = 1.02 names 1.5 only; factor 0 checks nothing; with factor 100 the limit is 2."""
    latency = {0: 1.5, 1: 0.01, 2: 0.02, 3: 0.03}
    out = late_starts(latency, 10.0)
    assert list(out) == [0]
    assert out[0] == (
        "late to start: started the ring 1.5 s after its command, the ring's median 0.02 s "
        "(above network.round_deadline_factor 10 x it and 1 s over it)"
    )
    assert late_starts(latency, 0.0) == {}
    assert late_starts(latency, 100.0) == {}
    # a ring of two: the lower median is the other member's; alone: nothing to hold it to
    assert list(late_starts({0: 1.5, 1: 0.01}, 10.0)) == [0]
    assert late_starts({0: 0.05, 1: 0.01}, 10.0) == {}
    assert late_starts({0: 9.0}, 10.0) == {}


def test_start_latency_takes_the_start_less_the_emulated_download():
    """Sent at 10.0 with 4000 wire bytes: member 0 started at 14.5 on a 1000 B/s emulated
    downlink (4 s held: it could not start earlier), member 1 at 12.0 (its reply: it sent no
    acknowledgement), member 2 at 10.1; a member not known to have started is left out."""
    sent = {0: (7, 4000, 10.0, 0), 1: (8, 4000, 10.0, 0), 2: (9, 4000, 10.0, 0)}
    fast = {"downlink": 1e18}
    emulation = RingEmulation({0: {"downlink": 1000.0}, 1: fast, 2: fast}, [])
    got = start_latency(sent, {0: 14.5, 1: 12.0, 2: 10.1}, emulation)
    assert got == pytest.approx({0: 0.5, 1: 2.0, 2: 0.1})
    assert start_latency(sent, {0: 10.5, 2: 10.1}, None) == pytest.approx({0: 0.5, 2: 0.1})


def test_an_acknowledgement_before_the_command_was_sent_is_not_recorded():
    ack = (Message("ring_started", {"client": 0, "seq": 7}), 60, 5.0)
    started: dict[int, float] = {}
    assert _acknowledged(ack, 6.0, started, 0) and started == {}  # a guessed seq
    assert _acknowledged((ack[0], 60, 6.5), 6.0, started, 0) and started == {0: 6.5}
    assert _acknowledged((ack[0], 60, 7.0), 6.0, started, 0) and started == {0: 6.5}  # first
    assert not _acknowledged((Message("ring_done"), 60, 8.0), 6.0, started, 0)
    assert not _acknowledged(None, 6.0, started, 0)


class _Flooding:
    """A member's link that answers every wait with another ``ring_started`` for 3 s."""

    name = "flood"

    def __init__(self) -> None:
        self.until = time.perf_counter() + 3.0

    def reply(self, client, seq, wait_s):
        if time.perf_counter() > self.until:
            return None
        return Message("ring_started", {"client": client, "seq": seq}), 60, time.perf_counter()

    def send(self, message) -> int:
        return 0


class _Answering(_Flooding):
    """A member's link whose reply (``ring_failed``) comes without any ``ring_started``."""

    def reply(self, client, seq, wait_s):
        return Message("ring_failed", {"client": client, "seq": seq}), 60, self.until


def test_a_member_flooding_acknowledgements_still_times_out():
    """Its deadline ((1 step + 3) × ``timeout_s`` 0.05 s) holds while acknowledgements keep
    coming; a member that sends none counts as starting when it answered."""
    rnd = D2DRound(None, "t", 0, 0.05, {0: Meter(), 1: Meter()}, {})
    t0 = time.perf_counter()
    sent = {0: (7, 100, t0, 0), 1: (8, 100, t0, 0)}
    links = {0: _Flooding(), 1: _Answering()}
    started: dict[int, float] = {}
    replies, faults, _ = _collect(rnd, links, sent, 1, started)
    assert time.perf_counter() - t0 < 2.0  # not when the flood stops
    stalled = "no reply within 0.05 s of the abort (stalled after acknowledging its command)"
    assert replies == {} and faults == {0: stalled}  # it acknowledged: benched for the run
    assert sorted(started) == [0, 1] and started[1] == links[1].until


class _SlowToStart(DeviceAgent):
    """Sleeps before it handles the ring command (inside ``timeout_s``)."""

    def handle(self, msg):
        if msg.type == "ring":
            time.sleep(1.5)
        return super().handle(msg)


@pytest.mark.parametrize("slow", [True, False])
def test_a_member_slow_to_start_the_ring_is_named_and_benched(tmp_path, slow):
    """Client 0 starts every ring 1.5 s late: round 1 completes with its work (no drop) and
    names it; round 2's ring is formed without it; in round 3 it is late again. An honest
    ring names no one and keeps every member."""
    names = [f"d{i}" for i in range(4)]
    bed = Testbed.create(tmp_path / "bed", names)
    agent = _SlowToStart if slow else None
    threads = [bed.device(n, [i], agent if i == 0 else None) for i, n in enumerate(names)]
    net = bed.server_overrides(min_devices=4, timeout_s=3.0)
    result = splitfl.run(config_for("ringsfl", rounds=3, **net), run_dir=tmp_path / "run")
    for t in threads:
        t.join(30)
    rows = result.metrics
    assert [r["dropped_clients"] for r in rows] == [[], [], []]
    if not slow:
        assert [r["clients"] for r in rows] == [[0, 1, 2, 3]] * 3
        assert [r["executor_events"] for r in rows] == [[], [], []]
        assert result.summary["status"] == "ok"
        return
    assert [r["clients"] for r in rows] == [[0, 1, 2, 3], [1, 2, 3], [0, 1, 2, 3]]
    for r in (rows[0], rows[2]):
        (event,) = r["executor_events"]
        assert event.startswith("ring member 0 late to start: started the ring 1.")
    assert rows[1]["executor_events"] == []
    assert result.summary["status"] == (
        "ok (ring members 0 late to start in 2 of 3 rounds (benched; executor_events in "
        "metrics.jsonl))"
    )
    assert summary.LATE == lateness.LATE_START


class _LateThenWaiting(_DiesInRing):
    """Client 1 starts its second ring 1.4 s late (its hops then wait for the server's abort,
    :func:`_cooperative`)."""

    def handle(self, msg):
        if msg.type == "ring" and msg.fields.get("client") == 1 and _DiesInRing.rounds == 1:
            time.sleep(1.4)
        return super().handle(msg)


def _cooperative(member):
    member.abort.wait(10.0)
    raise ring_device.RingBroken("aborted by the server")


def test_a_late_starter_is_named_when_the_round_deadline_aborts_the_ring(tmp_path, monkeypatch):
    """Round 2: client 1 starts 1.4 s late, before the round deadline (at least 2 s), and its
    ring is still running then; every member answers the abort at once, so the abort names no
    one: the late start does, and round 3 forms the ring without client 1."""
    _breaking(monkeypatch, _cooperative)
    bed = Testbed.create(tmp_path / "bed", list(RING_DEVICES))
    agents = {"d1": _LateThenWaiting}
    threads = [bed.device(n, c, agents.get(n, _DiesInRing)) for n, c in RING_DEVICES.items()]
    net = bed.server_overrides(min_devices=3, timeout_s=5.0, rejoin_s=0.3)
    deadline = {"network.round_deadline_factor": 2.0, "network.round_deadline_min_s": 2.0}
    cfg = config_for("ringsfl", rounds=3, **{**net, "train.local_steps": 3, **deadline})
    result = splitfl.run(cfg, run_dir=tmp_path / "net")
    for t in threads:
        t.join(30)
    rows = result.metrics
    assert rows[0]["dropped_clients"] == []
    _assert_named(rows[1], 1, "ring round abandoned: late to start: started the ring 1.")
    assert rows[2]["clients"] == [0, 2, 3] and rows[2]["dropped_clients"] == []

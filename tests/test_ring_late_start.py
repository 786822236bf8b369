"""A RingSFL member slow to start the ring (issue 35, item 6's ring staller): a member that
answers the ring command late from the first round sets the measured ring round itself, so
the round deadline grows with it; its start acknowledgement (``ring_started``, timed on the
server's clock) names it. The round's work is kept, the member is benched for the next
rounds (``network.late_bench_rounds``, doubling). Loopback gRPC, devices in threads."""

from __future__ import annotations

import time

import pytest

import splitfl
from splitfl.metrics import summary
from splitfl.net import lateness
from splitfl.net.device import DeviceAgent
from splitfl.net.ring_server import RingEmulation, late_starts, start_latency
from splitfl.net.testbed import Testbed
from splitfl.testing import config_for


def test_late_starts_by_hand():
    """Latencies 0.01, 0.02, 0.03, 1.5: median 0.025; the limit max(10 × 0.025, 0.025 + 1)
    = 1.025 names 1.5 only; factor 0 checks nothing; with fewer than 3 members no median is
    trusted; with factor 100 the limit is 2.5."""
    latency = {0: 1.5, 1: 0.01, 2: 0.02, 3: 0.03}
    out = late_starts(latency, 10.0)
    assert list(out) == [0]
    assert out[0] == (
        "late to start: started the ring 1.5 s after its command, the ring's median 0.025 s "
        "(above network.round_deadline_factor 10 x it and 1 s over it)"
    )
    assert late_starts(latency, 0.0) == {}
    assert late_starts({0: 1.5, 1: 0.01}, 10.0) == {}
    assert late_starts(latency, 100.0) == {}


def test_start_latency_takes_the_acknowledgement_less_the_emulated_download():
    """Sent at 10.0 with 4000 wire bytes: member 0 acknowledged at 10.5 on a 1000 B/s
    emulated downlink (4 s held: it could not start earlier), member 1 sent no
    acknowledgement (its final reply at 12.0 counts), member 2 acknowledged at 10.1."""
    sent = {0: (7, 4000, 10.0, 0), 1: (8, 4000, 10.0, 0), 2: (9, 4000, 10.0, 0)}
    replies = {0: (None, 0, 13.0), 1: (None, 0, 12.0), 2: (None, 0, 13.0)}
    started = {0: 10.5, 2: 10.1}
    assert start_latency(sent, started, replies, None) == pytest.approx({0: 0.5, 1: 2.0, 2: 0.1})
    fast = {"downlink": 1e18}
    emulation = RingEmulation({0: {"downlink": 1000.0}, 1: fast, 2: fast}, [])
    got = start_latency(sent, {0: 14.5, 2: 10.1}, replies, emulation)
    assert got == pytest.approx({0: 0.5, 1: 2.0, 2: 0.1})


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

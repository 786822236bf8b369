"""Issue 51 item 3: honest devices are not late because the server was.

A server that stood still (a stalled process, or its own work past the round deadline) found
its devices' replies waiting, unread, and dropped their clients as late ("still working at
the round deadline"), then benched them ("late in 1 round(s) in a row")."""

from __future__ import annotations

import threading
import time

from test_hostile import _strict_rows

import splitfl
from splitfl.net.server.remote_fleet import LATE, Meter, RemoteFleet
from splitfl.net.server.stalls import TICK_S, StallClock
from splitfl.net.server.testbed import Testbed
from splitfl.net.transport.inbox import Inbox
from splitfl.net.transport.link import DeviceLink, judges_silence, keep_alive
from splitfl.net.transport.wire import Message
from splitfl.testing import config_for


def test_a_stall_clock_counts_the_gaps_of_a_frozen_process_by_hand():
    now = [100.0]
    clock = StallClock(clock=lambda: now[0], gap_s=0.5)
    for step in (0.05, 0.05, 40.0, 0.05, 0.3, 0.05):  # a 40 s freeze; 0.3 s is jitter
        now[0] += step
        clock.beat()
    assert clock.stalls == [(100.1 + TICK_S, 140.1)]
    assert abs(clock.since(0.0) - (40.0 - TICK_S)) < 1e-9
    assert abs(clock.since(120.0) - 20.1) < 1e-9 and clock.since(141.0) == 0.0


def test_a_freeze_counts_before_the_heartbeat_has_beaten_again():
    """A real ``SIGSTOP``: the thread whose wait timed out in the freeze may ask before the
    heartbeat thread has run (benchmarks/bench_server_freeze.py: the old clock said 0 s, and
    3 of 4 honest clients were dropped, "no reply within 2 s", after a 5 s freeze)."""
    now = [100.0]
    clock = StallClock(clock=lambda: now[0], gap_s=0.5)
    now[0] += 0.05
    clock.beat()
    now[0] += 5.0  # frozen; no beat since
    assert abs(clock.since(99.0) - (5.0 - TICK_S)) < 1e-9
    now[0] += 0.05
    clock.beat()  # the heartbeat's own beat after it does not count the stall twice
    assert abs(clock.since(99.0) - (5.0 - TICK_S)) < 1e-9


def test_a_keepalive_tick_that_woke_late_closes_no_link():
    """A 40 s freeze: the hub's heartbeat wakes 40 s late, before the read threads have read
    what the devices sent meanwhile; it pings and judges at its next tick."""
    assert judges_silence(100.0, 110.2, 10.0) and not judges_silence(100.0, 140.0, 10.0)
    link = DeviceLink("d", [0], inbox={0: Inbox()})
    link.ready, link.heard = True, time.monotonic() - 40.0
    keep_alive(link, 10.0, judge=False)
    assert link.alive and not link.outbox.empty()  # pinged
    keep_alive(link, 10.0)
    assert not link.alive and link.reason.startswith("silent for 40 s")


def _fleet(deadline: float, stalls=None, began=None) -> RemoteFleet:
    fleet = RemoteFleet.__new__(RemoteFleet)  # only what _await reads
    fleet.timeout_s, fleet.round_deadline, fleet.stalls, fleet.began = 60.0, deadline, stalls, began
    fleet.dropped, fleet.lost, fleet.meters = set(), {}, {0: Meter()}
    return fleet


def test_a_reply_waiting_in_the_inbox_counts_after_the_deadline():
    """The server comes to read after the round deadline (its own work took that long): the
    reply that waited for it is the client's, not a late one."""
    link = DeviceLink("d", [0], inbox={0: Inbox()})
    link.inbox[0].offer(Message("finished", {"seq": 7}), 10)
    fleet = _fleet(time.monotonic() - 1.0)  # the deadline passed a second ago
    got = fleet._await(link, 0, 7, time.monotonic() + 60.0)
    assert got is not None and got[0].fields["seq"] == 7 and fleet.lost == {}


class _Frozen:
    """A stall clock that saw the server stand still ``stall`` s once a wait began."""

    def __init__(self, stall: float):
        self.stall, self.asked = stall, 0

    def since(self, moment: float) -> float:
        self.asked += 1
        return 0.0 if self.asked == 1 else self.stall


def test_the_round_deadline_moves_by_the_servers_own_stall():
    """The server froze while it waited: the reply, unread until it woke, arrives after the
    wall-clock deadline but within the deadline on the server's own clock."""
    link = DeviceLink("d", [0], inbox={0: Inbox()})
    began = time.monotonic()
    fleet = _fleet(began + 0.2, _Frozen(0.6), began)

    def reply_later():
        time.sleep(0.5)  # past the 0.2 s deadline, inside 0.2 + 0.6
        link.inbox[0].offer(Message("finished", {"seq": 3}), 10)

    sender = threading.Thread(target=reply_later)
    sender.start()
    got = fleet._await(link, 0, 3, began + 60.0)
    sender.join(5)
    assert got is not None and fleet.lost == {}
    unfrozen = _fleet(time.monotonic() + 0.1, _Frozen(0.0), time.monotonic())
    assert unfrozen._await(link, 0, 4, time.monotonic() + 60.0) is None
    assert unfrozen.lost[0].startswith(LATE)  # no stall: late as before


def test_honest_clients_are_not_benched_when_the_server_sleeps_past_the_deadline(
    tmp_path, monkeypatch
):
    """The smallest reproducer: the server's round loop sleeps 6 s (past its 3-4 s round
    deadline; a 1 s floor let an honest client's own work under a loaded suite run past it)
    before it reads its clients' replies in round 2. Before the fix every
    client it read after the sleep was dropped as late, then benched in round 3."""
    slept, original = [], RemoteFleet._await

    def sleepy(self, link, c, seq, deadline):
        if self.round_deadline is not None and not slept:
            slept.append(c)
            time.sleep(3.0)
        return original(self, link, c, seq, deadline)

    monkeypatch.setattr(RemoteFleet, "_await", sleepy)
    bed = Testbed.create(tmp_path / "bed", ["a", "b"])
    threads = [bed.device("a", [0, 1]), bed.device("b", [2, 3])]
    deadline = {"round_deadline_factor": 2.0, "round_deadline_min_s": 3.0}
    net = bed.server_overrides(min_devices=2, **deadline)
    small = {"rounds": 3, "data.num_clients": 4, "train.clients_per_round": 4}
    cfg = config_for("fedavg", **small, **net)
    result = splitfl.run(cfg, run_dir=tmp_path / "n")
    for t in threads:
        t.join(30)
    rows = _strict_rows(result.run_dir)
    assert slept and [row["dropped_clients"] for row in rows] == [[], [], []]
    assert result.summary["status"] == "ok"

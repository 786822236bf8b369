"""A ParallelSFL top worker that sleeps before its report (issue 51 item 6: rounds of 20-50 s
against 1-2 s honest): its cluster is ended at the deadline of the round's other clusters, or
of the run's earlier rounds for a lone cluster (``network.cluster_deadline_factor``,
:mod:`splitfl.net.server.cluster_deadline`). Loopback gRPC, devices in threads."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from test_hostile_insiders import THREE_CLUSTERS
from test_networked_d2d import _rows

import splitfl
from splitfl.experiment.runner import as_config
from splitfl.net.device.agent import DeviceAgent
from splitfl.net.server.cluster_deadline import ClusterClock
from splitfl.net.server.executor import NetworkedExecutor
from splitfl.net.server.testbed import Testbed
from splitfl.testing import config_for

#: How long the sleepy top worker sleeps before its report (inside the old wait,
#: ``timeout_s`` 10 × (steps + 3)).
SLEEP_S = 25.0


class _SleepyTop(DeviceAgent):
    """As a top worker, trains its cluster, then sleeps ``SLEEP_S`` before reporting, or
    until ``woken`` is set: the test wakes it once the run has returned, so the rest of the
    sleep (past the cut, which the run no longer waits on) is not waited out a second time."""

    woken = threading.Event()

    def handle(self, msg):
        reply = super().handle(msg)
        if msg.type == "host":
            _SleepyTop.woken.wait(SLEEP_S)
        return reply


def test_a_sleeping_top_worker_is_cut_at_the_other_clusters_deadline(tmp_path):
    """Client 11 (this seed: a top worker in round 1) sleeps 25 s before its report: its
    cluster is ended once the other two reported and 3 × their median + ``timeout_s`` 10 s
    passed, naming it; round 2 does not elect it (the old code waited the 25 s and kept its
    report)."""
    devices = {"a": [0, 1, 2, 3, 4, 5], "b": [6, 7, 8, 9, 10], "sleepy": [11]}
    agents = {"a": None, "b": None, "sleepy": _SleepyTop}
    bed = Testbed.create(tmp_path / "bed", list(devices))
    threads = [bed.device(n, c, agents[n], retry_s=20.0) for n, c in devices.items()]
    net = bed.server_overrides(min_devices=3, timeout_s=10.0)
    cfg = config_for("parallelsfl", **{**net, **THREE_CLUSTERS, "rounds": 2})
    began = time.monotonic()
    _SleepyTop.woken.clear()
    try:
        result = splitfl.run(cfg, run_dir=tmp_path / "n")
        ran_s = time.monotonic() - began
    finally:
        _SleepyTop.woken.set()
    for t in threads:
        t.join(SLEEP_S + 30)
    first, second = _rows(result)
    assert 11 in first["plan_tops"], first["plan_tops"]
    dropped = first["dropped_reasons"]
    assert dropped and all(why.startswith("top worker 11: no report") for why in dropped.values())
    assert all("network.cluster_deadline_factor" in why for why in dropped.values())
    assert 11 not in second["plan_tops"]
    assert ran_s < 120  # bounded (not a timing measurement)


def test_the_cluster_clock_by_hand():
    """Three clusters: no deadline until one other (half of 2, rounded up) reported; then
    ``began`` + max(3 × the median report time, min_s) (+ ``slack_s``)."""
    others = "the other clusters'"
    clock = ClusterClock(3, 3.0, 2.0, began=100.0)
    assert clock.cut_at() is None
    clock.reports.append(1.5)
    assert clock.cut_at() == (104.5, 1.5, others)
    clock.reports.append(0.5)  # lower median of (0.5, 1.5): 0.5 → the 2 s floor
    assert clock.cut_at() == (102.0, 0.5, others)
    with_slack = ClusterClock(3, 3.0, 2.0, 10.0, began=100.0, reports=[1.5])
    assert with_slack.cut_at() == (114.5, 1.5, others)
    assert ClusterClock(3, 0.0, 2.0).cut_at() is None  # off
    # earlier rounds' reports do not judge a round with other clusters to compare with
    assert ClusterClock(3, 3.0, 2.0, began=100.0, earlier=[1.0]).cut_at() is None


def test_a_lone_cluster_is_judged_by_the_earlier_rounds_by_hand():
    """One hosted cluster: no deadline before any report of the run was accepted; then the
    same rule over the earlier reports' lower median (the old clock had none: it waited
    ``timeout_s`` × (steps + 3)); an accepted report joins the run's list."""
    earlier: list[float] = []
    assert ClusterClock(1, 3.0, 2.0, began=100.0, earlier=earlier).cut_at() is None
    earlier += [1.2, 4.0, 0.9]  # lower median 1.2
    lone = ClusterClock(1, 3.0, 2.0, 5.0, began=100.0, earlier=earlier)
    assert lone.cut_at() == pytest.approx((108.6, 1.2, "the earlier rounds' clusters'"))
    lone.reported()
    assert len(earlier) == 4 and lone.reports == [earlier[-1]]


#: The lone cluster's top worker of round 2 sleeps this long (under the old wait, ``timeout_s``
#: 10 × (steps + 3)), or until the test wakes it after the run.
LONE_SLEEP_S = 35.0


class _SleepsAtTheSecondHosting(DeviceAgent):
    """Every device runs this: the second ``host`` command of the run (round 2's top worker,
    whoever it is) trains its cluster, then sleeps ``LONE_SLEEP_S`` (or until ``woken``)."""

    woken = threading.Event()
    hostings = 0
    lock = threading.Lock()

    def handle(self, msg):
        reply = super().handle(msg)
        if msg.type == "host":
            with _SleepsAtTheSecondHosting.lock:
                _SleepsAtTheSecondHosting.hostings += 1
                second = _SleepsAtTheSecondHosting.hostings == 2
            if second:
                _SleepsAtTheSecondHosting.woken.wait(LONE_SLEEP_S)
        return reply


def test_a_lone_cluster_s_sleeping_top_worker_is_cut_at_the_earlier_rounds_deadline(tmp_path):
    """Four clients, ``options.parallelsfl.k: 1``: one hosted cluster (top worker 0 in both
    rounds), no other to compare with. Round 1 is
    honest; round 2's top worker sleeps 35 s before its report: it is given up on at 3 × round
    1's report time + ``timeout_s`` 10 s, naming it (the old clock waited out the sleep and
    kept its report: nothing dropped)."""
    devices = {"a": [0], "b": [1], "c": [2], "d": [3]}  # four clients: one cluster, top 0
    bed = Testbed.create(tmp_path / "bed", list(devices))
    agent = _SleepsAtTheSecondHosting
    agent.hostings = 0
    agent.woken.clear()
    threads = [bed.device(n, c, agent, retry_s=20.0) for n, c in devices.items()]
    net = bed.server_overrides(min_devices=4, timeout_s=10.0)
    sized = {"data.num_clients": 4, "train.clients_per_round": 4, "options.parallelsfl.k": 1}
    cfg = config_for("parallelsfl", **{**net, **sized, "rounds": 2})
    try:
        result = splitfl.run(cfg, run_dir=tmp_path / "n")
    finally:
        agent.woken.set()
    for t in threads:
        t.join(LONE_SLEEP_S + 30)
    first, second = _rows(result)
    assert len(first["plan_tops"]) == len(second["plan_tops"]) == 1
    assert first["dropped_reasons"] == {}
    top = second["plan_tops"][0]
    dropped = second["dropped_reasons"]
    assert dropped, "round 2's sleeping top worker was waited out"
    for why in dropped.values():
        assert why.startswith(f"top worker {top}: no report"), why
        assert "the earlier rounds' clusters' median" in why, why


def test_a_resumed_server_judges_a_lone_cluster_by_the_rounds_before_its_restart(tmp_path):
    """The run's accepted cluster report times outlive the server process (checkpointed,
    ``NetworkedExecutor.state_dict``): round 1 runs in one server, round 2 in a resumed one
    (``splitfl.resume``, rounds 2), whose lone cluster's top worker sleeps 35 s. It is cut at
    3 × round 1's report time + ``timeout_s`` (before, a resumed server started with no
    earlier report and waited ``timeout_s`` × (steps + 3): nothing dropped)."""
    devices = {"a": [0], "b": [1], "c": [2], "d": [3]}
    agent = _SleepsAtTheSecondHosting
    agent.hostings = 0
    agent.woken.clear()
    sized = {"data.num_clients": 4, "train.clients_per_round": 4, "options.parallelsfl.k": 1}
    bed = Testbed.create(tmp_path / "bed1", list(devices))
    threads = [bed.device(n, c, agent, retry_s=20.0) for n, c in devices.items()]
    net = bed.server_overrides(min_devices=4, timeout_s=10.0)
    cfg = config_for("parallelsfl", **{**net, **sized, "rounds": 1})
    first = splitfl.run(cfg, run_dir=tmp_path / "n")
    for t in threads:
        t.join(30)
    kept = torch.load(tmp_path / "n" / "checkpoints" / "last.pt", weights_only=True)
    assert len(kept["executor"]["cluster_reports"]) == 1
    bed = Testbed.create(tmp_path / "bed2", list(devices))
    threads = [bed.device(n, c, agent, retry_s=20.0) for n, c in devices.items()]
    flags = [f"network.listen=127.0.0.1:{bed.port}", f"network.tokens={bed.tokens_file}"]
    try:
        resumed = splitfl.resume(first.run_dir, overrides=[*flags, "rounds=2"])
    finally:
        agent.woken.set()
    for t in threads:
        t.join(LONE_SLEEP_S + 30)
    _, second = _rows(resumed)
    dropped = second["dropped_reasons"]
    assert dropped, "the resumed server waited out round 2's sleeping top worker"
    for why in dropped.values():
        assert "the earlier rounds' clusters' median" in why, why


def test_the_networked_executor_s_judging_state_round_trips_and_refuses_damage():
    """``state_dict``/``load_state_dict`` by hand: deadlines' times, cluster reports, benched
    clients and the next round survive; a negative or non-finite time is refused."""
    cfg = as_config(config_for("parallelsfl"))
    old = NetworkedExecutor(cfg)
    old._client_s = {0: 1.5, 3: 0.25}
    old._cluster_reports += [0.9, 1.1]
    old._late.sit_out.fail(2, round_idx=4)
    old._next_round = 5
    state = old.state_dict()
    new = NetworkedExecutor(cfg)
    reports = new._cluster_reports  # the list the round's ClusterClock appends to
    new.load_state_dict(state)
    assert new._client_s == {0: 1.5, 3: 0.25} and reports == [0.9, 1.1]
    assert new._cluster_reports is reports
    assert new._late.sit_out.out(2, 5) and new._next_round == 5
    assert new.state_dict() == state
    for bad in ({"client_s": {"0": -1.0}}, {"cluster_reports": [float("nan")]}):
        with pytest.raises(ValueError, match="finite"):
            NetworkedExecutor(cfg).load_state_dict(bad)

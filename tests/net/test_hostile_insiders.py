"""Insiders inside the absolute bounds (issue 35, items 2-5): smashed data scaled ×50
or ×90 passes ``network.bounds``' peak check and an update boosted ×50 its norm check (widened
here); the checks relative to the honest activations' RMS and to the round's other clients
drop them, with the reason recorded; a ParallelSFL top worker's sign-flipped top part is
dropped against the round's other top workers; an inflated announced sample count is capped
against the other clients'; maximal loss reports do not stop the run. Loopback gRPC, devices
in threads of this process."""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace

import numpy as np
import pytest
from test_hostile import _run, _strict_rows
from test_networked_d2d import _rows
from test_own_data import _partition, _write_devices

import splitfl
from splitfl.algorithms.parallelsfl.planner import failed_tops
from splitfl.config import ExperimentConfig
from splitfl.core.plan import ClientUpdate, RoundResult
from splitfl.experiment.context import Positions
from splitfl.experiment.guards import LossExplosionError, check_explosion
from splitfl.experiment.round_step import loss_fields, lower_median
from splitfl.metrics.summary import comparison_table, is_ok, run_warnings, summarize
from splitfl.net.device.agent import DeviceAgent
from splitfl.net.server.clusters import D2DRound, Hosted, reject_outlying_tops
from splitfl.net.server.lateness import LateClients
from splitfl.net.server.remote_fleet import LATE
from splitfl.net.server.testbed import Testbed
from splitfl.net.transport.announce import capped_counts, scaled_histogram
from splitfl.net.trust.checks import PeerHistory, PeerScale, peer_outliers
from splitfl.testing import config_for


class _Scaled(DeviceAgent):
    """Sends its honest smashed data times ``factor`` (the peak stays inside 100×)."""

    factor = 50.0

    def _on_forward(self, c, msg):
        reply = super()._on_forward(c, msg)
        reply.tensors["fx"] = reply.tensors["fx"] * _Scaled.factor
        return reply


@pytest.mark.parametrize("factor", [10.0, 50.0])
def test_scaled_smashed_data_is_dropped_next_to_its_peers(tmp_path, factor):
    """×10 and ×50 stay inside the peak bound (100 × the model's); the peer RMS check (8 × the
    median of other clients' batches at the same step) drops them from the second round on
    (in the first, a batch that arrives before two other clients' at its step is held to the
    model-relative bounds only)."""
    _Scaled.factor = factor
    result = _run(tmp_path, "splitfed_v1", _Scaled, rounds=3)
    rows = _strict_rows(result.run_dir)
    assert len(rows) == 3
    for row in rows[1:]:  # from the second round every step has peers to compare with
        assert row["dropped_clients"] == [0]
        assert "activation RMS" in row["dropped_reasons"]["0"]
    assert all(math.isfinite(row["test_loss"]) for row in rows)
    assert is_ok(result.summary["status"]) and "client updates dropped" in result.summary["status"]


class _Boosted(DeviceAgent):
    """Sends the part it was given plus ``factor`` (50) × its honest update."""

    factor = 50.0

    def _on_begin(self, c, msg):
        self.given = {k: t.clone() for k, t in msg.tensors.items() if k.startswith("part/")}
        return super()._on_begin(c, msg)

    def _on_finish(self, c, msg):
        reply = super()._on_finish(c, msg)
        for name, t in reply.tensors.items():
            if t.is_floating_point() and name in self.given:
                moved = type(self).factor * (t - self.given[name])
                reply.tensors[name] = self.given[name] + moved
        return reply


def test_a_boosted_update_is_dropped_against_the_rounds_median(tmp_path):
    # the absolute bound widened, so that only the peer check can catch it (on this tiny
    # model an honest round moves the part by half its norm: 10 × ‖part‖ is a narrow window)
    wide = {"network.bounds.update_norm_factor": 1000.0}
    result = _run(tmp_path, "splitfed_v1", _Boosted, **wide)
    rows = _strict_rows(result.run_dir)
    assert len(rows) == 2
    for row in rows:
        assert row["dropped_clients"] == [0]
        reason = row["dropped_reasons"]["0"]
        assert "the round's median" in reason and "peer_update_factor 10" in reason
    assert is_ok(result.summary["status"]) and "client updates dropped" in result.summary["status"]


def test_peer_outliers_by_hand():
    # median of (1, 2, 3, 16) is 2.5: 16 > 5 × 2.5 = 12.5 is dropped; 12 would not be
    out = peer_outliers({0: 16.0, 1: 1.0, 2: 2.0, 3: 3.0}, 5.0)
    assert list(out) == [0] and "6.4x the round's median 2.5" in out[0]
    assert peer_outliers({0: 12.0, 1: 1.0, 2: 2.0, 3: 3.0}, 5.0) == {}
    assert peer_outliers({0: 100.0, 1: 1.0}, 5.0) == {}  # fewer than 3: no median to trust
    assert peer_outliers({0: 0.0, 1: 0.0, 2: 0.0}, 5.0) == {}  # nothing moved


def test_peer_history_stands_in_for_a_round_with_fewer_than_3_updates():
    """With one or two updates, the accepted distances of earlier rounds give the median (the
    lower one); before 3 were accepted, nothing is checked."""
    history = PeerHistory(10.0)
    assert history.outliers({1: 5.0, 2: 100.0}) == {}  # no history yet: both accepted
    assert history.outliers({1: 1.0, 2: 1.2, 3: 0.9}) == {}  # the round's median 1.0
    # accepted: 5, 100, 1, 1.2, 0.9 -> lower median 1.2; 13 > 12 is rejected, 11 is not
    out = history.outliers({7: 13.0, 8: 11.0}, "top part")
    assert list(out) == [7] and "rejected top part: norm 13 is 10.8x" in out[7]
    assert "the earlier rounds' median 1.2" in out[7]
    assert 13.0 not in history.accepted and history.accepted[-1] == 11.0


def test_a_lone_top_worker_is_held_to_the_earlier_rounds_top_parts():
    """A ParallelSFL round with one cluster has no other top worker to compare with: its top
    part is held to the earlier rounds' (a rogue top worker alone in a round, issue 35)."""
    history = {what: PeerHistory(10.0) for what in ("top part", "bottom average")}
    for _ in range(3):  # three honest rounds of one cluster each
        rnd = D2DRound(None, "t", 0, 1.0, {}, {}, hosted={0: Hosted(2, (2, 3), 1.0, 1.0)})
        assert reject_outlying_tops(rnd, [], {0: {}}, history) == []
    rnd = D2DRound(None, "t", 0, 1.0, {}, {}, hosted={0: Hosted(4, (4, 5), 30.0, 1.0)})
    updates = [ClientUpdate(c, 1, 0, 10, 1, {}, 1.0) for c in (4, 5)]
    states = {0: {"w": None}}
    assert reject_outlying_tops(rnd, updates, states, history) == [] and states == {}
    assert rnd.lost[4].startswith("top worker 4: rejected top part: norm 30 is 30.0x")
    assert rnd.lost[5] == rnd.lost[4]


def test_peer_rms_by_hand():
    peers = PeerScale(8.0, 0.1)
    assert peers.problem(("c", 0), 0, 1, 1.0) is None  # no peers at step 0 yet: accepted
    assert peers.problem(("c", 0), 0, 2, 3.0) is None  # one other client: still accepted
    # two other clients at step 0 (median of 1.0, 3.0 = 2.0): the limit is 8 × 2 + 0.1
    assert peers.problem(("c", 0), 0, 3, 16.1) is None
    # the window now holds 1.0, 3.0, 16.1 (median 3): client 4's limit is 8 × 3 + 0.1
    assert "activation RMS 40 above 24.1" in peers.problem(("c", 0), 0, 4, 40.0)
    assert peers.problem(("c", 0), 1, 4, 40.0) is None  # step 1 has no peers: its own scale
    assert peers.problem(("c", 1), 0, 4, 40.0) is None  # another tensor: its own scale


# -- item 4: announced sample counts ------------------------------------------------------------
class _Inflating(DeviceAgent):
    """Announces 100,000 samples for its first client (histogram scaled to match)."""

    def announcement(self, spec, epsilon, seed):
        data = super().announcement(spec, epsilon, seed)
        first = data["clients"][0]
        first["histogram"] = scaled_histogram(first["histogram"], 100_000)
        first["samples"] = 100_000
        return data


def test_an_inflated_sample_count_is_capped_at_the_median_and_recorded(tmp_path, recwarn):
    written = _write_devices(tmp_path / "data", "fedavg", 2, rounds=1)
    folders = {name: tmp_path / "data" / name for name in written}
    bed = Testbed.create(tmp_path / "bed", list(folders))
    threads = [
        bed.device(name, [], _Inflating if name == "local-0" else None, data=str(path))
        for name, path in folders.items()
    ]
    net = bed.server_overrides(min_devices=2)
    cfg = config_for("fedavg", rounds=1, **{"data.source": "devices"}, **net)
    result = splitfl.run(cfg, run_dir=tmp_path / "net")
    for t in threads:
        t.join(30)
    _, parts = _partition("fedavg", rounds=1)
    sizes = sorted(len(p) for p in parts)
    n = len(sizes)
    cap = int(10 * (sizes[(n - 1) // 2] + sizes[n // 2]) / 2)  # the honest sizes' median
    liar = written["local-0"][0]
    record = json.loads((result.run_dir / "devices.json").read_text())
    entry = next(c for d in record["devices"] for c in d["clients"] if c["client"] == liar)
    assert entry["samples"] == 100_000 and f"weight capped at {cap}" in entry["capped"]
    clients = json.loads((result.run_dir / "clients.json").read_text())["clients"]
    assert clients[liar]["samples"] == cap == sum(clients[liar]["label_histogram"])
    others = [c for c in clients if c["client"] != liar]
    assert [c["samples"] for c in others] == [len(parts[c["client"]]) for c in others]
    assert any("weight capped" in str(w.message) for w in recwarn)


def test_capped_counts_and_positions_by_hand():
    sizes, notes = capped_counts([186, 200, 100_000, 150], 10.0)
    assert sizes == [186, 200, 1930, 150]  # median (186 + 200) / 2 = 193
    assert list(notes) == [2] and "518x the median 193" in notes[2]
    assert capped_counts([5, 10**9], 10.0) == ([5, 10**9], {})  # two clients: no median
    assert scaled_histogram([50_000, 30_000, 20_000], 1930) == [965, 579, 386]
    assert scaled_histogram([1, 1, 1], 4) == [2, 1, 1]  # largest remainders, sum kept
    huge = Positions(10**9)  # no array of the announced size
    assert len(huge) == 10**9 and huge[np.array([3, 7])].tolist() == [3, 7]


# -- item 5: maximal loss reports -----------------------------------------------------------------
class _LoudLoss(DeviceAgent):
    """Reports 0.99 × ``loss_max`` per sample for each local step (inside the bound)."""

    def _on_local_step(self, c, msg):
        reply = super()._on_local_step(c, msg)
        samples = reply.fields["samples"]
        reply.fields["loss_sum"] = 0.99 * 1e4 * samples
        return reply


def test_maximal_loss_reports_from_one_device_do_not_stop_the_run(tmp_path):
    result = _run(tmp_path, "fedavg", _LoudLoss, rounds=4)
    rows = _strict_rows(result.run_dir)
    assert result.summary["status"] == "ok" and len(rows) == 4  # nothing was dropped
    # issue 51: the reported loss is the lower median (the old code's mean read 1e4 / n
    # clients); the mean is kept as train_loss_mean and the liar is named
    assert all(r["train_loss"] < 10 and r["train_loss"] == r["train_loss_median"] for r in rows)
    assert all(r["train_loss_mean"] > 1000 for r in rows)  # the mean follows the liar
    assert all(r["train_loss_outliers"] == [0] for r in rows)


def test_the_reported_loss_by_hand():
    """Untrusted (the networked default): the lower median of the clients' mean losses
    (0.2, 0.3, 9000 → 0.3), the weighted mean kept aside, 9000 > 10 × 0.3 named; trusted
    and simulated runs: the weighted mean, as before."""
    updates = [
        ClientUpdate(c, 1, 0, 10, 1, {}, loss * 10) for c, loss in enumerate((0.2, 0.3, 9e3))
    ]
    result = RoundResult(updates=updates, server_states={})
    losses = {0: 0.2, 1: 0.3, 2: 9e3}
    cfg = ExperimentConfig(executor="networked")
    fields = loss_fields(cfg, result, losses)
    assert fields == {
        "train_loss": 0.3,
        "train_loss_median": 0.3,
        "train_loss_mean": pytest.approx(9000.5 / 3),
        "train_loss_outliers": [2],
    }
    trusted = replace(cfg, network=replace(cfg.network, trust="trusted"))
    for plain in (trusted, ExperimentConfig()):
        mean = {"train_loss": pytest.approx(9000.5 / 3), "train_loss_median": 0.3}
        assert loss_fields(plain, result, losses) == mean


def test_the_explosion_check_reads_the_clients_lower_median():
    train = type("T", (), {"explode_factor": 100, "explode_rounds": 2, "explode_recovery": 10})
    loud = [{"train_loss": 5e3, "train_loss_median": 1.0}] * 3
    check_explosion(loud, 2.0, train)  # the median stays at 1 < 200
    blown = [{"train_loss": 5e3, "train_loss_median": 5e3}] * 2
    with pytest.raises(LossExplosionError):
        check_explosion(blown, 2.0, train)
    assert lower_median([1.0, 9e3]) == 1.0 and lower_median([3.0, 1.0, 2.0]) == 2.0
    assert lower_median([]) is None


def test_a_run_left_at_chance_while_updates_were_dropped_is_degraded_by_hand():
    """Ten classes (chance 10 %), ``eval.chance_margin`` 0.05: the bound is 10 + 0.05 × 90 =
    14.5 %. A run at 9.2 % from round 1 in which the server rejected updates never reached
    ``collapse_from`` (the collapse rule says nothing) and is ``degraded``; the same
    accuracies with nothing rejected (a hard task, one round) or only absent devices, or
    a final 14.6 %, or no chance known (not a classifier) stay ``ok``."""
    drop = {"0": "rejected model update: cosine -0.6 with the server's own step"}
    rows = [
        {"round": r, "test_acc": 0.092, "dropped_reasons": drop, "avg_waiting": 0.0} for r in (1, 2)
    ]
    rows = [{**r, "sim_time": 1.0} for r in rows]
    warning = (
        "test accuracy at chance: 9.2% after 2 rounds, at most 14.5% (chance 10.0% + "
        "eval.chance_margin 0.05) while client updates were dropped"
    )
    assert run_warnings(rows, chance=0.1)[0] == warning
    summary = summarize(rows, None, "ok", 2, chance=(0.1, 0.05))
    assert summary["status"].startswith(f"degraded ({warning}; 2 client updates dropped")
    assert is_ok(summary["status"])
    assert summarize(rows, None, "ok", 2)["status"].startswith("ok (2 client updates")
    honest = [{**r, "dropped_reasons": {}} for r in rows]
    assert summarize(honest, None, "ok", 2, chance=(0.1, 0.05))["status"] == "ok"
    absent = [{**r, "dropped_reasons": {"0": "device not connected"}} for r in rows]
    assert not summarize(absent, None, "ok", 2, chance=(0.1, 0.05))["status"].startswith("deg")
    above = [*rows[:1], {**rows[1], "test_acc": 0.146}]
    assert summarize(above, None, "ok", 2, chance=(0.1, 0.05))["status"].startswith("ok (")
    assert run_warnings(rows, chance=0.1, margin=0.0)[0].startswith("test accuracy at chance")


def test_a_collapsed_run_says_so_by_hand():
    rows = [
        {"round": 1, "test_acc": 0.5, "dropped_clients": []},
        {"round": 2, "test_acc": 0.92, "dropped_clients": []},
        {"round": 3, "test_acc": 0.106, "dropped_clients": []},
    ]
    assert run_warnings(rows) == ["test accuracy collapsed: 10.6% at the end, 92.0% at round 2"]
    rows[2]["test_acc"] = 0.47  # above half of the best: a dip, not a collapse
    assert run_warnings(rows) == []
    low = [{"round": 1, "test_acc": 0.2}, {"round": 2, "test_acc": 0.05}]  # never trained
    assert run_warnings(low) == []
    full = [{**r, "avg_waiting": 0.0, "sim_time": 1.0} for r in rows]
    summary = summarize([*full[:2], {**full[2], "test_acc": 0.1}], None)
    collapsed = "test accuracy collapsed: 10.0% at the end, 92.0% at round 2"
    # never "ok" (issue 51: wrecked runs said "ok (...)"), still a finished run
    assert summary["warnings"] == [collapsed] and summary["status"] == f"degraded ({collapsed})"
    assert f"| degraded ({collapsed}) |" in comparison_table({"fedavg": summary})
    assert is_ok(summary["status"])


# -- item 6: a slow drip ------------------------------------------------------------------------
class _SlowDrip(DeviceAgent):
    """From its second round, answers every command after 0.8 s (inside ``timeout_s``)."""

    begun = 0

    def _on_begin(self, c, msg):
        _SlowDrip.begun += 1
        return super()._on_begin(c, msg)

    def handle(self, msg):
        if _SlowDrip.begun >= 2:
            time.sleep(0.8)
        return super().handle(msg)


def test_a_slow_drip_is_dropped_at_the_round_deadline(tmp_path):
    _SlowDrip.begun = 0
    net = {"network.timeout_s": 3.0, "network.round_deadline_min_s": 1.0}
    result = _run(tmp_path, "splitfed_v1", _SlowDrip, rounds=4, **net)
    rows = _strict_rows(result.run_dir)
    assert rows[0]["dropped_clients"] == []  # no deadline before a round has been measured
    why = [row["dropped_reasons"].get("0", "") for row in rows[1:]]
    assert [row["dropped_clients"] for row in rows[1:]] == [[0], [0], [0]]
    # late in round 2: left out of round 3 (not contacted: no deadline waited for); late
    # again in round 4 (a second late round in a row would bench it for 2)
    assert "round deadline" in why[0] and "round deadline" in why[2]
    assert why[1].startswith("benched: late in 1 round(s) in a row, contacted again from round 4")
    assert _SlowDrip.begun == 3  # rounds 1, 2 and 4: round 3 never began on the device
    assert is_ok(result.summary["status"]) and result.summary["warnings"]


def test_late_clients_are_benched_for_doubling_rounds_by_hand():
    late = LateClients(1)
    dropped = {0: f"{LATE} (network.round_deadline_factor)", 1: "no reply within 3 s", 2: "x"}
    late.record(4, [0, 1, 2, 3], dropped)  # 0 late, 1 silent, 2 dropped otherwise, 3 on time
    assert list(late.benched(5, [0, 1, 2, 3])) == [0, 1] and late.benched(6, [0, 1]) == {}
    late.record(6, [0, 1], {0: dropped[0]})  # 0 late again: its streak is 2, benched for 2
    assert list(late.benched(7, [0, 1])) == [0] and list(late.benched(8, [0])) == [0]
    assert late.benched(9, [0]) == {} and 1 not in late.streak  # 1 finished round 6
    late.record(9, [0], {})
    assert late.streak == {}
    off = LateClients(0)
    off.record(1, [0], dropped)
    assert off.benched(2, [0]) == {}


def test_failed_top_workers_by_hand():
    tops = {0: 1, 1: 4, 2: 7}
    dropped = {
        2: "top worker 1: stalled (no reply within 10 s)",  # the top worker's own failure
        5: "dropped by top worker 4: rejected model update: ...",  # a member's fault
        8: "device not connected",
    }
    assert failed_tops(tops, dropped) == {1}
    assert failed_tops(tops, {}) == set()


# -- item 3: a rogue ParallelSFL top worker --------------------------------------------------
class _RogueTop(DeviceAgent):
    """As a top worker, reports its trained top part sign-flipped (``flip``: 2 × ‖part‖ from
    the part sent, inside the 10 × bound) or moved ``scale`` × as far as it trained it."""

    scale: float | None = None

    def handle(self, msg):
        reply = super().handle(msg)
        if msg.type != "host" or reply is None or reply.fields.get("error"):
            return reply
        for name, t in reply.tensors.items():
            if name.startswith("server/") and t.is_floating_point():
                sent = msg.tensors[name]
                flipped = -t if self.scale is None else sent + self.scale * (t - sent)
                reply.tensors[name] = flipped
        return reply


#: Three clusters a round (this seed: top workers 4, 7 or 10, and 11 in rounds 1-2)
THREE_CLUSTERS = {
    "rounds": 4,
    "options.parallelsfl.k": 3,
    "options.parallelsfl.ingress_scale": 0.5,
}


def _rogue_top_run(tmp_path, scale, **changes):
    _RogueTop.scale = scale
    devices = {"a": [0, 1, 2, 3, 4, 5], "b": [6, 7, 8, 9, 10], "rogue": [11]}
    agents = {"a": None, "b": None, "rogue": _RogueTop}
    bed = Testbed.create(tmp_path / "bed", list(devices))
    threads = [bed.device(n, c, agents[n], retry_s=20.0) for n, c in devices.items()]
    net = bed.server_overrides(min_devices=3, timeout_s=10.0)
    cfg = config_for("parallelsfl", **{**net, **THREE_CLUSTERS, **changes})
    result = splitfl.run(cfg, run_dir=tmp_path / "n")
    for t in threads:
        t.join(30)
    return result


@pytest.mark.parametrize(
    ("scale", "factor"), [(None, 10.0), (10.0, 5.0)], ids=["sign-flipped", "x10"]
)
def test_a_rogue_top_worker_is_dropped_against_the_other_top_workers(tmp_path, scale, factor):
    """Client 11's device, as a top worker, reports a sign-flipped (or ×10-distance) top part
    inside the absolute bound; the server holds each top worker's top part against the
    round's other top workers' (per local step, ``peer_update_factor`` × their median, as for
    client updates) and drops the rogue's cluster naming it; it is not elected next round and
    the run trains on (issue 35, item 3). Honest top workers moved within 1.7 × their median
    here, so ×10 is caught at factor 5 (at the default 10 it sits on the threshold)."""
    changes = {"network.bounds.peer_update_factor": factor}
    rows = _rows(_rogue_top_run(tmp_path, scale, **changes))
    rejected = [r for r in rows if 11 in r["plan_tops"]]
    assert len(rejected) >= 2
    for row in rejected:
        assert 0 < len(row["dropped_clients"]) <= len(row["clients"]) // 2  # one cluster of 3
        for why in row["dropped_reasons"].values():
            assert why.startswith("top worker 11: rejected top part: norm"), why
            assert "the round's median" in why
    for before, after in zip(rows[:-1], rows[1:], strict=True):
        if 11 in before["plan_tops"]:
            assert 11 not in after["plan_tops"]  # not elected again at once
            assert after["dropped_clients"] == []
    # honest: 29.5 % after 4 rounds; the flipped top part averaged in (check disabled): 11.1 %
    assert rows[-1]["test_acc"] > 0.25

"""The spread check (``network.bounds.peer_spread_factor``, :mod:`splitfl.net.trust.spread`): an
update held against the round's coordinate-wise median move, not only by its length. Two
colluders of ten who send their parts sign-flipped in a fresh model's first round moved ~6×
the round's median (inside ``peer_update_factor`` 10) and wrecked ``mean`` and
``trimmed_mean`` (issue 35); the spread check drops them. Loopback gRPC, devices in threads."""

from __future__ import annotations

import math

import pytest
import torch

import splitfl
from splitfl.core.plan import ClientUpdate
from splitfl.net.device.agent import DeviceAgent
from splitfl.net.server.clusters import D2DRound, Hosted, reject_outlying_tops
from splitfl.net.server.testbed import Testbed
from splitfl.net.trust.checks import PeerHistory, peer_outliers
from splitfl.net.trust.spread import RoundMoves, spread_from_centre
from splitfl.testing import config_for


def _moves(parts: dict[int, list[float]], steps: dict[int, int] | None = None) -> RoundMoves:
    moves = RoundMoves()
    for c, part in parts.items():
        moves.add(
            c, {"w": torch.tensor(part)}, {"w": torch.zeros(len(part))}, (steps or {}).get(c, 1)
        )
    return moves


def test_the_spread_check_by_hand():
    """Moves (−3, 0), (1, 0), (1, 0.2), (0.8, 0): the coordinate-wise (lower) median is
    (0.8, 0); distances from it 3.8, 0.2, 0.283, 0, their median 0.241; lengths 3, 1, 1.02,
    0.8, their median 1.01. Factor 10: 3.8 > 10 × 0.241 + 1.01 = 3.42 is dropped — though
    its length, 3, is only 3× the median length (the norm check passes it). Factor 12: 3.91
    of room, kept."""
    parts = {0: [-3.0, 0.0], 1: [1.0, 0.0], 2: [1.0, 0.2], 3: [0.8, 0.0]}
    out = _moves(parts).spread_outliers(10.0)
    assert list(out) == [0]
    assert out[0] == (
        "rejected model update: 3.8 per step from the round's median move, above 3.42 "
        "(network.bounds.peer_spread_factor 10 x the median distance 0.241 + the median "
        "norm 1.01)"
    )
    assert _moves(parts).spread_outliers(12.0) == {}
    # per local step: the same part after 2 steps of twice the move is the same move
    doubled = {**parts, 0: [-6.0, 0.0]}
    assert list(_moves(doubled, {0: 2}).spread_outliers(10.0)) == [0]
    spread = spread_from_centre([{"w": torch.tensor(p)} for p in parts.values()])
    assert spread == pytest.approx([3.8, 0.2, math.hypot(0.2, 0.2), 0.0])


def test_the_spread_check_compares_like_with_like():
    """Only updates of the same tensors are compared, 3 or more of them; moves that coincide
    leave each one the median length of room; nothing moved, nothing dropped."""
    moves = _moves({0: [-3.0, 0.0], 1: [1.0, 0.0], 2: [1.0, 0.2], 3: [0.8, 0.0]})
    moves.add(7, {"v": torch.tensor([50.0])}, {"v": torch.zeros(1)}, 1)  # another cut's part
    moves.add(8, {"v": torch.tensor([-50.0])}, {"v": torch.zeros(1)}, 1)
    assert list(moves.spread_outliers(10.0)) == [0]  # 7 and 8: two alone, not compared
    same = _moves({1: [1.0, 0.0], 2: [1.0, 0.0], 3: [1.0, 0.0], 4: [1.9, 0.0], 5: [2.1, 0.0]})
    assert list(same.spread_outliers(10.0)) == [5]  # 1.1 from (1, 0) > 0 + 1
    assert _moves({1: [0.0], 2: [0.0], 3: [0.0]}).spread_outliers(10.0) == {}


def test_the_norm_history_leaves_out_what_the_spread_rejected():
    history = PeerHistory(10.0)
    assert history.outliers({1: 1.0, 2: 1.2, 3: 0.9, 4: 5.0}, rejected={4: "spread"}) == {}
    assert sorted(history.accepted) == [0.9, 1.0, 1.2]


def test_a_top_worker_whose_top_part_points_elsewhere_is_rejected():
    """ParallelSFL: the hand example's moves as four clusters' top parts (the norm check
    passes cluster 0's: 3 is 3x the median length); the spread check across top workers
    rejects its whole report, names its top worker for its members, and the norm history
    does not record it."""
    parts = {0: [-3.0, 0.0], 1: [1.0, 0.0], 2: [1.0, 0.2], 3: [0.8, 0.0]}
    rnd = D2DRound(None, "t", 0, 1.0, {}, {})
    for g, part in parts.items():
        rnd.moves["top part"].add(g, {"w": torch.tensor(part)}, {"w": torch.zeros(2)}, 1)
        rnd.moves["bottom average"].add(g, {"b": torch.ones(1)}, {"b": torch.zeros(1)}, 1)
        rnd.hosted[g] = Hosted(10 + g, (2 * g, 2 * g + 1), rnd.moves["top part"].distance[g], 1.0)
    updates = [ClientUpdate(c, 1, c // 2, 10, 1, {}, 1.0) for c in range(8)]
    states = {g: {"w": None} for g in parts}
    history = {what: PeerHistory(10.0) for what in ("top part", "bottom average")}
    kept = reject_outlying_tops(rnd, updates, states, history)
    assert [u.client for u in kept] == [2, 3, 4, 5, 6, 7] and sorted(states) == [1, 2, 3]
    assert sorted(rnd.lost) == [0, 1]
    assert rnd.lost[0].startswith("top worker 10: rejected top part: 3.8 per step from the")
    assert all(3.0 not in kind for kind in history["top part"].kinds.values())


def test_the_norm_history_of_one_cut_does_not_judge_another():
    """Issue 51 item 3: S²FL's clients train different cuts. Rounds of three cut-1 parts
    (norm 1 per step) filled the one history; a lone client of a deeper cut (its part holds
    more tensors, norm 13) was then held to their median and dropped at 13x. The history is
    per kind (the tensors an update holds): the deeper cut has no history yet and is kept; a
    lone cut-1 part at 13x is still dropped."""
    history = PeerHistory(10.0)
    for _ in range(2):
        shallow = _moves({1: [1.0], 2: [1.0], 3: [1.1]})
        assert shallow.outliers(history, 10.0) == {}
    deep = RoundMoves()
    part = {"w": torch.tensor([12.0]), "v": torch.tensor([5.0])}  # norm 13
    deep.add(4, part, {k: torch.zeros(1) for k in part}, 1)
    assert deep.outliers(history, 10.0) == {}
    lone = _moves({5: [13.0]}).outliers(history, 10.0)
    assert list(lone) == [5] and "13.0x the earlier rounds' median 1 " in lone[5]


class _Flipped(DeviceAgent):
    """Sends its honest part sign-flipped (the attack benchmark's ``FlippedPart``)."""

    def _on_finish(self, c, msg):
        reply = super()._on_finish(c, msg)
        for name, t in reply.tensors.items():
            if t.is_floating_point() and name.startswith("part/"):
                reply.tensors[name] = -t
        return reply


def _colluders_run(tmp_path, **changes):
    """One round of FedAvg with ten single-client devices, clients 0 and 1 flipping."""
    names = [f"d{i}" for i in range(10)]
    bed = Testbed.create(tmp_path / "bed", names)
    threads = [bed.device(n, [i], _Flipped if i < 2 else None) for i, n in enumerate(names)]
    net = bed.server_overrides(min_devices=10)
    sized = {"data.num_clients": 10, "train.clients_per_round": 10}
    cfg = config_for("fedavg", rounds=1, **{**sized, **changes, **net})
    result = splitfl.run(cfg, run_dir=tmp_path / "run")
    for t in threads:
        t.join(30)
    return result.metrics[0]


@pytest.mark.parametrize("spread", [10.0, 1e6])
def test_two_colluders_in_the_first_round_are_dropped_by_the_spread(tmp_path, spread):
    """In the first round, with the default 10, both colluders are dropped by the spread
    check and no honest client is; with the check off (1e6) they pass the norm check (the
    gap the spread check closes)."""
    row = _colluders_run(tmp_path, **{"network.bounds.peer_spread_factor": spread})
    if spread == 10.0:
        assert row["dropped_clients"] == [0, 1]
        for c in ("0", "1"):
            assert "peer_spread_factor 10 x the median distance" in row["dropped_reasons"][c]
    else:
        assert row["dropped_clients"] == []


def test_the_norm_check_compares_parts_of_the_same_tensors():
    """S²FL's mixed cuts (issue 51 item 3): five updates of ``a`` moved 0.1 per step and
    three of ``b`` (another cut's part) 2.0. All eight together have the median 0.1, and
    ``b``'s 2.0 > 10 × 0.1 were dropped (the old code); each against its own kind, none is."""
    moves = RoundMoves()
    for c in range(5):
        moves.add(c, {"a": torch.tensor([0.1])}, {"a": torch.zeros(1)}, 1)
    for c in range(5, 8):
        moves.add(c, {"b": torch.tensor([2.0, 0.0])}, {"b": torch.zeros(2)}, 1)
    assert moves.outliers(PeerHistory(10.0), 10.0) == {}
    assert len(peer_outliers(moves.distance, 10.0)) == 3  # all together: b's three dropped


def test_a_tiny_median_late_in_training_is_floored_at_the_parts_norm():
    """Issue 51 item 3: late in training honest moves are tiny, and an honest update at 20x a
    median of 1e-5 per step was dropped. Parts sent of norm 100, floor 1e-3: the medians the
    checks compare with are at least 0.1, so a move of 2e-4 is kept; one of 5 (50x the floor)
    is still dropped, and the reason names the floor. Without the floor (0): the old rule."""
    sent = {"w": torch.tensor([100.0, 0.0])}

    def late_round() -> RoundMoves:
        moves = RoundMoves()
        for c, move in {0: [1e-5, 0.0], 1: [0.0, 1e-5], 2: [1e-5, 1e-5], 3: [2e-4, 0.0]}.items():
            moves.add(c, {"w": sent["w"] + torch.tensor(move)}, sent, 1)
        return moves

    assert late_round().outliers(PeerHistory(10.0), 10.0, floor=1e-3) == {}
    assert 3 in late_round().outliers(PeerHistory(10.0), 10.0)  # no floor: dropped, as before
    loud = late_round()
    loud.add(4, {"w": sent["w"] + torch.tensor([5.0, 0.0])}, sent, 1)
    found = loud.outliers(PeerHistory(10.0), 10.0, floor=1e-3)
    assert list(found) == [4] and "peer_update_floor" in found[4]
    assert peer_outliers({1: 1e-5, 2: 1e-5, 3: 3e-4}, 10.0, floor=0.1) == {}
    assert list(peer_outliers({1: 1e-5, 2: 1e-5, 3: 3e-4}, 10.0)) == [3]

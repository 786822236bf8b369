"""A RingSFL member's uploaded model held against the others' and the server's own step
(:func:`splitfl.net.server.ring.peer_faults`). Issue 51 item 4: a member uploading
``global − 9.9 ‖global‖ · unit(update)`` (inside the model-relative bound) left the run at
chance (10.58 %) for every round, and later rounds were abandoned naming honest members.
Loopback gRPC, devices in threads."""

from __future__ import annotations

import torch
from test_networked_d2d import RING_DEVICES, _networked, _rows

from splitfl.core.plan import RING_MEMBER_FAILED
from splitfl.net.device import clusters as device_clusters
from splitfl.net.server.ring import peer_faults
from splitfl.testing import flip_away


def _flipped_upload(monkeypatch, member: int) -> None:
    """Member ``member`` uploads ``g − 9.9 ‖g‖ · unit(its honest move)`` for every tensor."""
    original = device_clusters.ring_session

    def flipping(agent, c, msg, abort):
        reply = original(agent, c, msg, abort)
        if c == member and reply.type == "ring_done":
            flip_away(reply.tensors, msg.tensors)
        return reply

    monkeypatch.setattr(device_clusters, "ring_session", flipping)


def test_a_member_whose_upload_points_away_is_named(tmp_path, monkeypatch):
    """Client 1 flips its upload: each ring it is in is abandoned naming it (the rejected
    ring model), never an honest member; the ring without it trains (the old code: every
    round aggregated its model, test accuracy at chance, issue 51: 10.58 %)."""
    _flipped_upload(monkeypatch, 1)
    net, _ = _networked(
        tmp_path, "ringsfl", RING_DEVICES, rounds=3, **{"network.bounds.min_cosine": 0.0}
    )
    rows = _rows(net)
    for row in rows:
        reasons = row["dropped_reasons"]
        for c, why in reasons.items():
            if c == "1":
                assert why.startswith(f"{RING_MEMBER_FAILED}, ring round abandoned: rejected")
                assert "ring model" in why
            else:
                assert why.startswith("ring round abandoned: client 1 failed: rejected"), why
    assert rows[0]["dropped_clients"] == [0, 1, 2, 3]
    assert rows[1]["clients"] == [0, 2, 3] and rows[1]["dropped_clients"] == []
    # the ring without it trained; the abandoned round left the model as it was
    accs = [r["test_acc"] for r in rows]
    assert accs[1] > accs[0] + 0.05 and accs[2] == accs[1], accs


def test_the_ring_peer_check_by_hand():
    """Four members' models moved (1, 0), (1.1, 0), (0.9, 0.1) and (−9, 0) from the global
    (0, 0) in one step: the last is rejected (its spread from the median move and its
    norm, 9 ≈ 9× the median 1.0, against factor 10: the spread's reason), the others kept."""
    from splitfl.config import BoundsConfig
    from splitfl.net.transport.wire import Message, state_tensors

    class _Model:
        def state_dict(self):
            return {"w": torch.zeros(2)}

    moved = {0: [1.0, 0.0], 1: [1.1, 0.0], 2: [0.9, 0.1], 3: [-9.0, 0.0]}
    replies = {
        c: (Message("ring_done", {}, state_tensors("model", {"w": torch.tensor(m)})), 0, 0.0)
        for c, m in moved.items()
    }
    tasks = {c: type("T", (), {"steps": 1})() for c in moved}
    found = peer_faults(replies, _Model(), tasks, BoundsConfig(), None)
    assert list(found) == [3]
    assert found[3].startswith("rejected ring model: ")

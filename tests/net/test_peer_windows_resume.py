"""The peer windows outlive the server process (issue 51): the accepted smashed-data RMS per
(cut, tensor, step) (:class:`~splitfl.net.trust.checks.PeerScale`) and the accepted update
distances per kind (:class:`~splitfl.net.trust.checks.PeerHistory`) are checkpointed with the
networked executor's state as strict JSON and restored by ``--resume``, so a resumed server
judges a lone client or a round of two as the uninterrupted run would. A malformed checkpoint
is refused in one line naming the field."""

from __future__ import annotations

import io
import json

import pytest
import torch
from test_networked_d2d import _rows

import splitfl
from splitfl.config import ConfigError
from splitfl.experiment.loop import restore_executor
from splitfl.experiment.runner import as_config
from splitfl.net.server.executor import NetworkedExecutor
from splitfl.net.server.testbed import Testbed
from splitfl.net.trust.checks import PeerHistory, PeerScale
from splitfl.testing import config_for

KIND = ("blocks.0.bias", "blocks.0.weight")


def _scale() -> PeerScale:
    """Windows at two (cut, tensor, step) keys: RMS 1, 2, 3 from clients 0, 1, 2 at cut 1,
    tensor 0, step 0; 0.5 from client 4 at cut 2, tensor 1, step 3."""
    scale = PeerScale(8.0, 0.1)
    for client, value in enumerate([1.0, 2.0, 3.0]):
        assert scale.problem((1, 0), 0, client, value) is None
    assert scale.problem((2, 1), 3, 4, 0.5) is None
    return scale


def _history() -> PeerHistory:
    """Accepted distances 1, 2, 3 of ``KIND`` (a round of three) and 0.25 of no stated kind."""
    history = PeerHistory(10.0)
    assert history.outliers({0: 1.0, 1: 2.0, 2: 3.0}, kind=KIND) == {}
    assert history.outliers({5: 0.25}) == {}
    return history


def _json(state):
    """``state`` through strict JSON and back (what a checkpoint may hold)."""
    return json.loads(json.dumps(state, allow_nan=False))


def test_the_windows_round_trip_through_strict_json_and_judge_alike():
    scale, history = _scale(), _history()
    scale_state, history_state = _json(scale.state_dict()), _json(history.state_dict())
    assert scale_state == [
        {"at": [1, 0, 0], "values": [1.0, 2.0, 3.0], "clients": [0, 1, 2]},
        {"at": [2, 1, 3], "values": [0.5], "clients": [4]},
    ]
    assert history_state == [
        {"kind": list(KIND), "distances": [1.0, 2.0, 3.0]},
        {"kind": None, "distances": [0.25]},
    ]
    restored_scale, restored_history = PeerScale(8.0, 0.1), PeerHistory(10.0)
    restored_scale.load_state_dict(scale_state)
    restored_history.load_state_dict(history_state)
    assert restored_scale.values == scale.values and restored_scale.clients == scale.clients
    assert restored_history.kinds == history.kinds
    assert restored_scale.values[(1, 0, 0)].maxlen == PeerScale.WINDOW
    assert restored_history.kinds[KIND].maxlen == history.keep
    # client 3's batch against its peers' median 2: 8 x 2 + 0.1 = 16.1; a fresh window has
    # no peers at that step and holds it to the model-relative bound only
    why = restored_scale.problem((1, 0), 0, 3, 17.0)
    assert why and why.startswith("activation RMS 17 above 16.1")
    assert PeerScale(8.0, 0.1).problem((1, 0), 0, 3, 17.0) is None
    # a lone update of KIND against the earlier rounds' lower median 2: 25 > 10 x 2
    lone = restored_history.outliers({7: 25.0}, kind=KIND)
    assert lone[7].startswith("rejected model update: norm 25 is 12.5x the earlier rounds'")
    assert PeerHistory(10.0).outliers({7: 25.0}, kind=KIND) == {}


def test_the_executor_checkpoints_its_windows_and_a_resume_restores_them():
    """The executor's whole state (the windows with its times) survives strict JSON and a
    weights-only ``torch.load``, and ``restore_executor`` (what ``--resume`` calls) gives a
    fresh executor the same windows."""
    cfg = as_config(config_for("s2fl", executor="networked"))
    old = NetworkedExecutor(cfg)
    old._peers, old._updates["top part"] = _scale(), _history()
    state = old.state_dict()
    assert _json(state) == state
    buf = io.BytesIO()  # as the checkpoint is written (torch.save) and read (weights only)
    torch.save({"executor": state}, buf)
    buf.seek(0)
    kept = torch.load(buf, weights_only=True)["executor"]
    new = NetworkedExecutor(cfg)
    restore_executor(new, kept)
    assert new._peers.values == old._peers.values and new._peers.clients == old._peers.clients
    assert new._updates["top part"].kinds == old._updates["top part"].kinds
    assert new._updates["model update"].kinds == {}
    assert new.state_dict() == state
    # a checkpoint written before the windows were kept: they start empty, as before
    older = {k: v for k, v in state.items() if not k.startswith("peer_")}
    restore_executor(fresh := NetworkedExecutor(cfg), older)
    assert fresh._peers.values == {} and all(not h.kinds for h in fresh._updates.values())


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda s: s["peer_scale"][0].update(values=[1.0, float("nan")]), r"peer_scale\[0\]"),
        (lambda s: s["peer_scale"][0].update(values=[-1.0]), r"peer_scale\[0\]\.values"),
        (lambda s: s["peer_scale"][0].update(values=[1.0] * 65), r"peer_scale\[0\]\.values"),
        (lambda s: s["peer_scale"][0].update(values=["1"]), r"peer_scale\[0\]\.values"),
        (lambda s: s["peer_scale"][1].update(at=[1, 0, 0]), r"peer_scale\[1\]\.at: .* twice"),
        (lambda s: s["peer_scale"][0].update(at=[1, True]), r"peer_scale\[0\]\.at"),
        (lambda s: s["peer_scale"][0].update(clients=[0, 0]), r"peer_scale\[0\]\.clients"),
        (lambda s: s["peer_scale"][0].update(clients=[-1]), r"peer_scale\[0\]\.clients"),
        (lambda s: s["peer_scale"][0].pop("clients"), r"peer_scale\[0\]: not an entry"),
        (lambda s: s.update(peer_scale={"1": [1.0]}), r"peer_scale: not a list"),
        (
            lambda s: s["peer_history"]["top part"][0].update(distances=[1.0] * 33),
            r"peer_history\['top part'\]\[0\]\.distances",
        ),
        (
            lambda s: s["peer_history"]["top part"][0].update(distances=[float("inf")]),
            r"peer_history\['top part'\]\[0\]\.distances",
        ),
        (
            lambda s: s["peer_history"]["top part"][1].update(kind=[1, 2]),
            r"peer_history\['top part'\]\[1\]\.kind",
        ),
        (
            lambda s: s["peer_history"]["top part"][1].update(kind=list(KIND)),
            r"peer_history\['top part'\]\[1\]\.kind: .* twice",
        ),
        (lambda s: s["peer_history"].update(spare=[]), r"peer_history: not a dict"),
    ],
    ids=[
        "nan",
        "negative",
        "longer-than-window",
        "string",
        "key-twice",
        "bool-key",
        "client-twice",
        "negative-client",
        "missing-clients",
        "not-a-list",
        "longer-than-keep",
        "inf-distance",
        "kind-not-names",
        "kind-twice",
        "unknown-part",
    ],
)
def test_a_malformed_window_is_refused_in_one_line_naming_the_field(change, field):
    cfg = as_config(config_for("s2fl", executor="networked"))
    old = NetworkedExecutor(cfg)
    old._peers, old._updates["top part"] = _scale(), _history()
    state = old.state_dict()
    change(state)
    new = NetworkedExecutor(cfg)
    with pytest.raises(ConfigError, match=field) as err:
        restore_executor(new, state)
    assert "\n" not in str(err.value)
    assert "executor state is damaged" in str(err.value)
    assert new._peers.values == {} and all(not h.kinds for h in new._updates.values())


#: Two devices of three clients each, all six in every round: S²FL's cuts as its schedule
#: assigns them (a round of two or three per cut: the history judges them by kind).
DEVICES = {"a": [0, 1, 2], "b": [3, 4, 5]}
SIZED = {"data.num_clients": 6, "train.clients_per_round": 6, "train.local_steps": 2}


def _run(tmp_path, tag: str, rounds: int, resume=None):
    """A networked S²FL run of ``rounds`` (or ``resume`` of that run dir to ``rounds``) with
    DEVICES in threads; returns the run and its last checkpoint's executor state."""
    bed = Testbed.create(tmp_path / f"bed-{tag}", list(DEVICES))
    threads = [bed.device(n, c, retry_s=20.0) for n, c in DEVICES.items()]
    try:
        if resume is None:
            net = bed.server_overrides(min_devices=2, timeout_s=10.0)
            cfg = config_for("s2fl", **{**net, **SIZED, "rounds": rounds})
            result = splitfl.run(cfg, run_dir=tmp_path / tag)
        else:
            flags = [f"network.listen=127.0.0.1:{bed.port}", f"network.tokens={bed.tokens_file}"]
            result = splitfl.resume(resume, overrides=[*flags, f"rounds={rounds}"])
    finally:
        for t in threads:
            t.join(30)
    kept = torch.load(result.run_dir / "checkpoints" / "last.pt", weights_only=True)
    return result, kept["executor"]


def _windows(state: dict) -> tuple[dict, dict]:
    """The windows of an executor state, each sorted (concurrent groups append in the order
    their batches arrive): key → (sorted values, clients)."""
    scale = {tuple(e["at"]): (sorted(e["values"]), e["clients"]) for e in state["peer_scale"]}
    history = {
        (what, None if e["kind"] is None else tuple(e["kind"])): sorted(e["distances"])
        for what, entries in state["peer_history"].items()
        for e in entries
    }
    return scale, history


def test_a_resumed_server_s_windows_equal_the_uninterrupted_run_s(tmp_path):
    """Two rounds in one server, and one round then ``splitfl.resume`` to two on a fresh
    server: the windows after round 2 hold the same values (round 1's and round 2's) in both
    (before, the resumed server's held round 2's only)."""
    whole, whole_state = _run(tmp_path, "whole", 2)
    first, _ = _run(tmp_path, "first", 1)
    resumed, resumed_state = _run(tmp_path, "resumed", 2, resume=first.run_dir)
    for rows in (_rows(whole), _rows(resumed)):
        assert len(rows) == 2 and all(not r["dropped_reasons"] for r in rows), rows
    scale, history = _windows(whole_state)
    got_scale, got_history = _windows(resumed_state)
    assert set(got_scale) == set(scale) and set(got_history) == set(history)
    for at, (values, clients) in scale.items():
        assert got_scale[at][1] == clients, at
        assert got_scale[at][0] == pytest.approx(values, rel=1e-5), at
    for kind, distances in history.items():
        assert got_history[kind] == pytest.approx(distances, rel=1e-5), kind
    assert any(len(v) > len(DEVICES) for v, _ in scale.values())  # round 1's are in

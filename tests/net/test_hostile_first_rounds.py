"""Insiders where no peer median exists (issue 35, round 3): a ParallelSFL top worker alone
in the run's first round is held to the server's own step on its held samples
(:mod:`splitfl.net.trust.reference`), and a top worker whose report was rejected sits out doubling
elections; a RingSFL round still running at the round deadline is aborted, naming the member
that answers the abort late. Loopback gRPC, devices in threads of this process."""

from __future__ import annotations

import copy
import time

import pytest
import torch
from test_hostile_insiders import _RogueTop
from test_networked_d2d import _assert_named, _breaking, _ring_run, _rows

import splitfl
from splitfl.config import ConfigError, ExperimentConfig
from splitfl.config.parse import from_dict
from splitfl.core.benching import SitOut
from splitfl.experiment.validation import check_config as validate
from splitfl.models import build_model
from splitfl.net.device import ring as ring_device
from splitfl.net.server.testbed import Testbed
from splitfl.net.trust.checks import PeerHistory
from splitfl.net.trust.reference import ServerStep, own_step
from splitfl.testing import config_for


def test_the_servers_own_step_stands_in_before_any_history():
    """With one or two updates and no accepted distances yet, ``reference`` (the server's own
    step per local step) is the yardstick: 100 > 10 × 1.5 is rejected, 5 is not, and only 5
    joins the history."""
    history = PeerHistory(10.0)
    out = history.outliers({1: 5.0, 2: 100.0}, "top part", reference=lambda: 1.5)
    assert list(out) == [2]
    assert out[2].startswith("rejected top part: norm 100 is 66.7x the server's own step 1.5")
    assert list(history.accepted) == [5.0]
    assert PeerHistory(10.0).outliers({1: 5.0, 2: 100.0}) == {}  # no reference: as before


class _Digits:
    """Eight digits-shaped samples and labels (the MLP's input)."""

    x = torch.linspace(-1, 1, 8 * 64).reshape(8, 64)
    y = torch.arange(8) % 10


def test_the_servers_own_step_is_deterministic_and_leaves_the_model_alone():
    """The same model, samples and steps give the same distance; the model the server sent
    and torch's random state are untouched; a distance is per local step and over the names
    asked for only."""
    cfg = from_dict(ExperimentConfig, config_for("parallelsfl", model="mlp"))
    model = build_model("mlp", (64,), 10)
    before = copy.deepcopy(model.state_dict())
    state = torch.random.get_rng_state()
    step = ServerStep(model, (_Digits.x, _Digits.y), cfg.train, 0.05, steps=3)
    names = [k for k in before if k.startswith("blocks.3.")]
    first = own_step(step, names)()
    again = ServerStep(model, (_Digits.x, _Digits.y), cfg.train, 0.05, steps=3)
    assert first > 0 and first == own_step(again, names)()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert torch.equal(state, torch.random.get_rng_state())
    assert own_step(step, []) is None and own_step(None, names) is None
    assert step.distance(names[:1]) <= first


def test_a_top_worker_rejected_twice_sits_out_two_elections():
    """The rule (:class:`~splitfl.core.benching.SitOut` at 1 round): out the next round after
    its first rejection, the next two after its second in a row, from no streak once it
    served."""
    out = SitOut(1)
    out.fail(0, 0)
    assert out.sitting_out(1) == {0} and out.sitting_out(2) == frozenset()
    out.fail(0, 2)
    assert out.sitting_out(3) == out.sitting_out(4) == {0} and not out.sitting_out(5)
    restored = SitOut(1)
    restored.load_state_dict(
        {k: {str(c): n for c, n in v.items()} for k, v in out.state_dict().items()}
    )
    assert restored.sitting_out(4) == {0} and restored.failures == {0: 2}
    out.forgive(0)
    out.fail(0, 5)
    assert out.sitting_out(6) == {0} and not out.sitting_out(7)


class _FlippedTop(_RogueTop):
    """As a ParallelSFL top worker, reports its cluster's top part sign-flipped."""

    scale = None  # whatever another test set on the base class


def test_a_lone_rogue_top_worker_is_rejected_in_the_first_round(tmp_path):
    """Eight single-client devices, ``k`` 4: the planner forms one cluster in round 1 with
    client 0's device its top worker (the attack benchmark's ``parallelsfl-rogue-top``). No
    other top worker and no earlier round exist; its sign-flipped top part (2 × its norm away,
    inside the 10 × bound) moves ~80 × the server's own step per local step, so its cluster is
    dropped naming it; each later round it is a top worker in is rejected too, and after a
    rejection it is not elected in the next round (the next two after a second in a row)."""
    names = [f"d{i}" for i in range(8)]
    bed = Testbed.create(tmp_path / "bed", names)
    threads = [
        bed.device(n, [i], _FlippedTop if i == 0 else None, retry_s=20.0)
        for i, n in enumerate(names)
    ]
    net = bed.server_overrides(min_devices=8, timeout_s=5.0)  # all: round 1 as planned
    sized = {"data.num_clients": 8, "train.clients_per_round": 8, "options.parallelsfl.k": 4}
    result = splitfl.run(
        config_for("parallelsfl", rounds=4, **sized, **net), run_dir=tmp_path / "n"
    )
    for t in threads:
        t.join(30)
    rows = _rows(result)
    assert rows[0]["plan_tops"] == [0] and rows[0]["plan_n_clusters"] == 1
    assert sorted(rows[0]["dropped_clients"]) == list(range(1, 8))
    for why in rows[0]["dropped_reasons"].values():
        assert why.startswith("top worker 0: rejected top part: norm"), why
        assert "the server's own step" in why
    served = [r["round"] for r in rows if 0 in r["plan_tops"]]
    for r in served:
        assert any(w.startswith("top worker 0:") for w in rows[r - 1]["dropped_reasons"].values())
    assert 2 not in served  # out the round after its first rejection


def _busy(member):
    """Busy for 5 s at a hop (not waiting for a neighbour, not watching the abort): a drip
    just inside the neighbours' 8 s timeout."""
    time.sleep(5.0)


def test_a_ring_member_busy_past_the_round_deadline_is_named_and_sits_out(tmp_path, monkeypatch):
    """Client 1 holds the ring 5 s at a hop of round 2 (inside ``timeout_s`` 8 s, so its
    neighbours wait). Round 1 measured the ring (~0.5 s); round 2's deadline (2 × that, at
    least 2 s) aborts the ring; the waiting members answer at once, client 1 only when its
    hop is done: it is named as late and round 3 forms the ring without it, at honest speed
    (the old ring waited for every such hop). The 2 s floor: with 0.5 s, a loaded CI machine
    once made the honest round 3 slower than twice round 1, and it was abandoned too."""
    _breaking(monkeypatch, _busy)
    deadline = {"network.round_deadline_factor": 2.0, "network.round_deadline_min_s": 2.0}
    rows, _ = _ring_run(tmp_path, 0.3, rounds=3, **{"network.timeout_s": 8.0, **deadline})
    _assert_named(rows[1], 1, "still working at the round deadline: answered the abort")
    assert rows[2]["clients"] == [0, 2, 3] and rows[2]["dropped_clients"] == []
    ends = [0.0] + [r["wall_time"] for r in rows]
    assert ends[3] - ends[2] < 4.0  # round 3 does not wait for client 1's 5 s hop


@pytest.mark.parametrize("value", [-1, 4097])
def test_reference_samples_out_of_range_is_refused(value):
    cfg = config_for("parallelsfl", **{"network.bounds.reference_samples": value})
    with pytest.raises(
        ConfigError, match=r"network.bounds.reference_samples: must be in \[0, 4096\]"
    ):
        validate(from_dict(ExperimentConfig, cfg))


def _cooperative(member):
    """Holds the ring but answers the server's abort at once, like its waiting neighbours."""
    member.abort.wait(30.0)
    raise ring_device.RingBroken("aborted by the server")


def test_a_ring_past_its_deadline_whose_members_all_answer_at_once_names_no_one(
    tmp_path, monkeypatch
):
    """What remains: the deadline aborts the ring, but the member holding it answers the abort
    as fast as the others; the round is abandoned for the deadline, no one is named."""
    _breaking(monkeypatch, _cooperative)
    deadline = {"network.round_deadline_factor": 3.0, "network.round_deadline_min_s": 0.5}
    # every member answers the abort within ~0.05 s here; ``timeout_s`` only bounds a member
    # that never answers, so it is long: at 5 s, CI's loaded 2 cores (Ray tests on the other
    # worker) once kept one honest member's thread from answering in time, and it was named
    rows, _ = _ring_run(tmp_path, 0.3, rounds=2, **{"network.timeout_s": 20.0, **deadline})
    reasons = rows[1]["dropped_reasons"]
    assert rows[1]["dropped_clients"] == [0, 1, 2, 3]
    for why in reasons.values():
        assert why.startswith("ring round abandoned: no member named as at fault"), why
        assert "still working at the round deadline" in why

"""The direction check (``network.trust: untrusted``, ``network.bounds.min_cosine``,
:mod:`splitfl.net.trust.direction`): an update at an obtuse angle to the server's own step is
dropped (FLTrust's ReLU-clipped trust score, Cao et al. NDSS 2021). Issue 51: three colluders
of ten sending ``sent − 6 × (their honest move)`` passed the magnitude and spread checks in
some rounds and wrecked the default ``mean``; in a round of two clients an honest client was
dropped instead. Loopback gRPC, devices in threads."""

from __future__ import annotations

import json

import pytest
import torch
from test_hostile_insiders import _Boosted
from test_networked import _final, _networked, _rows

import splitfl
from splitfl.net.server.testbed import Testbed
from splitfl.net.trust.direction import cosine, direction_outliers
from splitfl.testing import config_for


def test_cosine_and_the_direction_check_by_hand():
    """Moves of ``w`` (2, 1), (1, 0.5), (0, 1) and (−3, −1): their coordinate-wise (lower)
    median is (0, 0.5); cosines with it 1/√5 = 0.447, 0.447, 1 and −1/√10 = −0.316: the last
    is dropped. Two moves of ``v`` (another cut's part: compared like with like) have no
    median of their own and are held to the server's step (1, 0) on ``v``: (−1, 0.5) has
    cosine −0.894, dropped; (0, 3) cosine 0, kept at the default 0 (FLTrust's ReLU gives it
    weight 0, not a negative one), dropped at 0.1. A zero move has no direction."""
    step = {"v": torch.tensor([1.0, 0.0])}
    assert cosine({"v": torch.tensor([2.0, 1.0])}, step) == pytest.approx(2 / 5**0.5)
    assert cosine({"v": torch.zeros(2)}, step) is None
    w = {0: [2.0, 1.0], 1: [1.0, 0.5], 2: [0.0, 1.0], 3: [-3.0, -1.0]}
    moves = {c: {"w": torch.tensor(m)} for c, m in w.items()}
    moves |= {7: {"v": torch.tensor([-1.0, 0.5])}, 8: {"v": torch.tensor([0.0, 3.0])}}
    toward = lambda names: {k: step[k] for k in names if k in step}  # noqa: E731
    out = direction_outliers(moves, toward, 0.0)
    assert sorted(out) == [3, 7]
    assert out[3] == (
        "rejected model update: cosine -0.316 with the round's median move, below 0 "
        "(network.bounds.min_cosine; FLTrust's trust score)"
    )
    assert out[7].startswith("rejected model update: cosine -0.894 with the server's own step")
    assert sorted(direction_outliers(moves, toward, 0.1)) == [3, 7, 8]
    assert direction_outliers({7: moves[7]}, None, 0.0) == {}  # no reference: not checked


def test_small_rounds_are_held_to_the_servers_step_whatever_min_cosine():
    """``small_round_min_cosine`` (default 0) judges only moves with no median of their own
    (fewer than 3 of the same tensors): with ``min_cosine`` off (-1), the moves of the test
    above lose 7 (cosine −0.894 with the server's step) but keep 3 (cosine −0.316 with its
    round's median: 3 or more keep ``min_cosine``); the larger bound applies (0.1 over 0
    drops 8, cosine 0, too; a small bound below ``min_cosine`` changes nothing)."""
    step = {"v": torch.tensor([1.0, 0.0])}
    w = {0: [2.0, 1.0], 1: [1.0, 0.5], 2: [0.0, 1.0], 3: [-3.0, -1.0]}
    moves = {c: {"w": torch.tensor(m)} for c, m in w.items()}
    moves |= {7: {"v": torch.tensor([-1.0, 0.5])}, 8: {"v": torch.tensor([0.0, 3.0])}}
    toward = lambda names: {k: step[k] for k in names if k in step}  # noqa: E731
    out = direction_outliers(moves, toward, -1.0, small_round_min_cosine=0.0)
    assert sorted(out) == [7]
    assert out[7] == (
        "rejected model update: cosine -0.894 with the server's own step, below 0 "
        "(network.bounds.small_round_min_cosine; FLTrust's trust score)"
    )
    assert direction_outliers(moves, toward, -1.0) == {}
    assert sorted(direction_outliers(moves, toward, 0.0, small_round_min_cosine=0.1)) == [3, 7, 8]
    assert sorted(direction_outliers(moves, toward, 0.0, small_round_min_cosine=-0.5)) == [3, 7]


class _Negated(_Boosted):
    """Sends ``sent − 6 × (its honest move)`` (issue 51's colluders: inside every norm
    bound the old checks had)."""

    factor = -6.0


class _Scaled(_Boosted):
    """Sends ``sent − 1.9 × (its honest move)`` (issue 51: k < 2 stays inside a 2× norm
    bound; the plain mean was wrecked by such colluders at 20 % and 30 % of the clients)."""

    factor = -1.9


def _unpinned(cfg: dict, aggregation: str | None = None) -> dict:
    """``cfg`` without the test configs' ``network.untrusted_aggregation: mean`` pin
    (``splitfl.testing.tiny_config``): the shipped default, or ``aggregation``."""
    cfg["network"].pop("untrusted_aggregation", None)
    if aggregation is not None:
        cfg["network"]["untrusted_aggregation"] = aggregation
    return cfg


def _run(tmp_path, clients: int, colluders: int, rounds: int, agent=_Negated, **changes):
    names = [f"d{i}" for i in range(clients)]
    bed = Testbed.create(tmp_path / "bed", names)
    threads = [bed.device(n, [i], agent if i < colluders else None) for i, n in enumerate(names)]
    net = bed.server_overrides(min_devices=clients)
    sized = {"data.num_clients": clients, "train.clients_per_round": clients}
    sized["network.bounds.min_cosine"] = 0.0  # FLTrust's rule (off by default)
    aggregation = changes.pop("network.untrusted_aggregation", None)
    cfg = config_for("fedavg", rounds=rounds, **{**sized, **changes, **net})
    cfg = _unpinned(cfg, aggregation)
    result = splitfl.run(cfg, run_dir=tmp_path / "run")
    for t in threads:
        t.join(30)
    lines = (result.run_dir / "metrics.jsonl").read_text().splitlines()
    return result, [json.loads(line) for line in lines if line]


def test_three_colluders_of_ten_are_dropped_in_every_round(tmp_path):
    """Untrusted with FLTrust's ``min_cosine: 0``: the three colluders are dropped in every
    round by their cosine with the server's step, no honest client is, and the run's status
    says what was dropped. (The old code: the spread check missed them in some rounds.)"""
    result, rows = _run(tmp_path, 10, 3, rounds=3)
    assert [row["dropped_clients"] for row in rows] == [[0, 1, 2]] * 3
    for row in rows[1:]:  # in round 1 the spread check may catch them first
        assert all("rejected model update: cosine" in row["dropped_reasons"][c] for c in "012")
    assert result.summary["status"].startswith("ok (9 client updates dropped in 3 of 3 rounds")


def test_in_a_round_of_two_the_colluder_is_dropped_not_the_honest_client(tmp_path):
    """Two clients, one negating (no peer median: the old code held both to the server's
    step by norm and, on issue 51's run, dropped the honest one)."""
    _, rows = _run(tmp_path, 2, 1, rounds=2)
    assert [row["dropped_clients"] for row in rows] == [[0], [0]]


def test_a_round_of_two_is_protected_by_default(tmp_path):
    """The shipped bounds (``min_cosine`` off) and aggregation: one colluder of two
    at ``sent − 1.9 × move`` is dropped in every round by its cosine with the server's own
    step (``network.bounds.small_round_min_cosine`` 0), the honest client never. The old
    code dropped nothing, the median of two was their mean, and the model stayed at 9.2 %
    (honest 98.6 %) with status ``ok`` (benchmarks/bench_attacks.py, default-round-of-2)."""
    off = {"network.bounds.min_cosine": -1.0}
    _, rows = _run(tmp_path, 2, 1, 2, _Scaled, **off)
    assert [row["dropped_clients"] for row in rows] == [[0], [0]]
    for row in rows:
        assert "(network.bounds.small_round_min_cosine;" in row["dropped_reasons"]["0"]


def test_a_run_whose_every_update_was_rejected_is_degraded(tmp_path):
    """Both clients of a round of two lie (``sent − 1.9 × move``): both are dropped in
    every round, the model never leaves its initial accuracy (near 10 % on ten classes),
    and the status says ``degraded (test accuracy at chance: ...)``. The old status: ``ok
    (4 client updates dropped ...)``."""
    off = {"network.bounds.min_cosine": -1.0}
    result, rows = _run(tmp_path, 2, 2, 2, _Scaled, **off)
    assert [row["dropped_clients"] for row in rows] == [[0, 1], [0, 1]]
    assert result.summary["status"].startswith("degraded (test accuracy at chance: ")


def test_trusted_fleets_get_the_simulation_exactly(tmp_path, sequential_run):
    """``network.trust: trusted``: the sequential run's final model and its (weighted mean)
    ``train_loss`` in every round; untrusted with ``network.untrusted_aggregation: mean``
    (the default is a robust rule, tested below): the same model in an honest run
    (nothing dropped), ``train_loss`` the clients' lower median."""
    seq = sequential_run(config_for("fedavg", rounds=2))
    seq_rows = [json.loads(x) for x in (seq.run_dir / "metrics.jsonl").read_text().splitlines()]
    trusted, _ = _networked(tmp_path / "t", "fedavg", rounds=2, **{"network.trust": "trusted"})
    mean = {"network.untrusted_aggregation": "mean"}
    untrusted, _ = _networked(tmp_path / "u", "fedavg", rounds=2, **mean)
    for run in (trusted, untrusted):
        a, b = _final(run), _final(seq)
        assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-5
    t_rows, u_rows = _rows(trusted), _rows(untrusted)
    assert [r["train_loss"] for r in t_rows] == pytest.approx(
        [r["train_loss"] for r in seq_rows], abs=1e-5
    )
    assert "train_loss_mean" not in t_rows[0]
    for u, s in zip(u_rows, seq_rows, strict=True):
        assert u["dropped_clients"] == [] and u["train_loss_outliers"] == []
        assert u["train_loss"] == u["train_loss_median"]
        assert u["train_loss_mean"] == pytest.approx(s["train_loss"], abs=1e-5)


def _move(state: dict, start: dict) -> dict:
    return {k: state[k].double() - start[k].double() for k in start if start[k].is_floating_point()}


def test_the_untrusted_default_aggregates_robustly_against_colluders(tmp_path):
    """Two colluders of five at ``k = 1.9``, the direction check off (its default): the
    untrusted default aggregates with centred clipping around the coordinate-wise median
    (Karimireddy et al. ICML 2021; Yin et al. ICML 2018), so the round's move keeps the
    honest direction (cosine > 0.5 with the honest fleet's mean move), as the median did;
    the plain mean (the default before the median) moved it backward: (3 − 2 × 1.9) / 5 =
    −0.16 × the honest move, cosine < 0."""
    from splitfl.config.parse import from_dict
    from splitfl.config.schema import ExperimentConfig
    from splitfl.experiment.context import build_context

    off = {"network.bounds.min_cosine": -1.0}
    cfg = config_for("fedavg", rounds=1, **{"data.num_clients": 5, "train.clients_per_round": 5})
    start = build_context(from_dict(ExperimentConfig, cfg)).model.state_dict()
    honest, _ = _run(tmp_path / "h", 5, 0, rounds=1, **off, **{"network.trust": "trusted"})
    robust, _ = _run(tmp_path / "r", 5, 2, 1, _Scaled, **off)
    mean = {"network.untrusted_aggregation": "mean"}  # the old default's aggregate
    plain, _ = _run(tmp_path / "p", 5, 2, 1, _Scaled, **off, **mean)
    ref = _move(torch.load(honest.run_dir / "model.pt", weights_only=True), start)
    moves = {
        name: _move(torch.load(r.run_dir / "model.pt", weights_only=True), start)
        for name, r in (("robust", robust), ("plain", plain))
    }
    assert cosine(moves["robust"], ref) > 0.5
    assert cosine(moves["plain"], ref) < 0


def test_the_untrusted_rule_by_hand():
    """``Rule.of_run``: an untrusted networked fleet with ``train.aggregation: mean`` gets
    ``network.untrusted_aggregation`` (``centered_clip``, issue 51 item 3: the median cost
    honest α 0.1 fleets 23 points after 20 rounds), each client counted once; trusted fleets,
    the simulation and an explicit robust ``train.aggregation`` keep theirs. Values 0, 1,
    10 with weights 1, 1, 5: the weighted median is 10 (the heavy client holds 5/7 of the
    weight: a device's sample count is its own claim), the unweighted one 1."""
    from splitfl.aggregation.robust import Rule, combine
    from splitfl.config.parse import from_dict
    from splitfl.config.schema import ExperimentConfig

    def rule(**changes):
        cfg = _unpinned(config_for("fedavg", **changes))
        return Rule.of_run(from_dict(ExperimentConfig, cfg))

    assert rule(**{"executor": "networked"}) == Rule("centered_clip", None, 0.1, unweighted=True)
    assert rule(**{"executor": "networked", "network.trust": "trusted"}) == Rule("mean")
    assert rule() == Rule("mean")  # the simulation
    clip = {"executor": "networked", "train.aggregation": "trimmed_mean"}
    assert rule(**clip) == Rule("trimmed_mean", None, 0.1)
    values = [torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([10.0])]
    now = torch.zeros(1)
    assert combine(now, values, [1, 1, 5], Rule("median")).item() == 10.0
    assert combine(now, values, [1, 1, 5], Rule("median", unweighted=True)).item() == 1.0


@pytest.mark.parametrize(
    ("trust", "rule", "expected"),
    [
        ("trusted", "median", "mean"),
        ("untrusted", "mean", "mean"),
        ("untrusted", "trimmed_mean", "trimmed_mean"),
    ],
)
def test_a_top_worker_averages_with_the_servers_rule(trust, rule, expected):
    """A ParallelSFL top worker averages its members with :meth:`Rule.of_run` of the config
    the server sends it (``device_config``). It was sent ``network.bounds`` only, so a
    device fell back to the defaults (untrusted, median) whatever the server's fleet was:
    a ``trusted`` or ``untrusted_aggregation: mean`` run's clusters differed from the
    simulation by 4.8e-3 (tests/conformance/test_topologies.py, Clusters)."""
    from splitfl.aggregation.robust import Rule
    from splitfl.config import ExperimentConfig, from_dict
    from splitfl.net.server.session import device_config

    server = from_dict(
        ExperimentConfig,
        config_for(
            "parallelsfl",
            executor="networked",
            **{"network.trust": trust, "network.untrusted_aggregation": rule},
        ),
    )
    device = from_dict(ExperimentConfig, device_config(server))
    assert Rule.of_run(device) == Rule.of_run(server)
    assert Rule.of_run(device).name == expected

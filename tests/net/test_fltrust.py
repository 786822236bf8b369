"""FLTrust aggregation (``network.untrusted_aggregation: fltrust``; Cao, Fang, Liu, Gong, NDSS
2021, Algorithm 1, Eq. 3–5; :mod:`splitfl.aggregation.robust`): the trust scores and rescaled
updates by hand, and on loopback gRPC with devices in threads, the server's own step filled
in every round of ten clients (the earlier attempt computed it for rounds of two only)."""

from __future__ import annotations

import pytest
import torch
from test_direction import _move, _Negated, _run
from test_networked import _final, _rows
from test_networked_d2d import CLUSTER_DEVICES, RING_DEVICES
from test_networked_d2d import _networked as _d2d

from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.aggregation.robust import Rule, robust_average
from splitfl.config import ConfigError, ExperimentConfig, from_dict
from splitfl.config.checks import check_fields
from splitfl.experiment.context import build_context
from splitfl.experiment.validation import check_algorithm
from splitfl.net.trust.direction import cosine
from splitfl.testing import config_for


class _Part:
    """A FedAvg participant: its whole model is its device part (cut = 1 block)."""

    def __init__(self, client: int, state: dict[str, torch.Tensor]):
        self.client, self.cut, self.group, self.state = client, 1, client, state


W, MEAN, COUNT = "blocks.0.weight", "blocks.0.running_mean", "blocks.0.num_batches_tracked"


def _model(w: list[float], mean: float, count: int) -> dict[str, torch.Tensor]:
    return {
        W: torch.tensor(w, dtype=torch.float64),
        MEAN: torch.tensor([mean], dtype=torch.float64),
        COUNT: torch.tensor(count),
    }


def test_trust_scores_and_rescaling_by_hand():
    """The model sent ``w`` = (1, 1); the server's step ``g_0`` = (3, 4), ‖g_0‖ = 5. Three
    updates: ``g_1`` = (4, 3) (cos 24/25 = 0.96, length 5: kept as it is), ``g_2`` = −g_0
    (negated: cos −1, ``TS_2`` = ReLU(−1) = 0), ``g_3`` = 10 g_0 (cos 1, rescaled to
    ‖g_0‖: ḡ_3 = (3, 4)). Eq. 5: w + (0.96 (4, 3) + (3, 4)) / 1.96 = (1 + 6.84 / 1.96,
    1 + 6.88 / 1.96). The running mean (not in ``g_0``: a buffer) is the trust-weighted mean
    (0.96 · 2 + 0 · 100 + 5) / 1.96 = 6.92 / 1.96; the counter (0.96 · 3 + 0 · 9 + 4) / 1.96
    = 3.51 → 4 (the plain mean: 5). Every score 0 (all negated): the model as sent. Both
    the layer-wise aggregation and ``robust_average`` compute it."""
    sent = _model([1.0, 1.0], 0.0, 0)
    g0 = {W: torch.tensor([3.0, 4.0], dtype=torch.float64)}
    models = [
        _model([5.0, 4.0], 2.0, 3),
        _model([-2.0, -3.0], 100.0, 9),
        _model([31.0, 41.0], 5.0, 4),
    ]
    rule = Rule("fltrust", unweighted=True, toward=g0)
    parts = [_Part(i, m) for i, m in enumerate(models)]
    weights = {0: 1.0, 1: 1.0, 2: 50.0}  # unweighted: the sample counts do not count
    out = layerwise_aggregate(sent, parts, {}, weights, rule)
    assert out[W].tolist() == pytest.approx([1 + 6.84 / 1.96, 1 + 6.88 / 1.96], abs=1e-12)
    assert out[MEAN].item() == pytest.approx(6.92 / 1.96, abs=1e-12)
    assert out[COUNT].item() == 4
    same = robust_average(models, [1.0, 1.0, 50.0], rule, reference=sent)
    assert all(torch.equal(same[k], out[k]) for k in out)
    liars = [parts[1], _Part(3, _model([-5.0, -7.0], 1.0, 2))]
    kept = layerwise_aggregate(sent, liars, {}, weights | {3: 1.0}, rule)
    assert all(torch.equal(kept[k], sent[k]) for k in sent)
    with pytest.raises(ValueError, match="without the server's step"):
        layerwise_aggregate(sent, parts, {}, weights, Rule("fltrust"))


def test_fltrust_is_a_validated_untrusted_rule():
    """``fltrust`` is a ``network.untrusted_aggregation`` value (not a ``train.aggregation``
    one: the simulation has no server step), it needs ``reference_samples``, and
    ``Rule.of_run`` carries the round's server step."""
    net = {"executor": "networked", "network.untrusted_aggregation": "fltrust"}
    config = _checked(**net)
    step = {W: torch.zeros(2)}
    assert Rule.of_run(config, step) == Rule("fltrust", unweighted=True)
    assert Rule.of_run(config, step).toward is step
    with pytest.raises(ConfigError, match="reference_samples"):
        none = {**net, "network.bounds.reference_samples": 0}
        _checked(**none)
    with pytest.raises(ConfigError, match="train.aggregation"):
        _checked(**{"train.aggregation": "fltrust"})


def test_fltrust_is_refused_where_the_aggregate_is_not_the_model_sent():
    """IFCA aggregates K cluster models, but the server's step (``g_0``) starts from the one
    global model: scoring a cluster's updates against it is not FLTrust, so ``fltrust`` is
    refused in one line naming the field (FedAvg, one global model, is accepted)."""
    net = {"executor": "networked", "network.untrusted_aggregation": "fltrust"}
    check_algorithm(from_dict(ExperimentConfig, config_for("fedavg", **net)))
    ifca = from_dict(ExperimentConfig, config_for("ifca", **net))
    with pytest.raises(ConfigError, match="network.untrusted_aggregation.*cluster model"):
        check_algorithm(ifca)
    check_algorithm(from_dict(ExperimentConfig, config_for("ifca", executor="networked")))


def _checked(**changes) -> ExperimentConfig:
    config = from_dict(ExperimentConfig, config_for("fedavg", **changes))
    check_fields(config)
    return config


#: Every check that could drop the colluders before aggregation widened or off, so that only
#: the aggregation rule stands between them and the model.
_WIDE = {
    "network.bounds.peer_spread_factor": 1e6,
    "network.bounds.peer_update_factor": 1e6,
    "network.bounds.update_norm_factor": 1e6,
    "network.bounds.min_cosine": -1.0,
}


def test_fltrust_neutralises_negating_colluders_and_keeps_the_honest_run(tmp_path):
    """Ten clients, three rounds, ``fltrust``: the server's step is computed in every round
    of ten (without it the aggregation raises), three colluders sending
    ``sent − 6 × (their honest move)`` pass every check (widened) and are scored 0, so the
    model moves as the honest run's (cosine > 0.9) while the plain mean moves backward
    (cosine < 0: (7 − 18) / 10 of the honest move). The honest fltrust run is close to the
    honest mean: their moves' cosine > 0.9 and test accuracy within 0.1 (FLTrust rescales
    every update to the server's step, whose length differs from the clients'). Measured
    here: honest 86.1 % (fltrust) and 89.4 % (mean), attacked 81.9 % (fltrust) and 11.4 %
    (mean); cosines 0.999 (attacked vs honest fltrust), −0.977 (attacked vs honest mean),
    0.999 (honest fltrust vs mean)."""
    fl = {"network.untrusted_aggregation": "fltrust", **_WIDE}
    mean = {"network.untrusted_aggregation": "mean", **_WIDE}
    start = _start_of("fedavg", {"data.num_clients": 10, "train.clients_per_round": 10})
    honest, honest_rows = _run(tmp_path / "h", 10, 0, 3, **fl)
    plain_honest, plain_rows = _run(tmp_path / "m", 10, 0, 3, **mean)
    attacked, attacked_rows = _run(tmp_path / "a", 10, 3, 3, _Negated, **fl)
    wrecked, _ = _run(tmp_path / "w", 10, 3, 3, _Negated, **mean)
    for rows in (honest_rows, attacked_rows):
        assert [row["dropped_clients"] for row in rows] == [[]] * 3
    moves = {
        name: _move(_final(run), start)
        for name, run in (("h", honest), ("m", plain_honest), ("a", attacked), ("w", wrecked))
    }
    assert cosine(moves["a"], moves["h"]) > 0.9
    assert cosine(moves["w"], moves["m"]) < 0
    assert cosine(moves["h"], moves["m"]) > 0.9
    acc = {n: r[-1]["test_acc"] for n, r in (("h", honest_rows), ("m", plain_rows))}
    assert abs(acc["h"] - acc["m"]) <= 0.1
    assert attacked_rows[-1]["test_acc"] >= acc["h"] - 0.1
    assert _rows(wrecked)[-1]["test_acc"] < acc["m"] - 0.3  # the attack bites the mean


@pytest.mark.parametrize(
    ("algorithm", "devices", "changes"),
    [
        ("ringsfl", RING_DEVICES, {"options.ringsfl.version": "v2"}),
        ("parallelsfl", CLUSTER_DEVICES, {}),
    ],
    ids=["ringsfl", "parallelsfl"],
)
def test_fltrust_runs_the_ring_and_hosted_clusters(tmp_path, algorithm, devices, changes):
    """The ring's round (its own runner) and hosted ParallelSFL clusters: the server's step
    is filled there too (the aggregation raises without it), a top worker, which holds no
    root data, centre-clips its cluster (no error), and an honest run drops nothing and
    moves the model as the plain mean does (cosine > 0.9)."""
    start = _start_of(algorithm, changes)
    moves = {}
    for rule in ("fltrust", "mean"):
        run, threads = _d2d(
            tmp_path / rule,
            algorithm,
            devices,
            rounds=2,
            **{**changes, "network.untrusted_aggregation": rule},
        )
        assert [t.code for t in threads] == [0] * len(devices)
        assert [row["dropped_clients"] for row in _rows(run)] == [[], []]
        moves[rule] = _move(_final(run), start)
    assert cosine(moves["fltrust"], moves["mean"]) > 0.9


def _start_of(algorithm: str, changes: dict) -> dict[str, torch.Tensor]:
    """The model a run of ``algorithm`` with ``changes`` starts from (``config_for``'s seed)."""
    cfg = config_for(algorithm, rounds=1, **changes)
    return build_context(from_dict(ExperimentConfig, cfg)).model.state_dict()

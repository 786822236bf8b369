"""MergeSFL's baselines (AdaSFL, PyramidFL, LocFedMix-SL) and the jetson80 device preset."""

import math

import numpy as np
import pytest
import torch

import splitfl
from conftest import tiny_config
from splitfl.algorithms.adasfl import local_frequencies
from splitfl.algorithms.pyramidfl import oort_utility
from splitfl.engine.executor import _mix_pairs
from splitfl.system.devices import draw_population
from splitfl.system.jetson import MBPS, MODE_PERIOD, MODES


def test_adasfl_local_frequencies_fill_the_fastest_workers_round():
    # per-sample times 1, 2, 64 (s); batches after Eq. 9 with D=32: 32, 16, 1
    mu, beta = np.array([0.5, 1.0, 32.0]), np.array([0.5, 1.0, 32.0])
    batch = np.array([32, 16, 1])
    taus = local_frequencies(batch, mu, beta, tau=10, tau_min=1, tau_max=40)
    # round = 10 * 32 * 1 = 320 s; worker 2 needs 64 s per iteration -> 5 iterations
    assert taus.tolist() == [10, 10, 5]


def test_oort_utility_by_hand():
    # stat 2.0, last selected in round 1, now round 10: bonus sqrt(0.1 ln 10 / 1)
    bonus = math.sqrt(0.1 * math.log(10))
    assert oort_utility(2.0, 1, 10, time=5.0, preferred=10.0, alpha=2) == pytest.approx(2 + bonus)
    assert oort_utility(2.0, 1, 10, time=20.0, preferred=10.0, alpha=2) == pytest.approx(
        (2 + bonus) * 0.25
    )


class _W:
    def __init__(self, cut):
        self.task = type("T", (), {"cut": cut})()


def test_mixup_pairs_are_convex_combinations_of_equal_cut_members():
    fa, fb = torch.ones(3, 2), torch.zeros(4, 2)
    ya, yb = torch.tensor([0, 1, 2]), torch.tensor([3, 3, 3, 3])
    sent = [(_W(2), None, fa, ya), (_W(2), None, fb, yb), (_W(3), None, fb, yb)]
    pairs = list(_mix_pairs(sent, np.random.default_rng(0), alpha=1.0))
    for mixed, cut, y1, y2, lam in pairs:
        assert 0 <= lam <= 1 and mixed.shape[0] == len(y1) == len(y2)
        assert cut in (2, 3)
    # members with different cut points are never mixed
    assert all(len(p[2]) == 3 for p in pairs)


def test_locfedmix_aggregates_every_k_rounds_and_sends_no_gradients(tmp_path):
    cfg = tiny_config(
        algorithm="locfedmix_sl",
        rounds=2,
        **{"options.locfedmix_sl.tau": 2, "options.locfedmix_sl.aggregate_every": 2},
    )
    res = splitfl.run(cfg, run_dir=tmp_path / "l")
    first, second = res.metrics
    assert first["bytes_gradients_down"] == 0 and second["bytes_gradients_down"] == 0
    assert first["bytes_model_up"] == 0 and second["bytes_model_up"] > 0
    assert first["plan_aggregated"] is False and second["plan_aggregated"] is True
    init = torch.load(res.run_dir / "checkpoints" / "last.pt", weights_only=False)
    assert init["algorithm"]["local"] == {}  # cleared by the aggregation


def test_locfedmix_keeps_global_device_part_between_aggregations(tmp_path):
    cfg = tiny_config(
        algorithm="locfedmix_sl",
        rounds=1,
        **{"options.locfedmix_sl.tau": 2, "options.locfedmix_sl.aggregate_every": 3},
    )
    res = splitfl.run(cfg, run_dir=tmp_path / "l")
    from splitfl.engine.runner import as_config, prepare

    prep = prepare(as_config(cfg))
    start = prep.ctx.model.state_dict()
    final = torch.load(res.run_dir / "model.pt", weights_only=True)
    cut = prep.ctx.cut_points[-1]
    device_keys = [k for k in start if int(k.split(".")[1]) < cut]
    server_keys = [k for k in start if int(k.split(".")[1]) >= cut and k.endswith("weight")]
    assert all(torch.equal(start[k], final[k]) for k in device_keys)
    assert any(not torch.equal(start[k], final[k]) for k in server_keys)


def test_jetson80_population():
    pop = draw_population("jetson80", 80, np.random.default_rng(0))
    kinds = [pop.at(c, 0).kind.split("-")[0] for c in range(80)]
    assert (kinds.count("TX2"), kinds.count("NX"), kinds.count("AGX")) == (30, 40, 10)
    # modes hold within a 20-round period and are redrawn across periods
    same = all(pop.at(c, 0).flops == pop.at(c, MODE_PERIOD - 1).flops for c in range(80))
    changed = sum(pop.at(c, 0).flops != pop.at(c, MODE_PERIOD).flops for c in range(80))
    assert same and changed > 20
    # bandwidth fluctuates per round within 1-30 Mb/s; 100x spread of compute
    rates = [pop.at(c, r).uplink / MBPS for c in range(80) for r in range(5)]
    assert 1 <= min(rates) and max(rates) <= 30
    assert pop.at(3, 0).uplink != pop.at(3, 1).uplink
    assert max(MODES["AGX"]) / min(MODES["TX2"]) == pytest.approx(100)


def test_jetson80_runs_end_to_end_with_time_varying_clock(tmp_path):
    res = splitfl.run(
        tiny_config(algorithm="fedavg", rounds=2, **{"devices.preset": "jetson80"}),
        run_dir=tmp_path / "j",
    )
    assert res.metrics[1]["sim_time"] > res.metrics[0]["sim_time"] > 0

"""MergeSFL §IV-A: B^h estimated from the PS's measured ingress of earlier rounds (Eq. 10)."""

import dataclasses
import tempfile
from pathlib import Path

import numpy as np
import pytest

import splitfl
from conftest import tiny_config
from splitfl.algorithms.mergesfl.ingress import achieved_ingress, update_ingress
from splitfl.algorithms.state_estimation import measured_per_sample, server_link_wait
from splitfl.core.plan import RoundReport
from splitfl.core.seeding import rng_for
from splitfl.executors.sequential import SequentialExecutor
from splitfl.experiment.round_step import measure, measured_cost
from splitfl.experiment.runner import as_config, prepare
from splitfl.system.cost import ClientCost, Traffic


def _cost(up: float, down: float, link: tuple[float, float] | None, **extra) -> ClientCost:
    traffic = Traffic(model_up=up / 2, activations_up=up / 2, gradients_down=down)
    return ClientCost(traffic, 0.0, 0.0, 1.0, 1.0, 0.0, extra=extra, server_link=link)


def _report(costs: dict[int, ClientCost], jitter: dict[int, float]) -> RoundReport:
    times = {c: cost.time * jitter[c] for c, cost in costs.items()}
    zeros = {c: 0 for c in costs}
    return RoundReport(times, costs, jitter, zeros, zeros, max(times.values()))


def test_achieved_ingress_and_moving_average_by_hand():
    costs = {
        0: _cost(4e6, 1e6, (3e6, 3e6), server_in_rate=2e6),  # slowed by the shared link
        1: _cost(2e6, 1e6, (3e6, 3e6)),  # link not shared: its own uplink
        2: _cost(0.0, 1e6, (5e6, 5e6)),  # sent the PS nothing
        3: _cost(4e6, 1e6, None),  # a topology without a client-PS link
    }
    report = _report(costs, {0: 1.25, 1: 1.0, 2: 1.0, 3: 1.0})
    # the jitter stretched client 0's measured time: 2e6 / 1.25 + 3e6
    assert achieved_ingress(report) == pytest.approx(1.6e6 + 3e6, rel=1e-15)
    assert update_ingress(None, report, 0.8) == pytest.approx(4.6e6, rel=1e-15)
    assert update_ingress(5e6, report, 0.8) == pytest.approx(0.8 * 5e6 + 0.2 * 4.6e6, rel=1e-15)
    silent = _report({2: costs[2]}, {2: 1.0})
    assert achieved_ingress(silent) is None and update_ingress(5e6, silent, 0.8) == 5e6


def test_measured_clock_reports_the_rate_the_server_received_at():
    cost = _cost(4e6, 1e6, (3e6, 3e6), server_in_rate=2e6)
    times = {"upload_s": 2.5, "download_s": 1.0, "compute_s": 3.0, "server_s": 0.5}
    got = measured_cost(cost, times)
    assert got.extra["server_in_rate"] == 4e6 / 2.5
    assert (got.comm_time, got.device_time, got.server_time) == (3.5, 3.0, 0.5)
    assert (
        measured_cost(dataclasses.replace(cost, extra={}), {**times, "upload_s": 0.0}).extra == {}
    )


def test_mergesfl_budget_follows_the_measured_ingress_of_earlier_rounds():
    """Through the executor and the clock: round 0 budgets clients_per_round × D samples (the
    prior); after each round B^h = 0.8·B^{h-1} + 0.2·Σ_k server_in_rate_k / jitter_k over the
    round's report, and the next budget is B^h × min_i D·(μ_i+β⁰_i) bytes (Eq. 10, Eq. 7), β⁰
    the transmission time over the worker's own link."""
    changes = {"options.mergesfl.tau": 2, "devices.jitter": 0.3, "devices.contention": True}
    cfg = as_config(tiny_config(algorithm="mergesfl", **changes))
    prep = prepare(cfg)
    ctx, alg = prep.ctx, prep.algorithm
    d_max, c = cfg.train.batch_size, alg.state.bytes_per_sample()
    want = None
    shared = 0
    for r in range(3):
        mu, beta = alg.state.estimates(r)
        if want is None:
            assert alg.budget(mu, beta) == cfg.train.clients_per_round * d_max * c
        else:
            own = alg.state.own_link_beta()
            assert np.all(own <= beta + 1e-15)  # the shared link's wait is left out
            assert alg.budget(mu, beta) == pytest.approx(want * d_max * np.min(mu + own))
        plan = alg.plan_round(r, alg.select_clients(r, rng_for(3, "s", r)), rng_for(3, "p", r))
        state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
        result = SequentialExecutor().run_round(ctx, state, plan, round_seed=11)
        report, _ = measure(cfg, alg, plan, result, r)
        alg.observe(r, plan, report)
        sample = 0.0
        for t in plan.tasks:
            cost = report.costs[t.client]
            sample += cost.extra["server_in_rate"] / report.jitter[t.client]
            shared += cost.extra["server_in_rate"] < cost.server_link[0]
        want = sample if want is None else 0.8 * want + 0.2 * sample
        assert alg.ingress_estimate == pytest.approx(want, rel=1e-12)
    assert shared > 0  # the server link really limited some uploads
    before = alg.ingress_estimate
    alg.load_state_dict(alg.state_dict())  # B^h is checkpointed
    assert alg.ingress_estimate == before


def test_server_link_wait_and_own_link_beta_by_hand():
    """β⁰ leaves out what the shared PS link added: 4e6 B up at 2e6 instead of 3e6 B/s."""
    cost = _cost(4e6, 1e6, (3e6, 3e6), server_in_rate=2e6, server_out_rate=3e6)
    cost = dataclasses.replace(cost, comm_time=4e6 / 2e6 + 1e6 / 3e6)
    assert server_link_wait(cost) == pytest.approx(4e6 / 2e6 - 4e6 / 3e6, rel=1e-12)
    feature_share = (2e6 + 1e6) / 5e6  # activations + gradients of all 5e6 bytes
    shared = measured_per_sample(cost, 1.0, 10)[1]
    own = measured_per_sample(cost, 1.0, 10, own_link=True)[1]
    assert shared == pytest.approx((2.0 + 1 / 3) * feature_share / 10, rel=1e-12)
    assert own == pytest.approx((4 / 3 + 1 / 3) * feature_share / 10, rel=1e-12)
    assert server_link_wait(_cost(4e6, 1e6, None)) == 0.0


def _mergesfl_jetson(server_mbps: float, **options) -> list[dict]:
    """Eight timing rounds of MergeSFL on 40 jetson80 workers (AlexNet, batch 64)."""
    cfg = {
        "executor": "timing",
        "model": "alexnet",
        "algorithm": "mergesfl",
        "rounds": 8,
        "seed": 0,
        "data": {"dataset": "cifar10", "train_samples": 20_000, "num_clients": 40},
        "devices": {"preset": "jetson80", "server_rate": server_mbps * 1e6 / 8},
        "train": {"clients_per_round": 10, "batch_size": 64},
        "options": {"mergesfl": {"tau": 5, "cut": 5, **options}},
        "output": {"progress": False},
    }
    with tempfile.TemporaryDirectory() as tmp:
        return splitfl.run(cfg, run_dir=Path(tmp) / "run", progress=False).metrics[1:]


def test_eq10_budget_binds_a_tighter_ps_link_lowers_the_samples_per_iteration():
    """Issue 32 item 1: B^h decides how many samples the PS receives per iteration (Eq. 10)
    and line 7 uses most of it. With the iteration time taken on the shared link (the earlier
    reading) the budget grew with the contention and ~half the workers went at any rate."""
    tight, wide = _mergesfl_jetson(25.0), _mergesfl_jetson(100.0)
    per_iteration = {
        k: np.mean([r["plan_bandwidth"] for r in rows])
        for k, rows in {"tight": tight, "wide": wide}.items()
    }
    assert per_iteration["tight"] < 0.6 * per_iteration["wide"]
    used = [r["plan_bandwidth"] / r["plan_budget"] for r in tight]
    assert len(used) == 7 and all(u <= 1.0 + 1e-9 for u in used)
    assert np.mean(np.array(used) >= 0.9) >= 0.8
    assert np.mean([len(r["clients"]) for r in tight]) < np.mean([len(r["clients"]) for r in wide])

"""Adaptive algorithms estimate from what the clock reported, never from device profiles;
S²FL's lock-step group barrier is priced; time-varying devices (``devices.variation``)."""

from types import SimpleNamespace

import numpy as np
import pytest

from conftest import tiny_config
from splitfl.algorithms.s2fl import lockstep_finish
from splitfl.core.plan import ClientTask, RoundPlan, RoundReport
from splitfl.core.topology import Star
from splitfl.experiment.runner import as_config, prepare
from splitfl.system.cost import ClientCost, Traffic
from splitfl.system.devices import DeviceProfile, Population, draw_population, with_variation
from splitfl.topologies.star import STAR


def _cost(**traffic_and_times) -> ClientCost:
    times = {k: traffic_and_times.pop(k) for k in ("comm_time", "device_time", "server_time")}
    flops = {k: traffic_and_times.pop(k, 0.0) for k in ("device_flops", "server_flops")}
    return ClientCost(traffic=Traffic(**traffic_and_times), **flops, **times)


def _report(costs: dict[int, ClientCost], jitter: dict[int, float], samples: dict[int, int]):
    times = {c: cost.time * jitter[c] for c, cost in costs.items()}
    losses = {c: 0.0 for c in costs}
    return RoundReport(times, costs, jitter, samples, losses, max(times.values()))


def _swap_profiles(ctx) -> None:
    """Change every device's *true* profile (1000x faster) after the fact."""
    fast = DeviceProfile(flops=1e15, uplink=1e12, downlink=1e12, d2d=1e12)
    ctx.population = Population(tuple(fast for _ in ctx.population.devices), ctx.population.server)


def test_mergesfl_estimates_move_only_with_measurements():
    prep = prepare(as_config(tiny_config(algorithm="mergesfl", **{"options.mergesfl.tau": 2})))
    alg, ctx = prep.algorithm, prep.ctx
    cut = alg.cut
    # client 3 trained 40 samples: 2 s compute, 10 s transfers of which 60/100 bytes features
    cost = _cost(
        model_down=20,
        model_up=20,
        activations_up=30,
        gradients_down=30,
        comm_time=10.0,
        device_time=2.0,
        server_time=1.0,
    )
    plan = RoundPlan([ClientTask(3, cut, 0, 20, 2)])
    alg.observe(0, plan, _report({3: cost}, {3: 1.5}, {3: 40}))
    mu, beta = alg.state.estimates(1)
    assert mu[3] == pytest.approx(2.0 * 1.5 / 40)  # μ̂ = compute time x jitter / samples
    assert beta[3] == pytest.approx(10.0 * 1.5 * 0.6 / 40)  # feature share of transfer time
    # never-measured workers: the median of the measured ones (here: client 3's)
    assert mu[0] == mu[3] and beta[7] == beta[3]
    _swap_profiles(ctx)
    mu2, beta2 = alg.state.estimates(2)
    assert np.array_equal(mu, mu2) and np.array_equal(beta, beta2)
    # Eq. (5): a second measurement enters with weight 1 - 0.8
    alg.observe(1, plan, _report({3: cost}, {3: 1.0}, {3: 40}))
    assert alg.state.estimates(2)[0][3] == pytest.approx(0.8 * 0.075 + 0.2 * 0.05)


def test_s2fl_unseen_cut_is_eq1_with_measured_speeds_not_the_profile():
    prep = prepare(as_config(tiny_config()))
    alg, ctx = prep.algorithm, prep.ctx
    k1, k2 = ctx.cut_points[0], ctx.cut_points[-1]
    p, b = ctx.profile, ctx.config.train.batch_size
    samples = ctx.round_samples(0, b, ctx.local_steps(0, b))
    # device 0 measured at k1: made-up work and times, jitter 1.25
    cost = _cost(
        device_flops=8e8,
        server_flops=2e9,
        model_down=5e3,
        model_up=5e3,
        activations_up=1e4,
        comm_time=4.0,
        device_time=3.0,
        server_time=0.5,
    )
    plan = RoundPlan([ClientTask(0, k1, 0, b, 1)])
    alg.observe(3, plan, _report({0: cost}, {0: 1.25}, {0: samples}))
    assert alg.table_time(0, k1, 4) == pytest.approx(7.5 * 1.25)  # measured entry
    speed, rate, server = 8e8 / (3.0 * 1.25), 2e4 / (4.0 * 1.25), 2e9 / (0.5 * 1.25)
    bytes_k2 = 2 * p.device_bytes(k2) + 2 * samples * p.activation_bytes(k2)
    expected = (
        samples * p.device_flops(k2) / speed
        + bytes_k2 / rate
        + samples * p.server_flops(k2) / server
    )
    assert alg.table_time(0, k2, 4) == pytest.approx(expected, rel=1e-12)
    # a device never measured: the median of the measured entries at that cut
    assert alg.table_time(5, k1, 4) == pytest.approx(7.5 * 1.25)
    _swap_profiles(ctx)
    assert alg.table_time(0, k2, 4) == pytest.approx(expected, rel=1e-12)


def test_s2fl_warms_up_every_device_by_default():
    prep = prepare(as_config(tiny_config()))
    rng = np.random.default_rng(0)
    assert prep.algorithm.select_clients(0, rng) == list(range(prep.ctx.num_clients))
    assert len(prep.algorithm.select_clients(len(prep.ctx.cut_points), rng)) == 6


def test_lockstep_finish_by_hand():
    # A: download 1, three 1 s iterations, upload 1 (busy 5); B: 2, one 4 s iteration, 2
    finish = lockstep_finish({0: (1.0, [1.0, 1.0, 1.0], 1.0), 1: (2.0, [4.0], 2.0)})
    # E1 = max(1+1, 2+4) = 6 -> B ends 8; E2 = 7, E3 = 8 -> A ends 9
    assert finish == {0: 9.0, 1: 8.0}
    # equal step counts: the slowest member's own time
    assert lockstep_finish({0: (1.0, [1.0, 1.0], 1.0), 1: (1.0, [3.0, 3.0], 1.0)}) == {
        0: 8.0,
        1: 8.0,
    }


def _barrier_case(barrier: bool, groups=(0, 0)):
    """Members with 3 and 1 steps (busy 5 s and 8 s), their costs, and the star family's
    round time for them (``Star.barrier``: S²FL's ``lockstep_barrier``)."""
    costs = {
        # pre = 4·100/400 = 1, post = 1, per-sample work 5 - 2 = 3 over [16, 16, 16]
        0: _cost(
            model_down=100,
            model_up=100,
            activations_up=200,
            comm_time=4.0,
            device_time=1.0,
            server_time=0.0,
        ),
        # pre = post = 2, one step of 4
        1: _cost(model_down=100, model_up=100, comm_time=4.0, device_time=4.0, server_time=0.0),
    }
    train = SimpleNamespace(drop_last=False)  # what the view's config says (train.drop_last)
    view = SimpleNamespace(data_sizes=np.array([48, 16]), config=SimpleNamespace(train=train))
    tasks = [ClientTask(0, 1, groups[0], 16, 3), ClientTask(1, 1, groups[1], 16, 1)]
    plan = RoundPlan(tasks, topology=Star(barrier=barrier))
    return STAR.round_time(view, plan, 0, costs, {0: 48, 1: 16}, {0: 5.0, 1: 8.0})


def test_s2fl_round_time_is_eq1_of_the_slowest_participant_by_default():
    """§3.1: a device's round is Eq. (1)'s T; the round ends with the last upload."""
    round_time, waits = _barrier_case(False)
    assert round_time == 8.0 and waits == {0: 3.0, 1: 0.0}


def test_s2fl_round_time_charges_the_group_barrier_when_asked():
    """``lockstep_barrier: true``: the round lasts 9 s, not max(5, 8)."""
    round_time, waits = _barrier_case(True)
    assert round_time == pytest.approx(9.0)
    assert waits == pytest.approx({0: 4.0, 1: 1.0})
    # in separate groups (SplitFed V1) there is no barrier
    assert _barrier_case(True, groups=(0, 1))[0] == 8.0


def test_s2fl_plans_carry_the_barrier_option():
    for barrier in (False, True):
        cfg = tiny_config(algorithm="s2fl", **{"options.s2fl.lockstep_barrier": barrier})
        alg = prepare(as_config(cfg)).algorithm
        rng = np.random.default_rng(0)
        assert alg.plan_round(0, alg.select_clients(0, rng), rng).topology.barrier is barrier


def test_pyramidfl_and_adasampling_unmeasured_times_ignore_profiles():
    for name in ("pyramidfl", "adasampling"):
        prep = prepare(as_config(tiny_config(algorithm=name)))
        alg, ctx = prep.algorithm, prep.ctx
        before = (
            [alg.expected_time(c, 3, 0) for c in range(ctx.num_clients)]
            if name == "pyramidfl"
            else alg.probabilities(0).tolist()
        )
        _swap_profiles(ctx)
        after = (
            [alg.expected_time(c, 3, 0) for c in range(ctx.num_clients)]
            if name == "pyramidfl"
            else alg.probabilities(0).tolist()
        )
        assert before == after


def test_variation_is_seeded_per_period_and_off_at_zero():
    base = draw_population("s2fl_table1", 6, np.random.default_rng(0))
    assert with_variation(base, 0.0, 5, 1) is base
    pop = with_variation(base, 0.3, 5, seed=1)
    again = with_variation(base, 0.3, 5, seed=1)
    assert all(pop.at(c, r) == again.at(c, r) for c in range(6) for r in range(12))
    # factors hold within a period and are redrawn across periods
    assert all(pop.at(c, 0) == pop.at(c, 4) for c in range(6))
    assert sum(pop.at(c, 0).flops != pop.at(c, 5).flops for c in range(6)) == 6
    dev, speed_rate = pop.at(2, 7), pop.schedule.factors(2, 7)
    assert dev.flops == pytest.approx(base.devices[2].flops * speed_rate[0])
    assert dev.uplink == pytest.approx(base.devices[2].uplink * speed_rate[1])
    assert dev.downlink == pytest.approx(base.devices[2].downlink * speed_rate[1])

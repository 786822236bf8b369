"""The shared cost model: S²FL Eq. (1), traffic per link, round and waiting times."""

import numpy as np
import pytest

from splitfl.core.plan import ClientTask
from splitfl.experiment.runner import as_config, prepare
from splitfl.models.profile import BlockCost, ModelProfile
from splitfl.system import (
    ClusterLoad,
    DeviceProfile,
    MemberLoad,
    SimClock,
    cluster_times,
    jitter_factors,
    round_times,
    split_client_cost,
)
from splitfl.system.devices import S2FL_TABLE1_FLOPS, S2FL_TABLE1_RATE, draw_population
from splitfl.testing import config_for


def _profile() -> ModelProfile:
    # 3 blocks: bytes 400/800/200, flops/sample 1e6/2e6/3e6, activation bytes 64/32/4
    return ModelProfile(
        (
            BlockCost(100, 400, 1e6, 16, 64, 64),
            BlockCost(200, 800, 2e6, 8, 32, 32),
            BlockCost(50, 200, 3e6, 1, 4, 4),
        )
    )


def test_eq1_matches_hand_computation():
    # Prepare
    device = DeviceProfile(flops=1e9, uplink=1e6, downlink=1e6)
    server = DeviceProfile(flops=5e10, uplink=1e7, downlink=1e7)
    p = 100  # samples
    # Execute: cut after block 2 -> |Wc| = 1200 B, q = 32 B, F_c = p*3e6, F_s = p*3e6
    cost = split_client_cost(_profile(), cut=2, samples=p, device=device, server=server)
    # Assert: T = (2|Wc| + 2pq)/R + Fc/Comp_c + Fs/Comp_s
    expected = (2 * 1200 + 2 * p * 32) / 1e6 + p * 3e6 / 1e9 + p * 3e6 / 5e10
    assert cost.time == pytest.approx(expected, rel=1e-12)
    assert cost.traffic.to_dict() == {
        "model_down": 1200,
        "model_up": 1200,
        "activations_up": 3200,
        "gradients_down": 3200,
        "labels_up": 0,
        "d2d_model": 0,
        "d2d_activations": 0,
        "d2d_gradients": 0,
    }


def test_full_model_is_fedavg_cost_and_labels_counted_when_split():
    device = DeviceProfile(flops=2e9, uplink=2e6, downlink=4e6)
    server = DeviceProfile(flops=5e10, uplink=1e7, downlink=1e7)
    full = split_client_cost(_profile(), cut=3, samples=10, device=device, server=server)
    assert full.traffic.activations_up == 0 and full.server_time == 0
    assert full.time == pytest.approx(1400 / 2e6 + 1400 / 4e6 + 10 * 6e6 / 2e9)
    split = split_client_cost(_profile(), 1, 10, device, server, label_bytes=8)
    assert split.traffic.labels_up == 80
    assert split.comm_time == pytest.approx((400 + 640 + 80) / 2e6 + (400 + 640) / 4e6)


def test_round_and_waiting_times():
    round_time, waits = round_times({0: 3.0, 1: 5.0, 2: 4.5})
    assert round_time == 5.0
    assert waits == {0: 2.0, 1: 0.0, 2: 0.5}


def test_clock_never_goes_backwards_and_jitter_is_seeded():
    clock = SimClock()
    clock.advance(2.0)
    with pytest.raises(ValueError):
        clock.advance(-1.0)
    a = jitter_factors([1, 2, 3], 0.2, np.random.default_rng(7))
    b = jitter_factors([1, 2, 3], 0.2, np.random.default_rng(7))
    assert a == b and len(set(a.values())) == 3
    assert jitter_factors([1, 2], 0.0, np.random.default_rng(0)) == {1: 1.0, 2: 1.0}


@pytest.mark.parametrize(
    "composition,counts", [("uniform", (4, 3, 3)), ("5:3:2", (5, 3, 2)), ("2:3:5", (2, 3, 5))]
)
def test_s2fl_table1_population(composition, counts):
    pop = draw_population("s2fl_table1", 10, np.random.default_rng(0), composition)
    flops = [d.flops for d in pop.devices]
    rates = [d.uplink for d in pop.devices]
    for level, count in zip(("High", "Mid", "Low"), counts, strict=True):
        assert flops.count(S2FL_TABLE1_FLOPS[level]) == count
        assert rates.count(S2FL_TABLE1_RATE[level]) == count
    assert pop.server.flops == 5e10 and pop.server.uplink == 1e7


def _cluster(m1_compute: float = 0.020, m1_link: float = 2e6, top_d2d: float = 4e6):
    members = (
        MemberLoad(0.010, 0.002, 4e6, 4000, 2000, 400),
        MemberLoad(m1_compute, 0.002, m1_link, 4000, 2000, 400),
    )
    return ClusterLoad(members, top_d2d, top_uplink=2e6, top_downlink=2e6, model_bytes=1400)


def test_cluster_times_by_hand():
    """ParallelSFL cluster (Eq. 9, 15): FIFO top worker, members share the top's D2D radio."""

    # Execute: the top's 4e6 radio is shared by pair links 4e6 and 2e6 -> 2e6 each
    (ct,) = cluster_times([_cluster()], server=None)
    # Assert: arrivals 0.010 + 4000/2e6 = 0.012 and 0.022; top 0.002 each; gradients 0.001
    assert ct.d2d_rates == (2e6, 2e6)
    assert ct.member_iteration == pytest.approx((0.015, 0.025), rel=1e-12)
    # Eq. 9 holds where batches do not queue: t_i = mu_b + beta + mu_p
    assert ct.member_iteration[0] == pytest.approx(0.010 + 6000 / 2e6 + 0.002)
    # beta_c: PS down + bottom parts out and back over D2D + PS up (Eq. 15 prints the last)
    assert ct.model_times == pytest.approx((1400 / 2e6, 2 * 400 / 2e6, 1400 / 2e6), rel=1e-12)
    assert ct.beta_c == pytest.approx(1400 / 2e6 + 2 * 400 / 2e6 + 1400 / 2e6)
    assert ct.round_time(5) == pytest.approx(5 * 0.025 + ct.beta_c)
    # without contention each member has its pair link: 0.011 -> 0.0135, 0.022 -> 0.025
    (free,) = cluster_times([_cluster()], server=None, contention=False)
    assert free.member_iteration == pytest.approx((0.0135, 0.025), rel=1e-12)


def test_cluster_top_worker_queues_batches_that_arrive_together():
    # both batches arrive at 0.012: the second waits for the first (0.002) before its own
    (ct,) = cluster_times([_cluster(m1_compute=0.010, m1_link=4e6)], server=None)
    assert ct.member_iteration == pytest.approx((0.015, 0.017), rel=1e-12)


def test_cluster_top_workers_share_the_server_link():
    server = DeviceProfile(flops=1e12, uplink=3e6, downlink=3e6)
    empty = ClusterLoad((), 4e6, 2e6, 2e6, 1400)
    times = cluster_times([_cluster(), _cluster(), empty], server)
    # two active top workers with 2e6 links share 3e6: 1.5e6 each; a top-only cluster costs 0
    assert times[0].ps_rates == times[1].ps_rates == (1.5e6, 1.5e6)
    assert times[0].beta_c == pytest.approx(2 * 1400 / 1.5e6 + 2 * 400 / 2e6)
    assert times[2].round_time(3) == 0.0 and times[2].ps_rates == (2e6, 2e6)
    alone = cluster_times([_cluster(), _cluster()], server, contention=False)
    assert alone[0].ps_rates == (2e6, 2e6)


def test_exchange_latency_adds_a_fixed_time_per_exchange():
    device = DeviceProfile(flops=1e9, uplink=1e6, downlink=1e6)
    server = DeviceProfile(flops=5e10, uplink=1e7, downlink=1e7)
    eq1 = split_client_cost(_profile(), 2, 100, device, server)
    with_latency = split_client_cost(
        _profile(), 2, 100, device, server, exchanges=9, exchange_latency=0.01
    )
    assert with_latency.comm_time == pytest.approx(eq1.comm_time + 0.09, rel=1e-12)
    assert with_latency.device_time == eq1.device_time
    assert with_latency.server_time == eq1.server_time


def test_context_counts_one_exchange_per_mini_batch_and_model_transfer():
    base = prepare(as_config(config_for("splitfed_v1"))).ctx
    ctx = prepare(as_config(config_for("splitfed_v1", **{"devices.exchange_latency_s": 0.01}))).ctx
    task = ClientTask(client=0, cut=2, batch_size=16)
    # 100 samples in batches of 16 -> 7 exchanges, + model download and upload = 9
    extra = (
        ctx.task_cost(task, 100, 0, "server").comm_time
        - base.task_cost(task, 100, 0, "server").comm_time
    )
    assert extra == pytest.approx(0.09, rel=1e-9)
    full = ClientTask(client=0, cut=base.num_blocks, batch_size=16, upload_model=False)
    extra = (
        ctx.task_cost(full, 100, 0, "server").comm_time
        - base.task_cost(full, 100, 0, "server").comm_time
    )
    assert extra == pytest.approx(0.01, rel=1e-9)  # FedAvg: the model download only

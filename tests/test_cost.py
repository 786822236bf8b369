"""The shared cost model: S²FL Eq. (1), traffic per link, round and waiting times."""

import numpy as np
import pytest

from splitfl.models.profile import BlockCost, ModelProfile
from splitfl.system import DeviceProfile, SimClock, jitter_factors, round_times, split_client_cost
from splitfl.system.devices import S2FL_TABLE1_FLOPS, S2FL_TABLE1_RATE, draw_population


def _profile() -> ModelProfile:
    # 3 blocks: bytes 400/800/200, flops/sample 1e6/2e6/3e6, activation bytes 64/32/4
    return ModelProfile(
        (
            BlockCost(100, 400, 1e6, 16, 64),
            BlockCost(200, 800, 2e6, 8, 32),
            BlockCost(50, 200, 3e6, 1, 4),
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


def test_clustered_cost_by_hand():
    """ParallelSFL: a bottom worker's round with a top worker (Eq. 9 and 15)."""
    from splitfl.system import clustered_client_cost

    dev = DeviceProfile(flops=1e9, uplink=1e6, downlink=1e6, d2d=4e6)
    top = DeviceProfile(flops=4e9, uplink=2e6, downlink=2e6, d2d=8e6)
    cost = clustered_client_cost(
        _profile(), cut=1, samples=10, steps=5, device=dev, top=top, members=2, label_bytes=1
    )
    # full model 1400 B to/from the PS over the top's 2e6 link, shared by 2 members
    assert cost.traffic.model_down == cost.traffic.model_up == 700
    # D2D at min(4e6, 8e6): bottom model 400 B each way + 10 x (64+1) up + 10 x 64 down
    assert cost.traffic.d2d_model == 800 and cost.traffic.d2d_activations == 650
    assert cost.traffic.d2d_gradients == 640
    assert cost.comm_time == pytest.approx(2 * 1400 / 2e6 + (800 + 650 + 640) / 4e6)
    assert cost.device_time == pytest.approx(10 * 1e6 / 1e9)
    # the top worker processes both members' samples through blocks 1-2 (5e6 flops/sample)
    assert cost.server_time == pytest.approx(2 * 10 * 5e6 / 4e9)

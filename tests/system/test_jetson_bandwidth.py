"""jetson80's bandwidth in time (issue 32 item 2): an AR(1) process per worker on the normal
scale, uniform on the worker's distance-group range in every round, correlated by ρ."""

import math

import numpy as np
import pytest

from conftest import tiny_config
from splitfl.config import ConfigError
from splitfl.core.seeding import rng_for
from splitfl.experiment.runner import as_config
from splitfl.experiment.validation import check_config
from splitfl.system.devices import draw_population
from splitfl.system.jetson import BANDWIDTH_CORRELATION, DISTANCE_MBPS, MBPS, JetsonSchedule


def _series(rho: float, clients: int = 200, rounds: int = 60) -> np.ndarray:
    schedule = JetsonSchedule(("NX",) * clients, (1,) * clients, seed=7, correlation=rho)
    return np.array([[schedule.bandwidth(c, r) for r in range(rounds)] for c in range(clients)])


def test_rho_zero_is_the_independent_redraw_draw_for_draw():
    low, high = DISTANCE_MBPS[1]
    want = [rng_for(7, "bw", r, 3).uniform(low, high) * MBPS for r in range(5)]
    assert _series(0.0, clients=4, rounds=5)[3].tolist() == want


def test_ar1_by_hand_and_independent_of_query_order():
    rho, low, high = 0.5, *DISTANCE_MBPS[1]
    eps = [float(rng_for(7, "bw", r, 2).standard_normal()) for r in range(3)]
    z2 = rho * (rho * eps[0] + math.sqrt(1 - rho**2) * eps[1]) + math.sqrt(1 - rho**2) * eps[2]
    want = (low + (high - low) * 0.5 * (1 + math.erf(z2 / math.sqrt(2)))) * MBPS
    fresh = JetsonSchedule(("NX",) * 4, (1,) * 4, seed=7, correlation=rho)
    assert fresh.bandwidth(2, 2) == pytest.approx(want, rel=1e-12)  # round 2 asked first
    assert _series(rho, clients=4, rounds=3)[2, 2] == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("rho", [0.0, 0.5, 0.9, 1.0])
def test_marginal_stays_on_the_group_range_and_lag1_correlation_is_rho(rho):
    x = _series(rho) / MBPS
    low, high = DISTANCE_MBPS[1]
    assert low <= x.min() and x.max() <= high
    assert x.mean() == pytest.approx((low + high) / 2, abs=0.6)
    if rho < 1:
        lag1 = np.corrcoef(x[:, :-1].ravel(), x[:, 1:].ravel())[0, 1]
        assert lag1 == pytest.approx(rho, abs=0.05)
    else:
        assert np.all(x == x[:, :1])  # held for the whole run


def test_preset_default_and_config_field():
    population = draw_population("jetson80", 8, np.random.default_rng(0))
    assert population.schedule.correlation == BANDWIDTH_CORRELATION == 0.9
    held = draw_population("jetson80", 8, np.random.default_rng(0), bandwidth_correlation=1.0)
    assert held.schedule.correlation == 1.0
    assert held.at(3, 0).uplink == held.at(3, 17).uplink
    ok = tiny_config(**{"devices.preset": "jetson80", "devices.bandwidth_correlation": 0.0})
    check_config(as_config(ok))
    for preset, rho in [("s2fl_table1", 0.5), ("jetson80", 1.5)]:
        cfg = tiny_config(**{"devices.preset": preset, "devices.bandwidth_correlation": rho})
        with pytest.raises(ConfigError, match="devices.bandwidth_correlation"):
            check_config(as_config(cfg))

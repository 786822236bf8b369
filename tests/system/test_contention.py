"""Shared-link contention in the cost model: max-min shares, the server link, D2D override."""

import dataclasses

import numpy as np
import pytest

import splitfl
from conftest import tiny_config
from splitfl.config import ConfigError
from splitfl.experiment.runner import as_config, prepare
from splitfl.models.profile import BlockCost, ModelProfile
from splitfl.system import (
    DeviceProfile,
    draw_population,
    max_min_share,
    share_server_link,
    split_client_cost,
)

SERVER = DeviceProfile(flops=5e10, uplink=1e7, downlink=1e7)


def _profile() -> ModelProfile:
    return ModelProfile(
        (
            BlockCost(100, 400, 1e6, 16, 64, 64),
            BlockCost(200, 800, 2e6, 8, 32, 32),
            BlockCost(50, 200, 3e6, 1, 4, 4),
        )
    )


def _costs(rates: list[float], cut: int = 2, samples: int = 100) -> dict:
    devices = [DeviceProfile(flops=1e9, uplink=r, downlink=r) for r in rates]
    return {
        c: split_client_cost(_profile(), cut, samples, d, SERVER) for c, d in enumerate(devices)
    }


def test_max_min_share_by_hand():
    assert max_min_share([5e6] * 4, 1e7) == [2.5e6] * 4
    # caps that fit keep their own rate exactly
    assert max_min_share([1e6, 1e6, 1e6, 5e6], 1e7) == [1e6, 1e6, 1e6, 5e6]
    # the slow flow keeps 1e6, the other two split the remaining 6e6
    assert max_min_share([5e6, 1e6, 5e6], 7e6) == [3e6, 1e6, 3e6]
    assert max_min_share([], 1e7) == []
    with pytest.raises(ValueError, match="capacity"):
        max_min_share([1e6], 0.0)
    with pytest.raises(ValueError, match="own rate"):
        max_min_share([0.0], 1e7)


def test_four_clients_share_the_server_link_by_hand():
    # Prepare: 4 clients with 5e6 B/s links into a 1e7 B/s server (S2FL Table 1)
    costs = _costs([5e6] * 4)
    # Execute
    shared = share_server_link(costs, SERVER)
    # Assert: each transfer at 2.5e6; up = |Wc| + p*q = 1200 + 3200, down the same
    for c, cost in shared.items():
        assert cost.comm_time == pytest.approx(2 * (1200 + 3200) / 2.5e6, rel=1e-12)
        assert cost.extra["server_in_rate"] == cost.extra["server_out_rate"] == 2.5e6
        assert cost.device_time == costs[c].device_time
        assert cost.server_time == costs[c].server_time
        assert cost.traffic is costs[c].traffic
    # the input costs are not modified (pure Eq. 1 still there)
    assert costs[0].comm_time == pytest.approx(2 * 4400 / 5e6, rel=1e-12)


def test_unbinding_and_sequential_transfers_keep_eq1_exactly():
    costs = _costs([1e6, 1e6, 1e6, 5e6])  # 8e6 in total: the server does not bind
    shared = share_server_link(costs, SERVER)
    assert [c.time for c in shared.values()] == [c.time for c in costs.values()]
    many = _costs([5e6] * 4)
    one_at_a_time = share_server_link(many, SERVER, concurrent=False)
    assert [c.time for c in one_at_a_time.values()] == [c.time for c in many.values()]


def test_sharing_counts_every_server_byte_and_skips_costs_without_server_link():
    costs = _costs([5e6, 5e6], cut=3)  # FedAvg: full model down and up, no activations
    costs[0].traffic.model_down += 1400  # e.g. IFCA's extra cluster model
    costs[0].comm_time += 1400 / 5e6
    costs[2] = dataclasses.replace(costs[1], server_link=None)
    shared = share_server_link(costs, SERVER)
    # egress: 2800 B and 1400 B at 5e6 each (two flows into 1e7 and one is excluded)
    assert shared[0].comm_time == pytest.approx((1400 + 2800) / 5e6, rel=1e-12)
    three = share_server_link({**costs, 2: costs[1]}, SERVER)
    assert three[0].comm_time == pytest.approx(1400 / (1e7 / 3) + 2800 / (1e7 / 3))
    assert shared[2] is costs[2]


def test_contention_off_reproduces_pure_eq1(tmp_path):
    """Old numbers (before contention existed) and Eq. (1) client by client."""
    # SplitFed V1: its round time is the slowest client's (no warm-up, no group barrier)
    cfg = tiny_config(algorithm="splitfed_v1", rounds=1, **{"devices.contention": False})
    row = splitfl.run(cfg, run_dir=tmp_path / "off").metrics[0]
    assert row["round_time"] == pytest.approx(0.34836820736, rel=1e-12)  # before contention
    prep = prepare(as_config(cfg))
    ctx = prep.ctx
    for client, cut, t in zip(row["clients"], row["cuts"], row["client_times"], strict=True):
        steps = ctx.local_steps(client)
        samples = ctx.round_samples(client, ctx.config.train.batch_size, steps)
        assert t == pytest.approx(ctx.client_cost(client, cut, samples, 0).time, rel=1e-12)


def test_contention_on_slows_clients_to_their_server_share(tmp_path):
    # 6 homogeneous clients with 2e6 links into the 1e7 server: 1e7/6 each way
    changes = {
        "devices.preset": "homogeneous",
        "algorithm": "fedavg",
        "rounds": 1,
        "devices.contention": True,
    }
    on = splitfl.run(tiny_config(**changes), run_dir=tmp_path / "on").metrics[0]
    off_changes = {**changes, "devices.contention": False}
    off = splitfl.run(tiny_config(**off_changes), run_dir=tmp_path / "off").metrics[0]
    ctx = prepare(as_config(tiny_config(**changes))).ctx
    model = ctx.profile.total_bytes
    for t_on, t_off in zip(on["client_times"], off["client_times"], strict=True):
        assert t_on - t_off == pytest.approx(2 * model * (6 / 1e7 - 1 / 2e6), rel=1e-9)
    assert on["round_time"] > off["round_time"]


def test_vanilla_sl_clients_never_share(tmp_path):
    changes = {
        "devices.preset": "homogeneous",
        "algorithm": "vanilla_sl",
        "rounds": 1,
        "devices.contention": True,
    }
    on = splitfl.run(tiny_config(**changes), run_dir=tmp_path / "on").metrics[0]
    off_changes = {**changes, "devices.contention": False}
    off = splitfl.run(tiny_config(**off_changes), run_dir=tmp_path / "off").metrics[0]
    assert on["client_times"] == off["client_times"]


def test_d2d_rate_override_and_presets_without_server_bandwidth():
    pop = draw_population("jetson80", 8, np.random.default_rng(0), d2d_rate=3e6)
    assert {d.d2d for d in pop.devices} == {3e6}
    assert {pop.at(c, 41).d2d for c in range(8)} == {3e6}  # time-varying schedule too
    assert (
        pop.at(3, 41).uplink
        == draw_population("jetson80", 8, np.random.default_rng(0)).at(3, 41).uplink
    )
    ring = draw_population("ringsfl_testbed", 5, np.random.default_rng(0))
    assert not ring.shared_server and pop.shared_server
    ctx = prepare(as_config(tiny_config(**{"devices.d2d_rate": 1e5}))).ctx
    assert {ctx.population.at(c, 0).d2d for c in range(ctx.num_clients)} == {1e5}


def test_jetson80_ps_link_binds_max_min_by_hand():
    """jetson80's PS link is the routers' shared WiFi, 200 Mb/s = 2.5e7 B/s each way. Ten
    workers at 30 Mb/s and two at 1 Mb/s upload at once (302 Mb/s): the two slow ones keep
    1 Mb/s (1.25e5 B/s), the ten others share the rest, (2.5e7 − 2.5e5) / 10 = 2.475e6 B/s
    each, in both directions. (The old 1 Gb/s PS link never bound: every worker kept its own
    rate, as 30 concurrent workers at the 30 Mb/s maximum stay below it.)"""
    server = draw_population("jetson80", 12, np.random.default_rng(0)).server
    assert server.downlink == server.uplink == 200e6 / 8
    costs = _costs([30e6 / 8] * 10 + [1e6 / 8] * 2)
    for cost in costs.values():
        cost.server_time = 0.0  # compute is not the point here
    shared = share_server_link(costs, server)
    for c, cost in shared.items():
        rate = 2.475e6 if c < 10 else 1.25e5
        assert cost.extra["server_in_rate"] == pytest.approx(rate, rel=1e-12)
        assert cost.extra["server_out_rate"] == pytest.approx(rate, rel=1e-12)
        # up = |Wc| + p·q = 1200 + 3200 bytes, down the same (Eq. 1 at the shared rates)
        assert cost.comm_time == pytest.approx(2 * 4400 / rate, rel=1e-12)
    assert sum(c.extra["server_in_rate"] for c in shared.values()) == pytest.approx(2.5e7)


def test_jetson80_run_charges_the_ps_link(tmp_path):
    # 20 jetson80 workers all training (FedAvg, about 250 Mb/s of links on average): their
    # transfers fill the 200 Mb/s PS link, so the faster ones take longer than with
    # contention off; nobody is faster
    changes = {"devices.preset": "jetson80", "algorithm": "fedavg", "rounds": 2}
    changes |= {"data.num_clients": 20, "train.clients_per_round": 20}
    on = splitfl.run(
        tiny_config(**changes, **{"devices.contention": True}), run_dir=tmp_path / "on"
    )
    off_changes = {**changes, "devices.contention": False}
    off = splitfl.run(tiny_config(**off_changes), run_dir=tmp_path / "off")
    assert len(on.metrics) == 2  # the loop below is not vacuous
    for a, b in zip(on.metrics, off.metrics, strict=True):
        pairs = list(zip(a["client_times"], b["client_times"], strict=True))
        assert all(t_on >= t_off for t_on, t_off in pairs)
        assert sum(t_on > t_off * 1.01 for t_on, t_off in pairs) >= 5


def test_server_rate_overrides_the_preset_server_link():
    ctx = prepare(as_config(tiny_config(**{"devices.server_rate": 5e6}))).ctx
    assert (ctx.population.server.uplink, ctx.population.server.downlink) == (5e6, 5e6)
    assert ctx.population.server.flops == 5e10  # S²FL's server compute kept
    ring = draw_population("ringsfl_testbed", 5, np.random.default_rng(0), server_rate=1e7)
    assert ring.shared_server and ring.server.downlink == 1e7  # now it has a link to share


@pytest.mark.parametrize(
    "key,value",
    [
        ("devices.d2d_rate", 0.0),
        ("devices.d2d_rate", -1.0),
        ("devices.contention", 2),
        ("devices.server_rate", 0.0),
        ("devices.server_rate", -5.0),
    ],
)
def test_bad_contention_config_is_one_line_error(key, value):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        as_config(tiny_config(**{key: value}))


def test_s2fl_table1_default_does_not_share_the_printed_server_rate(tmp_path):
    """S²FL §5.1 prints the server's rate ("the transfer rate is set to 1 × 10^7") and Eq. (1)
    charges each device its own R: by default (``devices.contention: null``) the round's
    transfers are not paced by the 1e7 B/s server link, even where they exceed it (issue 50
    item 9: a default with no behavioural test). Shared as printed is the reading
    ``devices.contention: true``: slower."""
    changes = {"rounds": 1, "devices.preset": "s2fl_table1", "algorithm": "splitfed_v1"}
    ctx = prepare(as_config(tiny_config(**changes))).ctx
    server = ctx.population.server
    assert (server.uplink, server.downlink) == (1e7, 1e7)
    rows = {}
    for name, contention in (("default", None), ("off", False), ("on", True)):
        run_cfg = tiny_config(**changes, **{"devices.contention": contention})
        rows[name] = splitfl.run(run_cfg, run_dir=tmp_path / name).metrics[0]
    rates = [ctx.population.at(c, 0).uplink for c in rows["default"]["clients"]]
    assert sum(rates) > 1e7  # the round's uploads would exceed the server's rate
    assert rows["default"]["client_times"] == rows["off"]["client_times"]
    # max-min shares slow the fast devices (High 5e6 B/s), never the slowest
    pairs = list(zip(rows["on"]["client_times"], rows["default"]["client_times"], strict=True))
    assert all(on >= off for on, off in pairs) and any(on > off for on, off in pairs)

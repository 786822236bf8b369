"""Accounting: every transfer charged (LocFedMix-SL's deferred uploads: shared server link,
measured clock) and per-device energy."""

import numpy as np
import pytest

import splitfl
from conftest import tiny_config
from splitfl.core.plan import ClientUpdate, RoundResult
from splitfl.experiment.round_step import measure
from splitfl.experiment.runner import as_config, prepare
from splitfl.testing import config_for
from splitfl.topologies import family_of

# cnn_digits device part at the last candidate cut (blocks 0-2): conv weights and biases and
# BatchNorm weights/biases 192 + 4704 + 18624 = 23520, BN running stats 2·(16+32+64) = 224,
# 3 batch counters -> 23747 entries x 4 B (the cost model's bytes per state entry).
CNN_DIGITS_DEVICE_BYTES = 23747 * 4
#: LocFedMix-SL's linear auxiliary model on cnn_digits' smashed data (256 elements → 10 classes)
#: travels with the device part (issue 36: the cost model charges the auxiliary model's transfers).
LINEAR_AUX_BYTES = (256 * 10 + 10) * 4


def test_locfedmix_charges_the_upload_of_every_averaged_client(tmp_path):
    # Prepare: 3 of 12 clients per round, FedAvg of the device parts every 2nd round
    cfg = tiny_config(
        algorithm="locfedmix_sl",
        rounds=2,
        **{
            "train.clients_per_round": 3,
            "options.locfedmix_sl.tau": 1,
            "options.locfedmix_sl.aggregate_every": 2,
        },
    )
    # Execute
    first, second = splitfl.run(cfg, run_dir=tmp_path / "l").metrics
    # Assert: round 2 averages the parts of both rounds' clients, so all of them upload once
    a, b = set(first["clients"]), set(second["clients"])
    assert a != b  # some round-1 client is idle in round 2 (else the test proves nothing)
    w = CNN_DIGITS_DEVICE_BYTES + LINEAR_AUX_BYTES
    assert first["bytes_model_up"] == 0
    assert second["bytes_model_up"] == len(a | b) * w
    # downloads: round-1 clients keep their parts, only new clients download in round 2
    assert first["bytes_model_down"] == len(a) * w
    assert second["bytes_model_down"] == len(b - a) * w
    assert second["traffic_total_cum"] == pytest.approx(
        first["traffic_total"] + second["traffic_total"]
    )


def test_locfedmix_idle_upload_bounds_the_round_time(tmp_path):
    cfg = tiny_config(
        algorithm="locfedmix_sl",
        rounds=2,
        **{
            "devices.preset": "s2fl_table1",
            "train.clients_per_round": 3,
            "options.locfedmix_sl.tau": 1,
            "options.locfedmix_sl.aggregate_every": 2,
        },
    )
    first, second = splitfl.run(cfg, run_dir=tmp_path / "l").metrics
    pop = prepare(as_config(cfg)).ctx.population
    idle = set(first["clients"]) - set(second["clients"])
    uploads = [(CNN_DIGITS_DEVICE_BYTES + LINEAR_AUX_BYTES) / pop.at(c, 1).uplink for c in idle]
    assert second["round_time"] >= max(uploads + second["client_times"]) - 1e-12
    # waiting is averaged over the round's participants only
    assert len(second["client_times"]) == 3


def _locfedmix_aggregation_round(**changes):
    """LocFedMix-SL after clients 0-2 trained (parts kept on the devices) and the plan of the
    aggregation round 2 for clients 3-5, which trained; clients 0-2 upload while idle."""
    cfg = tiny_config(
        algorithm="locfedmix_sl",
        **{
            "train.clients_per_round": 3,
            "options.locfedmix_sl.tau": 1,
            "options.locfedmix_sl.aggregate_every": 2,
            **changes,
        },
    )
    config = as_config(cfg)
    alg = prepare(config).algorithm
    alg.local = {c: {} for c in (0, 1, 2)}
    plan = alg.plan_round(1, [3, 4, 5], np.random.default_rng(0))
    updates = [ClientUpdate(c, alg.cut, 0, 16, 1, {}, 0.0) for c in (3, 4, 5)]
    return config, alg, plan, RoundResult(updates, {})


def test_idle_uploads_share_the_server_link_with_the_participants():
    # 6 homogeneous devices with 2e6 B/s links into the 1e7 B/s server: 3 participants and 3
    # idle uploads are 6 flows into the server, 1e7/6 each (without the idle: 3 x 2e6 fits)
    config, alg, plan, result = _locfedmix_aggregation_round(
        **{"devices.preset": "homogeneous", "devices.contention": True}
    )
    report, waits = measure(config, alg, plan, result, 1)
    alone = family_of(plan).idle(alg.ctx, plan, 1)
    for c in (0, 1, 2):
        cost = report.costs[c]
        assert cost.extra["server_in_rate"] == pytest.approx(1e7 / 6, rel=1e-12)
        extra = (CNN_DIGITS_DEVICE_BYTES + LINEAR_AUX_BYTES) * (6 / 1e7 - 1 / 2e6)
        assert cost.comm_time - alone[c].comm_time == pytest.approx(extra, rel=1e-9)
        assert report.round_time >= cost.time
    for c in (3, 4, 5):
        assert report.costs[c].extra["server_in_rate"] == pytest.approx(1e7 / 6, rel=1e-12)
    assert set(waits) == {3, 4, 5}


def test_measured_clock_keeps_idle_uploads_out_of_the_measured_round():
    config, alg, plan, result = _locfedmix_aggregation_round(executor="networked", clock="measured")
    meter = {"upload_s": 0.5, "download_s": 0.25, "compute_s": 1.0, "server_s": 0.125}
    result.measured = {c: dict(meter) for c in (3, 4, 5)}  # idle uploaders have no meter
    result.measured_round_time = 2.0
    report, waits = measure(config, alg, plan, result, 1)
    assert {c: report.times[c] for c in (3, 4, 5)} == {3: 1.875, 4: 1.875, 5: 1.875}
    assert report.round_time == 2.0
    assert waits == {3: 0.125, 4: 0.125, 5: 0.125}  # participants only
    for c in (0, 1, 2):  # the cost model's upload, charged as traffic; no compute
        assert report.costs[c].traffic.model_up == CNN_DIGITS_DEVICE_BYTES + LINEAR_AUX_BYTES
        assert report.costs[c].device_time == 0.0
        assert report.jitter[c] == 1.0


@pytest.mark.parametrize("algorithm", ["fedavg", "splitfed_v1"])
def test_energy_by_client_is_aligned_and_sums_to_energy(tmp_path, algorithm):
    cfg = tiny_config(algorithm=algorithm, rounds=1, **{"train.local_steps": 2})
    (row,) = splitfl.run(cfg, run_dir=tmp_path / "e").metrics
    ctx = prepare(as_config(cfg)).ctx
    by_client = row["energy_j_by_client"]
    assert len(by_client) == len(row["clients"])
    assert sum(by_client) == pytest.approx(row["energy_j"])
    assert all(e > 0 for e in by_client)
    # each entry is that client's device compute time x power (no jitter by default)
    for c, e in zip(row["clients"], by_client, strict=True):
        cut = ctx.num_blocks if algorithm == "fedavg" else ctx.cut_points[-1]
        samples = ctx.round_samples(c, 16, 2)
        flops = samples * ctx.profile.device_flops(cut)
        device = ctx.population.at(c, 0)
        assert e == pytest.approx(flops / device.flops * device.power)


def test_ringsfl_energy_by_client_splits_the_ring(tmp_path):
    cfg = config_for("ringsfl", rounds=1, **{"train.local_steps": 1})
    (row,) = splitfl.run(cfg, run_dir=tmp_path / "r").metrics
    assert row["clients"] == [0, 1, 2, 3]
    assert len(row["energy_j_by_client"]) == 4
    assert sum(row["energy_j_by_client"]) == pytest.approx(row["energy_j"])

"""Accounting: every transfer charged (LocFedMix-SL's deferred uploads) and per-device energy."""

import pytest

import splitfl
from conftest import tiny_config
from splitfl.experiment.runner import as_config, prepare
from splitfl.testing import config_for

# cnn_digits device part at the last candidate cut (blocks 0-2): conv weights and biases and
# BatchNorm weights/biases 192 + 4704 + 18624 = 23520, BN running stats 2·(16+32+64) = 224,
# 3 batch counters -> 23747 entries x 4 B (the cost model's bytes per state entry).
CNN_DIGITS_DEVICE_BYTES = 23747 * 4


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
    w = CNN_DIGITS_DEVICE_BYTES
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
    uploads = [CNN_DIGITS_DEVICE_BYTES / pop.at(c, 1).uplink for c in idle]
    assert second["round_time"] >= max(uploads + second["client_times"]) - 1e-12
    # waiting is averaged over the round's participants only
    assert len(second["client_times"]) == 3


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

"""Device-side privacy defences (``train.defence``): Gaussian noise on smashed data and NoPeek;
off changes nothing, on they act on the device, lower the attack, are seeded, charged by
the clock and give every executor the same run."""

import math

import numpy as np
import pytest
import torch
from torch import nn

import splitfl
from splitfl.config import ConfigError, DefenceConfig, TrainConfig
from splitfl.core.plan import ClientTask
from splitfl.data.base import load_dataset
from splitfl.privacy.metrics import psnr
from splitfl.privacy.reconstruct import unsplit_attack
from splitfl.roles.defences import (
    add_noise,
    clip_rows,
    defence_flops_per_sample,
    distance_correlation,
    gaussian_epsilon,
)
from splitfl.roles.sides import DeviceRole, Runtime
from splitfl.testing import config_for

NOISE = {"train.defence.noise_std": 0.3, "train.defence.noise_clip": 4.0}
DROP = ("wall_time",)


def _rows(run):
    return [{k: v for k, v in row.items() if k not in DROP} for row in run.metrics]


def _model(run):
    return torch.load(run.run_dir / "model.pt", weights_only=True)


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a) and set(a) == set(b)


# ----------------------------------------------------------------------------- mechanisms


def test_clipping_noise_and_epsilon_by_hand():
    t = torch.tensor([[3.0, 4.0], [0.3, 0.4]])
    torch.testing.assert_close(clip_rows(t, 1.0), torch.tensor([[0.6, 0.8], [0.3, 0.4]]))
    a, b = add_noise(t, 0.5, None, seed=9), add_noise(t, 0.5, None, seed=9)
    assert torch.equal(a, b) and not torch.equal(a, t)
    ids = torch.tensor([1, 2])
    noised = add_noise((t, ids), 0.5, 1.0, seed=9)
    assert torch.equal(noised[1], ids)  # integer tensors cross untouched
    # σ = 2, C = 1: z = σ/(2C) = 1; one release, δ = 1e-5: ε = 1/2 + sqrt(2 ln 1e5)
    assert gaussian_epsilon(2.0, 1.0, 1, 1e-5) == pytest.approx(0.5 + math.sqrt(2 * math.log(1e5)))
    orders = np.linspace(1.01, 200, 200_000)  # the closed form is the minimum over α
    grid = float((10 * orders / 2 + math.log(1e5) / (orders - 1)).min())
    assert gaussian_epsilon(2.0, 1.0, 10, 1e-5) == pytest.approx(grid, rel=1e-6)
    cfg = DefenceConfig(nopeek=1.0, noise_std=0.1)
    assert defence_flops_per_sample(cfg, 64, 100, 16) == 5 * 100 + 9 * 16 * (64 + 100)


def test_distance_correlation_by_hand():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(12, 5, generator=gen, dtype=torch.float64)
    assert float(distance_correlation(x, 3 * x + 1)) == pytest.approx(1.0)
    assert float(distance_correlation(x, torch.ones(12, 2, dtype=torch.float64))) == 0.0
    assert float(distance_correlation(x[:1], x[:1])) == 0.0
    z = torch.randn(12, 3, generator=gen, dtype=torch.float64).requires_grad_(True)
    value = distance_correlation(x, z)
    assert 0 < float(value.detach()) < 0.8  # independent draws
    (grad,) = torch.autograd.grad(value, z)
    assert torch.isfinite(grad).all()  # the zero diagonal of the distances gives no NaN


def _role(defence: DefenceConfig, seed=5):
    torch.manual_seed(0)
    part = nn.Sequential(nn.Flatten(), nn.Linear(64, 8)).double()
    x = load_dataset("digits").train.x[:32].double()
    y = torch.zeros(32, dtype=torch.long)
    train = TrainConfig(batch_size=16, lr=0.1, defence=defence)
    task = ClientTask(0, 1, 0, 16, 2, 0.1)
    data = (x, y, np.arange(32))
    return DeviceRole(task, part, None, train, data, seed, Runtime(torch.device("cpu")))


def test_nopeek_adds_alpha_times_the_dcor_gradient_to_the_device_step():
    """SGD (lr 0.1): the NoPeek step differs from the plain one by −lr·α·∇θ DCor(X, f(X))."""
    plain, defended = _role(DefenceConfig()), _role(DefenceConfig(nopeek=2.0))
    x, _ = plain.batch(0)
    expected = torch.autograd.grad(distance_correlation(x, plain.part(x)), plain.part[1].weight)
    fx_a, _ = plain.forward(0)
    fx_b, _ = defended.forward(0)
    assert torch.equal(fx_a, fx_b)  # NoPeek sends the same smashed data
    grad = torch.randn(fx_a.shape, generator=torch.Generator().manual_seed(1), dtype=fx_a.dtype)
    plain.backward(grad)
    defended.backward(grad)
    diff = defended.part[1].weight - plain.part[1].weight
    torch.testing.assert_close(diff, -0.1 * 2.0 * expected[0], rtol=1e-9, atol=1e-12)
    assert float(expected[0].abs().max()) > 1e-3  # the term is there to see


def test_noise_leaves_the_device_and_is_seeded_per_step():
    clean = _role(DefenceConfig())
    noisy = [_role(DefenceConfig(noise_std=0.5)) for _ in range(2)]
    fx, _ = clean.forward(0)
    sent = [r.forward(0)[0] for r in noisy]
    assert torch.equal(sent[0], sent[1])  # from the run's seed
    assert (sent[0] - fx).std() == pytest.approx(0.5, rel=0.1)
    assert not torch.equal(noisy[0].forward(1)[0] - clean.forward(1)[0], sent[0] - fx)
    other_round = _role(DefenceConfig(noise_std=0.5), seed=6).forward(0)[0]
    assert not torch.equal(other_round, sent[0])


def test_noise_lowers_unsplit_at_its_stated_strength():
    """UnSplit on a conv part (as in test_server_attacks): > 30 dB on clean smashed data,
    more than 15 dB less with σ = 0.5 noise after clipping to norm 20."""
    torch.manual_seed(0)
    x = load_dataset("digits").test.x[:8]
    part = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.ReLU())
    clean = part(x).detach()
    noised = add_noise(clean, 0.5, 20.0, seed=0)
    scores = {}
    for name, z in (("clean", clean), ("noised", noised)):
        out = unsplit_attack(part, z, (1, 8, 8), iterations=60, lr=0.1, lambda_tv=0, lambda_l2=0)
        scores[name] = psnr(x, out.inputs)
    assert scores["clean"] > 30
    assert scores["noised"] < scores["clean"] - 15


# ----------------------------------------------------------------------------- in a run


def test_defences_off_leave_a_run_bit_identical(tmp_path, sequential_run):
    """A clip without noise, NoPeek 0: nothing is on, the run is today's, bit for bit."""
    ref = sequential_run(config_for("s2fl", rounds=2))
    off = config_for("s2fl", rounds=2, **{"train.defence.noise_clip": 3.0})
    run = splitfl.run(off, run_dir=tmp_path / "off")
    assert _rows(run) == _rows(ref)
    assert _same(_model(run), _model(ref))


def test_defended_runs_agree_across_executors_and_are_charged(tmp_path, sequential_run):
    """With noise and NoPeek on: vectorized (it runs them on the reference executor) and
    parallel equal sequential bit for bit; the defences change the model, not the bytes,
    and cost simulated time."""
    changes = {**NOISE, "train.defence.nopeek": 1.0}
    runs = {
        ex: splitfl.run(config_for("s2fl", rounds=2, executor=ex, **changes), run_dir=tmp_path / ex)
        for ex in ("sequential", "vectorized", "parallel")
    }
    seq = runs["sequential"]
    for ex in ("vectorized", "parallel"):
        assert _rows(runs[ex]) == _rows(seq), ex
        assert _same(_model(runs[ex]), _model(seq)), ex
    plain = sequential_run(config_for("s2fl", rounds=2))
    assert not _same(_model(seq), _model(plain))
    first = (seq.metrics[0], plain.metrics[0])  # same plan in round 1 (same clock so far)
    assert first[0]["traffic_total"] == first[1]["traffic_total"]
    assert first[0]["cuts"] == first[1]["cuts"]
    assert first[0]["sim_time"] > first[1]["sim_time"]


@pytest.mark.parametrize(
    ("key", "value"),
    [("noise_std", -0.1), ("nopeek", -1.0), ("noise_clip", 0.0)],
)
def test_a_bad_defence_value_is_one_line_naming_it(tmp_path, key, value):
    with pytest.raises(ConfigError, match=f"train.defence.{key}"):
        splitfl.run(config_for("s2fl", **{f"train.defence.{key}": value}), run_dir=tmp_path / "r")
    assert not (tmp_path / "r").exists()


def test_the_u_shaped_clock_charges_the_front_s_defence(tmp_path):
    """U-shaped rounds are priced by their own Eq. (1) (both hops): NoPeek's device FLOPs are
    added there too; the bytes stay the same."""
    runs = {
        name: splitfl.run(config_for("ushaped_sl", rounds=1, **extra), run_dir=tmp_path / name)
        for name, extra in (("plain", {}), ("nopeek", {"train.defence.nopeek": 1.0}))
    }
    plain, nopeek = (r.metrics[0] for r in runs.values())
    assert nopeek["traffic_total"] == plain["traffic_total"]
    assert nopeek["sim_time"] > plain["sim_time"]


@pytest.mark.parametrize(
    ("key", "value"),
    [("noise_std", 1.0), ("nopeek", 1.0), ("dp_noise", 1.0), ("label_noise", "max_norm")],
)
def test_ringsfl_refuses_a_defence_it_would_not_apply(tmp_path, key, value):
    """RingSFL's ring ran these defences neither in the model nor on the clock (the run was
    bit-identical to an undefended one): a defence switched on is refused in one line."""
    with pytest.raises(ConfigError, match=f"train.defence.{key}"):
        splitfl.run(
            config_for("ringsfl", **{f"train.defence.{key}": value}), run_dir=tmp_path / "r"
        )
    assert not (tmp_path / "r").exists()

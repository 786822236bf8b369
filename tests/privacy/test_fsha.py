"""A malicious server's FSHA (Pasquini et al., CCS 2021) against a splitfl device part, and the
client's SplitGuard score (Erdogan et al., WPES 2022) against it and an honest server."""

import json
import math

import numpy as np
import pytest
import torch

from splitfl.cli.main import main
from splitfl.privacy.fsha_run import FshaConfig, prepare_fsha, run_fsha, train_client
from splitfl.privacy.splitguard import (
    SplitGuard,
    _Set,
    angle,
    fake_labels,
    raw_score,
    squash,
)

#: A toy FSHA on the embedded digits (cnn_digits cut 1): the client-architecture pilot, a
#: 16-channel server, learning rates raised from the notebook's (1e-5, 1e-4 over 10 000
#: iterations) to reach far in 300.
TOY = {
    "iterations": 300, "checkpoint_every": 150, "width": 16, "private_samples": 256,
    "eval_samples": 32, "lr_client": 1e-3, "lr_pilot": 1e-3, "lr_discriminator": 1e-3,
    "gradient_penalty": 10.0,
}  # fmt: skip


@pytest.fixture(scope="module")
def toy():
    return run_fsha(FshaConfig(**TOY))


def test_fsha_reconstructs_far_better_than_the_server_s_guesses(toy):
    """After 300 iterations the hijacked client's features decode to its private digits far
    better than the public mean image or uniform noise (the server's guesses without FSHA),
    and better than at the first checkpoint."""
    first, last = toy["fsha"]["checkpoints"]
    guess, noise = toy["baseline"]["public_mean"], toy["baseline"]["noise"]
    assert last["mse"] < 0.5 * guess["mse"] and last["mse"] < 0.2 * noise["mse"]
    assert last["ssim"] > guess["ssim"] + 0.3
    assert last["mse"] < first["mse"]
    assert toy["reconstruction"].shape == toy["true_x"].shape == (32, 1, 8, 8)


def test_splitguard_separates_the_hijacker_from_the_honest_server(toy):
    """Same client, same batches, same fake-batch schedule: the honest server's SG scores
    sit near 1, FSHA's far below (its gradient ignores the labels)."""
    honest, hijacker = toy["honest"], toy["fsha"]
    assert honest["fake_batches"] == hijacker["fake_batches"] > 10
    assert min(honest["splitguard"]) > 0.9
    assert max(hijacker["splitguard"]) < 0.8
    assert hijacker["splitguard_mean"] < 0.5
    assert honest["checkpoints"][-1]["train_loss"] < math.log(10)  # it learnt the task


def test_same_seed_same_numbers_other_seed_other_numbers():
    spec = {**TOY, "iterations": 40, "checkpoint_every": 20, "private_samples": 128}
    a, b = run_fsha(FshaConfig(**spec)), run_fsha(FshaConfig(**spec))
    assert a["fsha"]["checkpoints"] == b["fsha"]["checkpoints"]
    assert a["honest"] == b["honest"] and a["baseline"] == b["baseline"]
    assert torch.equal(a["reconstruction"], b["reconstruction"])
    c = run_fsha(FshaConfig(**spec, seed=1))
    assert c["fsha"]["checkpoints"] != a["fsha"]["checkpoints"]


def test_the_client_never_steps_on_a_fake_batch():
    """With every batch after ``splitguard_start`` a fake, the client's parameters after 30
    iterations are those after its ``start + 1`` regular ones."""
    small = {**TOY, "private_samples": 128, "splitguard_start": 3}
    setup = prepare_fsha(FshaConfig(**small))

    def ones(i, z, y):
        return torch.ones_like(z)

    def trained(iterations: int, p_fake: float) -> list[torch.Tensor]:
        spec = FshaConfig(**{**small, "iterations": iterations, "fake_probability": p_fake})
        seen: list[torch.Tensor] = []

        def keep(i, part):
            seen[:] = [p.detach().clone() for p in part.parameters()]

        train_client(spec, setup, ones, keep)
        return seen

    stepped, faked = trained(4, 0.0), trained(30, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(stepped, faked, strict=True))
    assert not torch.equal(stepped[0], trained(5, 0.0)[0])


# ----------------------------------------------------------------------------- SplitGuard


def _notebook_sg(fakes, r1, r2, mult=5.0, exp=2.0):
    """``label-changing/splitguard.ipynb::sg_score`` restated on lists of numpy vectors."""

    def ang(u, v):
        return np.arccos(np.dot(u / np.linalg.norm(u), v / np.linalg.norm(v)))

    f_mean, c_mean, r_mean = (sum(s) / len(s) for s in (fakes, r1, r2))
    f_mag, c_mag, r_mag = (np.mean([np.linalg.norm(v) for v in s]) for s in (fakes, r1, r2))
    cr_mean, cr_mag = (c_mean + r_mean) / 2, (c_mag + r_mag) / 2
    div = abs(f_mag - cr_mag) + abs(c_mag - r_mag)
    x = ang(f_mean, cr_mean) * abs(f_mag - cr_mag) / div
    x -= ang(c_mean, r_mean) * abs(r_mag - c_mag) / div
    return (1 / (1 + np.exp(-x * mult))) ** exp


def _set(vectors):
    s = _Set()
    for v in vectors:
        s.add(torch.as_tensor(v, dtype=torch.float64))
    return s


def test_splitguard_score_by_hand():
    # F = {(1, 0)}, R1 = {(0, 2)}, R2 = {(0, 4)}: |F| = 1, |R| = 3, |R1| - |R2| = 2, Δ = 4;
    # θ(F, R) = π/2, θ(R1, R2) = 0: x = π/2 · 2/4 = π/4
    f, r1, r2 = _set([[1.0, 0.0]]), _set([[0.0, 2.0]]), _set([[0.0, 4.0]])
    assert raw_score(f, r1, r2) == pytest.approx(math.pi / 4)
    assert squash(math.pi / 4) == pytest.approx((1 / (1 + math.exp(-5 * math.pi / 4))) ** 2)
    # R2 = {(0, -4)}: θ(R1, R2) = π, R = (0, -1) (still ⟂ F): x = π/4 − π/2 = −π/4
    assert raw_score(f, r1, _set([[0.0, -4.0]])) == pytest.approx(-math.pi / 4)
    assert angle(torch.zeros(2), torch.ones(2)) == pytest.approx(math.pi / 2)
    assert raw_score(_set([[1.0, 0.0]]), _set([[0.0, 1.0]]), _set([[1.0, 0.0]])) == 0.0  # Δ = 0


def test_splitguard_running_sums_equal_the_notebook_lists():
    rng = np.random.default_rng(0)
    fakes, r1, r2 = ([rng.normal(size=7) * (k + 1) for _ in range(n)]
                     for k, n in enumerate((3, 5, 4)))  # fmt: skip
    ours = squash(raw_score(_set(fakes), _set(r1), _set(r2)))
    assert ours == pytest.approx(_notebook_sg(fakes, r1, r2), rel=1e-12)


def test_fake_labels_change_every_label_and_the_schedule_waits_for_start():
    y = torch.arange(10).repeat(3)
    gen = np.random.default_rng(0)
    for _ in range(20):
        fake = fake_labels(y, 10, gen)
        assert bool((fake != y).all()) and int(fake.min()) >= 0 and int(fake.max()) <= 9
    with pytest.raises(ValueError, match="2 classes"):
        fake_labels(y, 1, gen)
    guard = SplitGuard(seed=0, p_fake=1.0, start=5)
    assert [guard.fake_now(i) for i in range(8)] == [False] * 6 + [True] * 2


# ----------------------------------------------------------------------------- CLI


def test_cli_mirrors_the_python_api(tmp_path, capsys):
    spec = {**TOY, "iterations": 30, "checkpoint_every": 15, "private_samples": 128}
    argv = [f"--{k.replace('_', '-')}={v}" for k, v in spec.items()]
    assert main(["privacy", "fsha", *argv, "--out", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "results.json").read_text())
    direct = run_fsha(FshaConfig(**spec))
    assert written["fsha"]["checkpoints"] == pytest.approx(direct["fsha"]["checkpoints"])
    assert written["honest"]["splitguard"] == pytest.approx(direct["honest"]["splitguard"])
    assert "SplitGuard mean score" in capsys.readouterr().out
    assert (tmp_path / "grid.png").stat().st_size > 1000


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["--iterations", "0"], "--iterations"),
        (["--lr-client", "-1"], "--lr-client"),
        (["--fake-probability", "1.5"], "--fake-probability"),
        (["--pilot", "mirror"], "--pilot"),
        (["--client-optimizer", "lbfgs"], "--client-optimizer"),
        (["--cut", "9"], "--cut"),
        (["--model", "nope"], "--model"),
        (["--model", "lenet5"], "--model"),  # its 5×5 convolutions do not fit 8×8 digits
        (["--private-samples", "10"], "--private-samples"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(tmp_path, capsys, argv, flag):
    assert main(["privacy", "fsha", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{flag}:" in err, err
    assert not (tmp_path / "out").exists()

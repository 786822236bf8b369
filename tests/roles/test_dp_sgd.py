"""DP-SGD of the device part (``train.defence.dp_noise``, Opacus): each sample's gradient is
clipped on the device part only (by hand), ε is Opacus's accountant's for the run's steps,
off changes nothing, every executor gives the same run, the clock charges it."""

import numpy as np
import pytest
import torch
from opacus.accountants import RDPAccountant
from torch import nn

import splitfl
from splitfl.config import ConfigError, DefenceConfig, TrainConfig
from splitfl.config.parse import load_config
from splitfl.core.plan import ClientTask
from splitfl.experiment.runner import prepare
from splitfl.roles.dp_sgd import dp_epsilon, history_from_rows
from splitfl.roles.sides import DeviceRole, Runtime
from splitfl.testing import config_for

DP = {"model": "mlp", "train.defence.dp_noise": 1.1, "train.defence.dp_clip": 0.5}
DROP = ("wall_time",)


def _rows(run):
    return [{k: v for k, v in row.items() if k not in DROP} for row in run.metrics]


def _model(run):
    return torch.load(run.run_dir / "model.pt", weights_only=True)


def _same(a, b):
    return set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)


def _role(defence: DefenceConfig, lr=0.5):
    torch.manual_seed(0)
    part = nn.Sequential(nn.Flatten(), nn.Linear(3, 2)).double()
    x = torch.randn(4, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    y = torch.zeros(4, dtype=torch.long)
    train = TrainConfig(batch_size=4, lr=lr, defence=defence)
    task = ClientTask(0, 1, 0, 4, 1, lr)
    role = DeviceRole(
        task, part, None, train, (x, y, np.arange(4)), 5, Runtime(torch.device("cpu"))
    )
    return role, x


def _server_grad():
    g = torch.tensor([[0.01, 0.02], [0.5, -0.4], [-0.03, 0.01], [2.0, 1.0]], dtype=torch.float64)
    return g / 4  # the gradient of the batch's mean loss: sample i's share is g_i / B


def test_each_sample_gradient_is_clipped_by_hand():
    """Linear part, B = 4, C = 0.5, σ → 0: the step is −lr·(1/B)·Σ_i min(1, C/‖G_i‖)·G_i
    with G_i = B·(g_i/B)·[x_i, 1] sample i's own gradient (weight and bias); two samples are
    clipped, two are not; the plain step differs."""
    role, x = _role(DefenceConfig(dp_noise=1e-12, dp_clip=0.5))
    w0, b0 = (p.detach().clone() for p in role.part[1].parameters())
    idx = role.batches[0]
    fx, _ = role.forward(0)
    g = _server_grad()
    role.backward(g)
    xs = x[idx]
    per_w = torch.einsum("bo,bi->boi", 4 * g, xs)  # G_i for the weight, [B, out, in]
    per_b = 4 * g
    norms = (per_w.flatten(1).pow(2).sum(1) + per_b.pow(2).sum(1)).sqrt()
    factor = (0.5 / (norms + 1e-6)).clamp(max=1.0)
    assert int((factor < 1).sum()) == 2 and int((factor == 1).sum()) == 2
    step_w = (factor[:, None, None] * per_w).sum(0) / 4
    step_b = (factor[:, None] * per_b).sum(0) / 4
    w, b = role.part[1].parameters()
    torch.testing.assert_close(w.detach(), w0 - 0.5 * step_w, rtol=0, atol=1e-9)
    torch.testing.assert_close(b.detach(), b0 - 0.5 * step_b, rtol=0, atol=1e-9)
    plain, _ = _role(DefenceConfig())
    plain.forward(0)
    plain.backward(g)
    assert (plain.part[1].weight - w).abs().max() > 1e-3
    assert not hasattr(w, "grad_sample")  # the hooks' attributes are gone after the step


def test_one_sample_moves_the_step_by_at_most_two_clips():
    """The per-sample bound as an invariant: replacing one sample's gradient by one 10⁶ times
    larger moves the update by at most lr·2C/B (the noise is the same: same seed)."""
    steps = []
    for scale in (1.0, 1e6):
        role, _ = _role(DefenceConfig(dp_noise=0.7, dp_clip=0.5))
        before = torch.cat([p.detach().flatten().clone() for p in role.part.parameters()])
        role.forward(0)
        g = _server_grad().clone()
        g[3] *= scale
        role.backward(g)
        after = torch.cat([p.detach().flatten() for p in role.part.parameters()])
        steps.append(after - before)
    assert float((steps[0] - steps[1]).norm()) <= 0.5 * 2 * 0.5 / 4 + 1e-9


def test_epsilon_is_opacus_accountant_s_for_the_run_s_steps(tmp_path):
    """The rows' ε per client equals Opacus's RDP accountant over the client's (q = B/n, steps)
    of every round it trained, for δ = dp_delta; q and steps by hand from the data sizes."""
    cfg = config_for("splitfed_v1", rounds=2, **DP, **{"train.defence.dp_delta": 1e-4})
    run = splitfl.run(cfg, run_dir=tmp_path / "r")
    prep = prepare(load_config(run.run_dir / "config.yaml"))
    sizes = [len(ix) for ix in prep.ctx.client_indices]
    seen: dict[int, list] = {}
    for row in run.metrics:
        for c, k, q in zip(row["clients"], row["dp_steps"], row["dp_sample_rates"], strict=True):
            assert q == pytest.approx(16 / sizes[c])
            assert k == -(-sizes[c] // 16)  # one local epoch of batches of 16
            seen.setdefault(c, []).append((q, k))
    last = run.metrics[-1]
    for c, eps in zip(last["clients"], last["dp_epsilon_by_client"], strict=True):
        acc = RDPAccountant()
        for q, k in seen[c]:
            for _ in range(k):
                acc.step(noise_multiplier=1.1, sample_rate=q)
        assert eps == pytest.approx(acc.get_epsilon(1e-4), rel=1e-9)
        assert eps > 0
    assert last["dp_epsilon"] == pytest.approx(
        max(dp_epsilon(1.1, h, 1e-4) for h in history_from_rows(run.metrics).values())
    )


def test_dp_fields_off_leave_a_run_bit_identical(tmp_path, sequential_run):
    """A clip and δ without noise: DP-SGD is off, the run is today's bit for bit."""
    ref = sequential_run(config_for("s2fl", rounds=2))
    off = {"train.defence.dp_clip": 3.0, "train.defence.dp_delta": 1e-3}
    run = splitfl.run(config_for("s2fl", rounds=2, **off), run_dir=tmp_path / "off")
    assert _rows(run) == _rows(ref)
    assert _same(_model(run), _model(ref))
    assert "dp_epsilon" not in run.metrics[-1]


def test_dp_runs_agree_across_executors_are_charged_and_resume(tmp_path):
    """sequential ≡ vectorized (it runs DP on the reference executor) ≡ parallel bit for bit;
    DP-SGD changes the model, not the bytes, and costs simulated time; a resumed run's ε
    equals the uninterrupted run's (rebuilt from the checkpointed rows)."""
    runs = {
        ex: splitfl.run(config_for("s2fl", rounds=2, executor=ex, **DP), run_dir=tmp_path / ex)
        for ex in ("sequential", "vectorized", "parallel")
    }
    seq = runs["sequential"]
    for ex in ("vectorized", "parallel"):
        assert _rows(runs[ex]) == _rows(seq), ex
        assert _same(_model(runs[ex]), _model(seq)), ex
    plain = splitfl.run(config_for("s2fl", rounds=2, model="mlp"), run_dir=tmp_path / "plain")
    assert not _same(_model(seq), _model(plain))
    first = (seq.metrics[0], plain.metrics[0])
    assert first[0]["traffic_total"] == first[1]["traffic_total"]
    assert first[0]["sim_time"] > first[1]["sim_time"]
    one = splitfl.run(config_for("s2fl", rounds=1, **DP), run_dir=tmp_path / "resumed")
    assert one.metrics[-1]["dp_epsilon"] < seq.metrics[-1]["dp_epsilon"]
    resumed = splitfl.resume(tmp_path / "resumed", overrides=["rounds=2"])
    assert _rows(resumed) == _rows(seq)


def test_a_batchnorm_front_and_nopeek_are_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match=r"train.defence.dp_noise: .*BatchNorm"):
        splitfl.run(
            config_for("splitfed_v1", **{"train.defence.dp_noise": 1.0}), run_dir=tmp_path / "a"
        )
    assert not (tmp_path / "a").exists()
    both = {**DP, "train.defence.nopeek": 1.0}
    with pytest.raises(ConfigError, match="train.defence.dp_noise: .*NoPeek"):
        splitfl.run(config_for("splitfed_v1", **both), run_dir=tmp_path / "b")
    with pytest.raises(ConfigError, match="train.defence.dp_delta"):
        splitfl.run(config_for("splitfed_v1", **{**DP, "train.defence.dp_delta": 1.0}))

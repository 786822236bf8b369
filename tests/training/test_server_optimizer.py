"""Server-side optimisers on the aggregated update (issue 34 item 8, ``train.server_optimizer``):
FedAvgM (Hsu et al. 2019) and FedAdagrad/FedYogi/FedAdam (Reddi et al. 2021, Algorithm 2)
by hand, the neutral FedAvgM equal to a run without one, exact resume, one-line refusals."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import yaml

import splitfl
import splitfl.experiment.loop as loop
from splitfl.algorithms import ALGORITHMS
from splitfl.cli.main import main
from splitfl.config import ConfigError, ExperimentConfig, from_dict
from splitfl.experiment.guards import RunInterrupted
from splitfl.experiment.validation import check_config
from splitfl.testing import config_for, tiny_config
from splitfl.training import server_step

F64 = torch.float64
# two steps of a 2-element weight; Δ_t = aggregated − global is (2, −1) then (1, 3)
DELTAS = [(2.0, -1.0), (1.0, 3.0)]


def _opt(name: str) -> SimpleNamespace:
    return SimpleNamespace(name=name, lr=0.5, momentum=0.5, beta1=0.5, beta2=0.5, tau=0.5)


def _two_steps(name: str) -> tuple[list[float], list[int]]:
    """x after step 1 then after step 2 (flat: x1[0], x1[1], x2[0], x2[1]), and the integer
    buffer after each."""
    x = {"w": torch.tensor([0.0, 1.0], dtype=F64), "n": torch.tensor(3)}
    state: dict = {}
    xs, ns = [], []
    for t, delta in enumerate(DELTAS):
        agg = {"w": x["w"] + torch.tensor(delta, dtype=F64), "n": torch.tensor(10 + t)}
        prev, copy = x, {k: v.clone() for k, v in x.items()}
        x, state = server_step(_opt(name), x, agg, state)
        assert all(torch.equal(prev[k], copy[k]) for k in copy)  # pure: writes into nothing
        xs.extend(x["w"].tolist())
        ns.append(int(x["n"]))
    return xs, ns


def test_fedavgm_by_hand():
    # m1 = Δ1 = (2, −1); x1 = (0, 1) + 0.5 m1 = (1, 0.5)
    # m2 = 0.5 m1 + Δ2 = (1 + 1, −0.5 + 3) = (2, 2.5); x2 = x1 + 0.5 m2 = (2, 1.75)
    xs, ns = _two_steps("fedavgm")
    assert xs == pytest.approx([1.0, 0.5, 2.0, 1.75], abs=1e-12)
    assert ns == [10, 11]  # integer buffers keep the aggregate


def _adaptive(v_rule) -> list[float]:
    """Reddi et al. Alg. 2 per element with η = 0.5, β1 = β2 = 0.5, τ = 0.5, v_{−1} = τ²."""
    out = []
    x, m, v = [0.0, 1.0], [0.0, 0.0], [0.25, 0.25]
    for delta in DELTAS:
        for i, d in enumerate(delta):
            m[i] = 0.5 * m[i] + 0.5 * d
            v[i] = v_rule(v[i], d * d)
            x[i] = x[i] + 0.5 * m[i] / (math.sqrt(v[i]) + 0.5)
        out.extend(x)
    return out


def test_fedadagrad_by_hand():
    # element 0: m1 = 1, v1 = 0.25 + 4 = 4.25, x1 = 0.5 / (√4.25 + 0.5)
    xs, ns = _two_steps("fedadagrad")
    assert xs[0] == pytest.approx(0.5 / (math.sqrt(4.25) + 0.5), abs=1e-12)
    # element 1 step 2: m2 = 0.5·(−0.5) + 1.5 = 1.25, v2 = 0.25 + 1 + 9 = 10.25
    x11 = 1 + 0.5 * -0.5 / (math.sqrt(1.25) + 0.5)
    assert xs[3] == pytest.approx(x11 + 0.5 * 1.25 / (math.sqrt(10.25) + 0.5), abs=1e-12)
    assert xs == pytest.approx(_adaptive(lambda v, d2: v + d2), abs=1e-12)
    assert ns == [10, 11]


def test_fedyogi_by_hand():
    # element 0: v1 = 0.25 − 0.5·4·sign(0.25 − 4) = 2.25 (√ = 1.5), x1 = 0.5·1/2 = 0.25;
    # step 2: v1 = 2.25 > Δ² = 1, so v2 = 2.25 − 0.5 = 1.75 (Yogi shrinks v, Adam would not)
    xs, _ = _two_steps("fedyogi")
    assert xs[0] == pytest.approx(0.25, abs=1e-12)
    m2 = 0.5 * 1 + 0.5 * 1
    assert xs[2] == pytest.approx(0.25 + 0.5 * m2 / (math.sqrt(1.75) + 0.5), abs=1e-12)
    sign = lambda a: (a > 0) - (a < 0)  # noqa: E731
    assert xs == pytest.approx(_adaptive(lambda v, d2: v - 0.5 * d2 * sign(v - d2)), abs=1e-12)


def test_fedadam_by_hand():
    # element 0: v1 = 0.5·0.25 + 0.5·4 = 2.125, x1 = 0.5·1 / (√2.125 + 0.5)
    xs, _ = _two_steps("fedadam")
    assert xs[0] == pytest.approx(0.5 / (math.sqrt(2.125) + 0.5), abs=1e-12)
    assert xs == pytest.approx(_adaptive(lambda v, d2: 0.5 * v + 0.5 * d2), abs=1e-12)


def test_none_returns_the_aggregate_itself():
    x = {"w": torch.zeros(2)}
    agg = {"w": torch.ones(2)}
    new, state = server_step(SimpleNamespace(name="none"), x, agg, {})
    assert new is agg and state == {}


def _rows(result) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in result.metrics]


def _model(result) -> dict[str, torch.Tensor]:
    return torch.load(result.run_dir / "model.pt", weights_only=True)


def test_neutral_fedavgm_equals_no_server_optimizer(tmp_path, sequential_run):
    """β = 0, η = 1: x + (x̄ − x) = x̄, the plain aggregate; any other setting moves away."""
    cfg = tiny_config(rounds=3, algorithm="fedavg")
    plain = sequential_run(cfg)
    neutral = {"train.server_optimizer": {"name": "fedavgm", "momentum": 0.0, "lr": 1.0}}
    same = splitfl.run(tiny_config(rounds=3, algorithm="fedavg", **neutral), run_dir=tmp_path / "a")
    assert _rows(same) == _rows(plain)
    a, b = _model(plain), _model(same)
    assert all(torch.equal(a[k], b[k]) for k in a)
    moved = {"train.server_optimizer": {"name": "fedavgm", "momentum": 0.9}}
    other = splitfl.run(tiny_config(rounds=3, algorithm="fedavg", **moved), run_dir=tmp_path / "b")
    assert _rows(other)[-1]["test_loss"] != _rows(plain)[-1]["test_loss"]


@pytest.mark.parametrize("name", ["fedadam", "fedavgm"])
def test_resume_with_a_server_optimizer_is_exact(name, tmp_path, monkeypatch):
    """A Ctrl-C in round 4 of 5 (no periodic checkpoint): the checkpoint holds m (and v) of
    round 3 and the resumed run equals the uninterrupted one."""
    changes = {"output.checkpoint_every": 10, "train.server_optimizer.name": name}
    cfg = tiny_config(rounds=5, algorithm="splitfed_v1", **changes)
    full = splitfl.run(cfg, run_dir=tmp_path / "full")
    real = loop.play_round

    def interrupted(prep, executor, st, r, *args):
        if r == 3:
            raise KeyboardInterrupt
        return real(prep, executor, st, r, *args)

    monkeypatch.setattr(loop, "play_round", interrupted)
    with pytest.raises(RunInterrupted):
        splitfl.run(cfg, run_dir=tmp_path / "cut")
    monkeypatch.setattr(loop, "play_round", real)
    saved = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)
    assert saved["round"] == 3 and saved["server_optimizer"]["m"]
    resumed = splitfl.resume(tmp_path / "cut")
    assert _rows(resumed) == _rows(full)
    a, b = _model(full), _model(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"train.server_optimizer.name": "fedadamw"}, "train.server_optimizer.name: "),
        ({"train.server_optimizer.beta2": 1.0}, "train.server_optimizer.beta2: must be < 1"),
        ({"train.server_optimizer.tau": 0.0}, "train.server_optimizer.tau: must be > 0"),
        ({"train.server_optimizer.bogus": 1}, "train.server_optimizer.bogus: unknown field"),
        (
            {"algorithm": "ifca", "train.server_optimizer.name": "fedadam"},
            "train.server_optimizer: ifca holds K cluster models",
        ),
        (
            {"algorithm": "locfedmix_sl", "train.server_optimizer.name": "fedyogi"},
            "train.server_optimizer: locfedmix_sl keeps each client's device part",
        ),
    ],
)
def test_bad_server_optimizer_is_one_line(changes, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_config(**changes)))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err


@pytest.mark.parametrize("algorithm", ["s2fl", "mergesfl", "parallelsfl", "vanilla_sl"])
def test_algorithms_with_several_server_copies_take_the_step_on_the_one_global_model(
    algorithm, tmp_path
):
    """S²FL's groups, MergeSFL's PS, ParallelSFL's top workers and the SL relay all aggregate
    into one global model: the step covers every float tensor of it (device and server
    parts), and the integer buffers are left out."""
    cfg = config_for(algorithm, rounds=2, **{"train.server_optimizer.name": "fedyogi"})
    run = splitfl.run(cfg, run_dir=tmp_path / "run")
    assert run.summary["status"] == "ok"
    saved = torch.load(run.run_dir / "checkpoints" / "last.pt", weights_only=True)
    floats = {k for k, t in saved["global_state"].items() if t.is_floating_point()}
    assert set(saved["server_optimizer"]["m"]) == floats == set(saved["server_optimizer"]["v"])


def test_every_algorithm_accepts_a_server_optimizer_or_says_why_not():
    for name, cls in ALGORITHMS.items():
        cfg = from_dict(
            ExperimentConfig, config_for(name, **{"train.server_optimizer.name": "fedadam"})
        )
        if cls.no_server_optimizer:
            with pytest.raises(ConfigError, match="^train.server_optimizer: "):
                check_config(cfg)
        else:
            check_config(cfg)
    assert {n for n, c in ALGORITHMS.items() if c.no_server_optimizer} == {"ifca", "locfedmix_sl"}

"""RingSFL privacy: Eq. (8) leakage probability, the DLG attack, observations, and the CLI."""

import argparse
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from splitfl.algorithms.ringsfl import parse_ratios
from splitfl.config import ConfigError
from splitfl.data.base import DatasetNotFoundError, load_dataset
from splitfl.privacy.attack import cosine_similarity, dlg_attack, infer_label
from splitfl.privacy.cli import add_privacy_parser
from splitfl.privacy.experiment import (
    AttackConfig,
    build_attack_model,
    load_attack_config,
    run_attack,
)
from splitfl.privacy.leakage import leakage_curve, leakage_probability, plot_leakage_curve
from splitfl.privacy.observe import (
    gradient_from_update,
    observe_fedavg,
    observe_ringsfl,
    true_gradient,
)

# ----------------------------------------------------------------------------- Eq. (8)


def test_leakage_probability_matches_hand_computed_values():
    # heard_j = 1 - (1-e_j)(1-e'_j) = 0.46, 0.6, 0.72
    p = leakage_probability([0.1, 0.2, 0.3], [0.4, 0.5, 0.6])
    np.testing.assert_allclose(p, [0.1 * 0.6 * 0.72, 0.2 * 0.46 * 0.72, 0.3 * 0.46 * 0.6])
    np.testing.assert_allclose(p, [0.0432, 0.06624, 0.0828])


def test_leakage_edge_cases_and_validation():
    np.testing.assert_allclose(leakage_probability([0.3], [0.9]), [0.3])  # alone: only e_i
    np.testing.assert_allclose(leakage_probability([0.5, 0.0], [0.5, 0.0]), [0.0, 0.0])
    with pytest.raises(ValueError):
        leakage_probability([0.1, 1.2], [0.1, 0.1])
    with pytest.raises(ValueError):
        leakage_probability([0.1, 0.2], [0.1])


def test_leakage_decreases_with_clients(tmp_path):
    curve = leakage_curve([0.1, 0.4], n_max=20)
    assert curve["n"] == list(range(2, 21))
    p = np.array(curve["curves"][0.4])
    assert np.all(np.diff(p) < 0)
    np.testing.assert_allclose(p, 0.4 * 0.64 ** (np.arange(2, 21) - 1))
    assert p[-1] < 1e-3  # "rapidly decreases to a near-zero value" (Fig. 5)
    png = plot_leakage_curve(curve, tmp_path / "fig5.png")
    assert png.stat().st_size > 1000


# ----------------------------------------------------------------------------- DLG


def _digits_mlp(seed=0):
    """The tiny attack setup: mlp with sigmoid activations, U(-0.5, 0.5) init, 8x8 digits."""
    bundle = load_dataset("digits")
    cfg = AttackConfig(model="mlp", dataset="digits", clients=3, lengths="2:1:1", seed=seed)
    model = build_attack_model(cfg, bundle.input_shape, bundle.num_classes)
    return model, bundle.train.x[:3].clone(), bundle.train.y[:3].clone()


@pytest.mark.parametrize("label", ["idlg", "soft"])
def test_dlg_recovers_an_image_from_a_full_gradient(label):
    model, xs, ys = _digits_mlp()
    grads = true_gradient(model, xs[:1], ys[:1])
    assert infer_label(model, grads) == int(ys[0])
    before = [p.detach().clone() for p in model.parameters()]
    result = dlg_attack(
        model, grads, (1, 8, 8), 10, iterations=4, seed=1, true_x=xs[:1], label=label
    )
    assert all(torch.equal(a, p) for a, p in zip(before, model.parameters(), strict=True))
    assert len(result.cosine_history) == len(result.loss_history) > 0
    start = torch.randn((1, 1, 8, 8), generator=torch.Generator().manual_seed(1))
    assert cosine_similarity(xs[:1], start) < 0.3  # starts from the seeded noise ...
    assert result.cosine_history[-1] > 0.9  # ... and recovers the image
    assert cosine_similarity(xs[:1], result.reconstruction) == pytest.approx(
        result.cosine_history[-1]
    )
    assert result.label == [int(ys[0])]
    assert result.loss_history[-1] < 1e-3 * result.loss_history[0]


def test_dlg_is_seeded():
    model, xs, ys = _digits_mlp()
    grads = true_gradient(model, xs[:1], ys[:1])
    runs = [
        dlg_attack(model, grads, (1, 8, 8), 10, iterations=3, seed=4, optimizer="adam")
        for _ in range(2)
    ]
    assert torch.equal(runs[0].reconstruction, runs[1].reconstruction)
    assert runs[0].cosine_history == []  # no true image given


def test_cosine_similarity_is_eq9():
    x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert cosine_similarity(x, 2 * x) == pytest.approx(1.0)
    assert cosine_similarity(x, -x) == pytest.approx(-1.0)
    assert cosine_similarity(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 3.0])) == 0.0


# ----------------------------------------------------------------------------- observations


def test_gradient_from_update_is_exact():
    before = {"a": torch.tensor([1.0, -2.0, 0.5]), "b": torch.tensor([[3.0]])}
    grad = {"a": torch.tensor([0.25, 4.0, -1.0]), "b": torch.tensor([[-2.0]])}
    after = {k: before[k] - 0.5 * grad[k] for k in before}
    out = gradient_from_update(before, after, 0.5)
    assert all(torch.equal(out[k], grad[k]) for k in grad)
    with pytest.raises(ValueError):
        gradient_from_update(before, {"a": after["a"]}, 0.5)


def test_observe_fedavg_gives_the_true_gradient():
    model, xs, ys = _digits_mlp()
    observed = observe_fedavg(model, xs[:1], ys[:1], lr=0.1)
    truth = true_gradient(model, xs[:1], ys[:1])
    for k, g in truth.items():
        torch.testing.assert_close(observed[k], g, rtol=1e-3, atol=1e-5)


def test_observe_ringsfl_single_client_is_the_true_gradient():
    model, xs, ys = _digits_mlp()
    observed = observe_ringsfl(model, xs[:1], ys[:1], [model.num_blocks], lr=0.1)
    truth = true_gradient(model, xs[:1], ys[:1])
    for k, g in truth.items():  # N = 1: a_0 = 1, the blended model is the FedAvg update
        torch.testing.assert_close(observed[k], g, rtol=1e-3, atol=1e-5)


def test_observe_ringsfl_blends_other_clients_gradients():
    model, xs, ys = _digits_mlp()
    # lengths 2:1:1 on 4 blocks: u0 runs blocks 0-1 of its own sample, blocks 2-3 of client 1's
    # and block 1-2 of client 2's (overlap at blocks 1 and 2).
    observed = observe_ringsfl(model, xs, ys, [2, 1, 1], lr=0.1)
    truth = true_gradient(model, xs[:1], ys[:1])
    torch.testing.assert_close(observed["blocks.0.1.weight"], truth["blocks.0.1.weight"])
    for k in ("blocks.1.0.weight", "blocks.2.0.weight", "blocks.3.weight"):
        err = (observed[k] - truth[k]).norm() / truth[k].norm()
        assert err > 0.1, k
    other = true_gradient(model, xs[1:2], ys[1:2])  # block 3 of u0 saw only client 1's sample
    torch.testing.assert_close(observed["blocks.3.weight"], other["blocks.3.weight"])


# ----------------------------------------------------------------------------- experiment + CLI


def _parser():
    parser = argparse.ArgumentParser(prog="splitfl")
    add_privacy_parser(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_leakage_prints_table_and_writes_curve(tmp_path, capsys):
    args = _parser().parse_args(
        ["privacy", "leakage", "--clients", "3", "--e", "0.4", "--out", str(tmp_path)]
    )
    assert args.fn(args) == 0
    out = capsys.readouterr().out
    assert out.count("0.16384") == 3  # 0.4 * 0.64**2
    assert (tmp_path / "leakage.png").stat().st_size > 1000
    data = json.loads((tmp_path / "leakage.json").read_text())
    assert set(data["curve"]["curves"]) == {"0.1", "0.2", "0.4", "0.6"}


@pytest.mark.parametrize(
    "argv,field", [(["--e", "1.5"], "--e"), (["--e", "0.2", "--e-prime", "-0.1"], "--e-prime")]
)
def test_cli_leakage_rejects_bad_probabilities(argv, field, tmp_path):
    args = _parser().parse_args(["privacy", "leakage", *argv, "--out", str(tmp_path)])
    with pytest.raises(ConfigError, match=f"^{field}: must be in"):
        args.fn(args)


def test_attack_config_yaml_and_validation(tmp_path):
    path = tmp_path / "attack.yaml"
    path.write_text("model: mlp\ndataset: digits\nclients: 3\nlengths: 2:1:1\n")
    cfg = load_attack_config(path, ["iterations=7"])
    assert (cfg.lengths, cfg.iterations, cfg.clients) == ("2:1:1", 7, 3)
    with pytest.raises(ConfigError, match="^colour: unknown field"):
        load_attack_config(path, ["colour=3"])
    with pytest.raises(ConfigError, match="^lengths:"):
        load_attack_config(path, ["lengths=2:1"])
    with pytest.raises(ConfigError, match="^optimizer:"):
        load_attack_config(path, ["optimizer=sgd"])
    with pytest.raises(ConfigError, match="^model: lenet5 does not fit"):
        run_attack(AttackConfig(model="lenet5", dataset="digits", clients=3, lengths="1:1:1"))
    with pytest.raises(DatasetNotFoundError):
        run_attack(AttackConfig(root=str(tmp_path)))


def test_paper_attack_config_is_section_4_2_5():
    """RingSFL §4.2.5: LeNet, CIFAR-10, five clients, L0:…:L4 = 3:3:2:2:2 (LeNet's 12 blocks)."""
    path = Path(__file__).parents[2] / "benchmarks/papers/ringsfl/attack_cifar10_lenet5.yaml"
    cfg = load_attack_config(path)
    assert (cfg.model, cfg.dataset, cfg.clients) == ("lenet5", "cifar10", 5)
    model = build_attack_model(cfg, (3, 32, 32), 10)
    assert parse_ratios(cfg.lengths, cfg.clients, model.num_blocks) == [3, 3, 2, 2, 2]


def test_cli_attack_writes_results(tmp_path, capsys):
    path = tmp_path / "attack.yaml"
    path.write_text("model: mlp\ndataset: digits\nclients: 3\nlengths: 2:1:1\n")
    out_dir = tmp_path / "out"
    args = _parser().parse_args(
        ["privacy", "attack", str(path), "iterations=6", "--out", str(out_dir)]
    )
    assert args.fn(args) == 0
    printed = capsys.readouterr().out
    assert "FedAvg" in printed and "RingSFL" in printed
    results = json.loads((out_dir / "results.json").read_text())
    assert (out_dir / "attack.png").stat().st_size > 1000
    assert results["lengths"] == [2, 1, 1]
    fed, ring = results["fedavg"], results["ringsfl"]
    assert len(fed["cosine"]) == 6 and len(fed["reconstruction"][0][0]) == 8
    assert fed["final_cosine"] > 0.9  # FedAvg leaks the image
    assert ring["final_cosine"] < fed["final_cosine"] - 0.2  # the blended model leaks less
    assert fed["gradient_error"] < 1e-3 < 0.1 < ring["gradient_error"]

"""A curious server's attacks on a finished run: ``splitfl privacy reconstruct|labels`` and
their Python twin ``attack_run`` give the same figures; the defence of the run is applied."""

import json

import pytest

import splitfl
from splitfl.cli.main import main
from splitfl.privacy.on_run import RunAttack, attack_run
from splitfl.testing import config_for

PLAIN = {"options.splitfed_v1.cut": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two-round splitfed_v1 runs at cut 1, plain and noised, and a U-shaped run."""
    base = tmp_path_factory.mktemp("attacked")
    noised = {**PLAIN, "train.defence.noise_std": 2.0, "train.defence.noise_clip": 20.0}
    configs = {
        "plain": config_for("splitfed_v1", rounds=2, **PLAIN),
        "noised": config_for("splitfed_v1", rounds=2, **noised),
        "ushaped": config_for("ushaped_sl", rounds=2),
        "marvell": config_for(
            "ushaped_sl",
            rounds=2,
            **{"train.defence.label_noise": "marvell", "train.defence.marvell_s": 4.0},
        ),
    }
    return {name: splitfl.run(cfg, run_dir=base / name).run_dir for name, cfg in configs.items()}


def _scores(result):
    return {k: v for k, v in result.items() if k not in ("true_x", "reconstruction", "spec")}


def test_cli_reconstruct_mirrors_the_python_api(runs, tmp_path, capsys):
    argv = ["--attack", "unsplit", "--samples", "8", "--iterations", "60"]
    assert main(["privacy", "reconstruct", str(runs["plain"]), *argv, "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    written = json.loads((tmp_path / "results.json").read_text())
    direct = attack_run(RunAttack(str(runs["plain"]), "unsplit", samples=8, iterations=60))
    assert {k: written[k] for k in _scores(direct)} == pytest.approx(_scores(direct))
    assert written["cut"] == 1 and written["samples"] == 8
    assert f"PSNR {direct['psnr']:.2f} dB" in printed
    assert (tmp_path / "grid.png").stat().st_size > 1000


def test_the_run_s_noise_defence_lowers_the_reconstruction(runs):
    spec = {"attack": "unsplit", "samples": 8, "iterations": 150, "lambda_l2": 0.0}
    plain = attack_run(RunAttack(str(runs["plain"]), **spec))
    noised = attack_run(RunAttack(str(runs["noised"]), **spec))
    assert plain["client"] == noised["client"]  # same victim, same samples
    assert noised["psnr"] < plain["psnr"] - 3


def test_inverse_network_on_a_run(runs):
    out = attack_run(RunAttack(str(runs["plain"]), "inverse", samples=8, epochs=3, aux_samples=256))
    assert out["reconstruction"].shape == out["true_x"].shape
    assert out["mse"] < 0.5  # the inputs span [-1, 1]: a constant guess of 0 scores ~0.5


def test_cli_labels_on_a_u_shaped_run(runs, tmp_path, capsys):
    argv = ["privacy", "labels", str(runs["ushaped"]), "--samples", "64", "--out", str(tmp_path)]
    assert main(argv) == 0
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["tail"] > written["cut"]
    assert written["auc_direction"] > 0.9  # labels leak through the head's gradients
    assert "AUC norm" in capsys.readouterr().out


def test_the_label_attack_reads_the_gradients_the_device_sends(runs):
    """Under ``train.defence.label_noise`` the server receives perturbed head gradients: the
    attack on the final model scores those, not the raw ones (before, Marvell showed no effect)."""
    plain = attack_run(RunAttack(str(runs["ushaped"]), "labels", samples=64))
    marvell = attack_run(RunAttack(str(runs["marvell"]), "labels", samples=64))
    assert plain["client"] == marvell["client"] and plain["positives"] == marvell["positives"]
    assert plain["auc_direction"] > 0.95
    assert marvell["auc_direction"] < 0.85


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["labels", "PLAIN"], "attack"),  # not a U-shaped run
        (["reconstruct", "PLAIN", "--samples", "0"], "samples"),
        (["reconstruct", "PLAIN", "--cut", "9"], "cut"),
        (["reconstruct", "MISSING"], "run_dir"),
    ],
)
def test_bad_attack_arguments_are_one_line(runs, tmp_path, capsys, argv, field):
    paths = {"PLAIN": str(runs["plain"]), "MISSING": str(tmp_path / "nothing")}
    argv = [paths.get(a, a) for a in argv]
    assert main(["privacy", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err
    assert not (tmp_path / "out").exists()

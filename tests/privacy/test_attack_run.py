"""A curious server's attacks on a finished run: ``splitfl privacy reconstruct|labels`` and
their Python twin ``attack_run`` give the same figures; the defence of the run is applied."""

import json
import shutil

import pytest
import torch

import splitfl
from splitfl.cli.main import build_parser, main
from splitfl.privacy.cli import _spec
from splitfl.privacy.on_run import RunAttack, attack_recorded, attack_run
from splitfl.testing import config_for

PLAIN = {"options.splitfed_v1.cut": 1}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two-round splitfed_v1 runs at cut 1, plain, noised and recorded (round 1), and a
    U-shaped run."""
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
        "recorded": config_for("splitfed_v1", rounds=2, **PLAIN, **{"privacy.record.rounds": [1]}),
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


ESTIMATED = ["--device-part", "estimated", "--model-iters", "2", "--input-iters", "3",
             "--lambda-tv", "0.2", "--lambda-l2", "0"]  # fmt: skip


def test_the_estimated_part_flags_reach_run_attack():
    args = build_parser().parse_args(["privacy", "reconstruct", "RUN", *ESTIMATED])
    assert _spec(args, args.attack) == RunAttack(
        "RUN", "unsplit", device_part="estimated", model_iters=2, input_iters=3,
        lambda_tv=0.2, lambda_l2=0.0,
    )  # fmt: skip
    plain = build_parser().parse_args(["privacy", "reconstruct", "RUN"])
    assert _spec(plain, plain.attack) == RunAttack("RUN", "unsplit")  # known, as before


def test_cli_estimated_device_part_mirrors_the_python_api(runs, tmp_path, capsys):
    """``--device-part estimated``: a re-drawn part fitted by model stealing, its result in
    the test split's range; the same figures as ``attack_run``, not those of the known part."""
    argv = ["--samples", "4", "--iterations", "20", *ESTIMATED, "--out", str(tmp_path)]
    assert main(["privacy", "reconstruct", str(runs["plain"]), *argv]) == 0
    assert "unsplit (estimated device part) on client" in capsys.readouterr().out
    written = json.loads((tmp_path / "results.json").read_text())
    options = {"samples": 4, "iterations": 20, "model_iters": 2, "input_iters": 3,
               "lambda_tv": 0.2, "lambda_l2": 0.0}  # fmt: skip
    direct = attack_run(RunAttack(str(runs["plain"]), device_part="estimated", **options))
    assert {k: written[k] for k in _scores(direct)} == pytest.approx(_scores(direct))
    assert written["spec"]["device_part"] == "estimated"
    known = attack_run(RunAttack(str(runs["plain"]), **options))
    assert not torch.equal(known["reconstruction"], direct["reconstruction"])
    assert float(direct["reconstruction"].min()) == pytest.approx(-1.0)  # the digits' range
    assert float(direct["reconstruction"].max()) == pytest.approx(1.0)


def test_the_estimated_part_on_recorded_tensors(runs, tmp_path):
    """``--recorded`` with an estimated part: the recorded smashed data, inverted with a
    re-drawn part: the recorded part's weights do not matter (shifted, the known-part
    attack changes, the estimated one does not)."""
    options = {"samples": 4, "iterations": 10}
    out = attack_recorded(runs["recorded"], round=1, device_part="estimated", **options)
    assert out["round"] == 1 and out["reconstruction"].shape == out["true_x"].shape
    shifted = tmp_path / "shifted"
    shutil.copytree(runs["recorded"], shifted)
    path = shifted / "cut_record" / "round_0001.pt"
    tensors = torch.load(path, weights_only=True)
    for key, value in tensors.items():
        if key.startswith("part.") and value.is_floating_point():
            tensors[key] = value + 0.5
    torch.save(tensors, path)
    again = attack_recorded(shifted, round=1, device_part="estimated", **options)
    assert torch.equal(again["reconstruction"], out["reconstruction"])
    known = attack_recorded(runs["recorded"], round=1, **options)
    moved = attack_recorded(shifted, round=1, **options)
    assert not torch.equal(known["reconstruction"], moved["reconstruction"])
    argv = ["privacy", "reconstruct", str(runs["recorded"]), "--recorded", "--samples", "4",
            "--iterations", "10", "--device-part", "estimated", "--out", str(tmp_path)]  # fmt: skip
    assert main(argv) == 0
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["ssim"] == pytest.approx(out["ssim"]) and written["round"] == 1


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
        (["reconstruct", "PLAIN", "--device-part", "guessed"], "device_part"),
        (
            ["reconstruct", "PLAIN", "--device-part", "estimated", "--attack", "inverse"],
            "device_part",
        ),
        (
            ["reconstruct", "PLAIN", "--device-part", "estimated", "--model-iters", "0"],
            "model_iters",
        ),
        (["reconstruct", "PLAIN", "--model-iters", "-1"], "model_iters"),
        (["reconstruct", "PLAIN", "--input-iters", "0"], "input_iters"),
    ],
)
def test_bad_attack_arguments_are_one_line(runs, tmp_path, capsys, argv, field):
    paths = {"PLAIN": str(runs["plain"]), "MISSING": str(tmp_path / "nothing")}
    argv = [paths.get(a, a) for a in argv]
    assert main(["privacy", *argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and field in err
    assert not (tmp_path / "out").exists()

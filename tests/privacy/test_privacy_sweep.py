"""``splitfl privacy eval SWEEP.yaml`` and its Python twin ``evaluate_sweep``: VFLAIR's DCS by
hand, a tiny sweep end to end (per-device rows for S²FL), validation before anything runs."""

import json
import math

import pytest
import torch
import yaml

from splitfl.cli.main import main
from splitfl.config import ConfigError
from splitfl.config.parse import load_config
from splitfl.experiment.runner import prepare
from splitfl.metrics.records import read_metrics
from splitfl.privacy.on_run import RunAttack, attack_recorded, attack_run
from splitfl.privacy.sweep import cells, dcs, evaluate_sweep, load_sweep, t_dcs
from splitfl.roles.cut_record import read_record
from splitfl.testing import config_for


def test_dcs_by_hand():
    # AP 0.6, MP 0.8 against MP* 0.9, beta 0.5: D = sqrt(0.5*0.36 + 0.5*0.01) = sqrt(0.185)
    assert dcs(0.6, 0.8, 0.9, 0.5) == pytest.approx(1 / (1 + math.sqrt(0.185)))
    assert dcs(0.0, 0.9, 0.9) == 1.0  # the ideal defence
    assert dcs(1.0, 0.9, 0.9, beta=0.0) == 0.5  # beta 0: AP alone, D = 1
    assert dcs(0.0, 0.5, 0.9, beta=1.0) == pytest.approx(1 / 1.4)  # beta 1: MP alone


def test_t_dcs_averages_per_attack_type():
    cell = {"algorithm": "a", "cut_option": None, "defence": "none"}
    rows = [
        {**cell, "attack": "unsplit", "dcs": 0.2},
        {**cell, "attack": "inverse", "dcs": 0.6},
        {**cell, "attack": "labels", "dcs": 0.9},
        {**cell, "attack": "labels", "dcs": None},
    ]
    assert t_dcs(rows) == pytest.approx(
        {"a|None|none|reconstruction": 0.4, "a|None|none|labels": 0.9}
    )


#: A base config recording rounds 1 and 2 of 2 (``privacy.record``: every selected client,
#: one mini-batch each).
RECORDING = config_for("splitfed_v1", rounds=2, **{"privacy.record.rounds": [1, 2]})


def _sweep(tmp_path, **changes):
    return {
        "base": config_for("splitfed_v1", rounds=1),
        "algorithms": ["splitfed_v1", "s2fl"],
        "defences": {
            "none": {},
            "noise": {"train.defence.noise_std": 2.0, "train.defence.noise_clip": 20.0},
        },
        "attacks": {"unsplit": {"iterations": [20, 40]}},
        "samples": 4,
        "out": str(tmp_path / "sweep"),
        **changes,
    }


def test_tiny_sweep_end_to_end(tmp_path, capsys):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(_sweep(tmp_path)))
    assert main(["privacy", "eval", str(path)]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("cell ")]
    assert [line.split(" ", 2)[1] for line in lines] == ["1/4", "2/4", "3/4", "4/4"]
    out = tmp_path / "sweep"
    table = json.loads((out / "table.json").read_text())
    assert (out / "privacy_utility.png").stat().st_size > 1000
    assert "| algorithm |" in (out / "table.md").read_text()
    rows = table["rows"]
    assert {(r["algorithm"], r["defence"]) for r in rows} == {
        (a, d) for a in ("splitfed_v1", "s2fl") for d in ("none", "noise")
    }
    for r in rows:
        assert 0 <= r["ap"] <= 1 and r["params"]["iterations"] in (20, 40)
        assert 0 < r["dcs"] <= 1 and r["mp"] is not None
    s2fl = [r for r in rows if r["algorithm"] == "s2fl" and r["defence"] == "none"]
    assert len(s2fl) == len({r["device"] for r in s2fl}) > 1  # one row per device
    # the undefended cell is its own MP*: its DCS depends on AP alone
    for r in rows:
        if r["defence"] == "none":
            assert r["dcs"] == pytest.approx(1 / (1 + math.sqrt(0.5) * r["ap"]))
    assert table["t_dcs"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"algoritms": ["s2fl"]}, "algoritms"),
        ({"attacks": {"dlg": {}}}, "attacks.dlg"),
        ({"attacks": {"unsplit": {"lr": 0.1}}}, "attacks.unsplit.lr"),
        ({"attacks": {"unsplit": {"run_dir": ["x"]}}}, "attacks.unsplit.run_dir"),
        ({"attacks": {"unsplit": {"device_part": ["estimated"]}}}, "attacks.unsplit.device_part"),
        ({"attacks": {"unsplit_guessed": {}}}, "attacks.unsplit_guessed"),
        ({"defences": {"none": {}, "bad": {"train.defence.noise_sd": 1.0}}}, "noise_sd"),
        ({"beta": 2}, "beta"),
        ({"reference": "nothing"}, "reference"),
        ({"attacks": {"unsplit": {"round": [1]}}}, "attacks.unsplit.round"),
        ({"attacks": {"unsplit": {"recorded": [True]}}}, "attacks.unsplit.recorded"),
        ({"target": "everything"}, "target"),
        ({"target": "recorded"}, "target"),  # the base config records nothing
        ({"rounds": [1]}, "rounds"),  # with the final model
        ({"target": "recorded", "rounds": [0], "base": RECORDING}, "rounds"),
        ({"target": "recorded", "rounds": [1, 1], "base": RECORDING}, "rounds"),
        ({"target": "recorded", "rounds": [3], "base": RECORDING}, "rounds"),  # unrecorded
        ({"target": "recorded", "algorithms": ["parallelsfl"], "base": RECORDING}, "record"),
    ],
)
def test_a_bad_field_is_named_before_anything_runs(tmp_path, capsys, change, field):
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(_sweep(tmp_path, **change)))
    assert main(["privacy", "eval", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert field in err and len(err.splitlines()) == 1
    assert not (tmp_path / "sweep").exists()
    with pytest.raises(ConfigError):
        load_sweep(path)


def test_the_estimated_part_unsplit_in_a_tiny_sweep(tmp_path):
    """``unsplit_estimated``: UnSplit with a re-drawn device part (the architecture-only
    server), tuned over its grid; each row's AP is the SSIM of that attack at its best
    grid point, recomputed here, and a reconstruction row of T-DCS."""
    grid = {"iterations": [10], "model_iters": [1, 2]}
    sweep = _sweep(
        tmp_path, algorithms=["splitfed_v1"], defences={"none": {}}, samples=2,
        attacks={"unsplit": {"iterations": [10]}, "unsplit_estimated": grid},
    )  # fmt: skip
    result = evaluate_sweep(sweep)
    rows = [r for r in result["rows"] if r["attack"] == "unsplit_estimated"]
    assert rows and len(rows) == len([r for r in result["rows"] if r["attack"] == "unsplit"])
    run_dir = tmp_path / "sweep" / "runs" / "splitfed_v1-cutNone-none"
    for r in rows[:2]:
        assert r["params"]["model_iters"] in (1, 2)
        spec = RunAttack(str(run_dir), client=r["device"], cut=r["cut"], samples=2,
                         device_part="estimated", **r["params"])  # fmt: skip
        assert r["ap"] == pytest.approx(min(1.0, max(0.0, attack_run(spec)["ssim"])))
    assert "splitfed_v1|None|none|reconstruction" in result["t_dcs"]


def test_python_api_takes_a_mapping(tmp_path):
    result = evaluate_sweep(_sweep(tmp_path, algorithms=["splitfed_v1"], defences={"none": {}}))
    assert {r["defence"] for r in result["rows"]} == {"none"}


def test_the_documented_sweep_file_validates():
    sweep = load_sweep("examples/privacy_sweep.yaml")
    assert sweep.algorithms == ["splitfed_v1", "s2fl"] and sweep.reference == "none"


def test_the_tutorial_sweep_file_validates():
    sweep = load_sweep("examples/privacy_tutorial.yaml")
    assert sweep.algorithms == ["splitfed_v1", "s2fl", "ushaped_sl"]
    assert set(sweep.defences) == {"none", "nopeek", "noise"}


def test_a_non_empty_out_folder_is_refused_before_anything_runs(tmp_path, capsys):
    (tmp_path / "sweep").mkdir()
    (tmp_path / "sweep" / "table.md").write_text("an earlier sweep\n")
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(_sweep(tmp_path)))
    assert main(["privacy", "eval", str(path)]) == 2
    assert "out" in capsys.readouterr().err
    assert [p.name for p in (tmp_path / "sweep").iterdir()] == ["table.md"]


def test_mergesfl_and_parallelsfl_get_a_row_per_device_with_its_batch_and_cluster(tmp_path):
    """Issue 53: MergeSFL's heterogeneous batches and ParallelSFL's clusters, as S²FL's cuts:
    one row per device of the last round, each with that device's batch size and cluster as
    the run's metrics row lists them (same order as its ``clients``)."""
    sweep = _sweep(
        tmp_path,
        algorithms=["mergesfl", "parallelsfl"],
        defences={"none": {}},
        attacks={"unsplit": {"iterations": [5]}},
        samples=2,
    )
    rows = evaluate_sweep(sweep)["rows"]
    for alg, column in (("mergesfl", "plan_batch_sizes"), ("parallelsfl", "groups")):
        run_dir = tmp_path / "sweep" / "runs" / f"{alg}-cutNone-none"
        last = read_metrics(run_dir / "metrics.jsonl")[-1]
        mine = [r for r in rows if r["algorithm"] == alg]
        assert [r["device"] for r in mine] == last["clients"]
        key = "batch_size" if column == "plan_batch_sizes" else "group"
        assert [r[key] for r in mine] == last[column]
    assert len({r["group"] for r in rows if r["algorithm"] == "parallelsfl"}) > 1  # clusters
    assert len({r["batch_size"] for r in rows if r["algorithm"] == "mergesfl"}) > 1
    assert all(r["batch_size"] is None for r in rows if r["algorithm"] == "parallelsfl")


def test_the_cifar10_sweep_file_validates():
    """The CIFAR-10-subset sweep the tutorial quotes: the issue's algorithms × defences ×
    attacks (DP-SGD and the inverse network among them)."""
    sweep = load_sweep("examples/privacy_cifar10.yaml")
    assert sweep.algorithms == ["splitfed_v1", "s2fl", "mergesfl", "ushaped_sl"]
    assert set(sweep.defences) == {"none", "nopeek", "noise", "dp_sgd", "max_norm", "marvell"}
    assert sweep.only == {"max_norm": ["ushaped_sl"], "marvell": ["ushaped_sl"]}
    assert len(list(cells(sweep))) == 4 * 4 + 2
    assert set(sweep.attacks) == {"unsplit", "inverse", "labels"}
    assert sweep.base["data"]["dataset"] == "cifar10"


def test_the_cifar10_label_sweep_file_validates_and_shares_the_base_run():
    """The 64-sample label sweep the tutorial quotes: the U-shaped cells of the sweep above
    (the same base run but for its algorithm), label inference only."""
    labels, full = (
        load_sweep("examples/privacy_cifar10_labels.yaml"),
        load_sweep("examples/privacy_cifar10.yaml"),
    )
    assert labels.algorithms == ["ushaped_sl"] and set(labels.attacks) == {"labels"}
    assert set(labels.defences) == {"none", "max_norm", "marvell"}
    assert all(labels.defences[d] == full.defences[d] for d in labels.defences)
    assert {**labels.base, "algorithm": None} == {**full.base, "algorithm": None}
    assert labels.samples == 64


def test_the_cifar10_resnet8_sweep_file_validates_and_shares_the_base_run():
    """The ResNet-8 sweep the tutorial quotes: the LeNet-5 sweep's base run but for its model,
    its smashed-data defences but DP-SGD (BatchNorm) and its reconstruction attacks."""
    resnet, full = (
        load_sweep("examples/privacy_cifar10_resnet8.yaml"),
        load_sweep("examples/privacy_cifar10.yaml"),
    )
    assert resnet.base["model"] == "resnet8"
    assert {**resnet.base, "model": None} == {**full.base, "model": None}
    assert resnet.algorithms == ["splitfed_v1", "s2fl"] and set(resnet.attacks) == {
        "unsplit",
        "inverse",
    }
    assert all(resnet.defences[d] == full.defences[d] for d in ("none", "nopeek", "noise"))
    assert set(resnet.defences) == {"none", "nopeek", "noise"}


def test_the_plot_judges_each_defence_by_its_most_leaking_device_and_best_attack():
    """One point per (algorithm, defence): the largest attack performance over its devices
    and attacks of the panel (by hand), labels apart from reconstruction."""
    from splitfl.privacy.sweep_report import worst_cases

    def row(device, attack, ap, defence="none"):
        return {"algorithm": "s2fl", "defence": defence, "device": device, "attack": attack,
                "ap": ap, "mp": 0.3}  # fmt: skip

    rows = [row(0, "unsplit", 0.54), row(0, "inverse", 0.49), row(2, "unsplit", 0.09)]
    rows += [row(1, "inverse", 0.02, "noise"), row(1, "labels", None), row(3, "labels", 0.9)]
    assert worst_cases(rows, ("unsplit", "inverse")) == {
        ("s2fl", "none"): (0.54, 0.3),
        ("s2fl", "noise"): (0.02, 0.3),
    }
    assert worst_cases(rows, ("labels",)) == {("s2fl", "none"): (0.9, 0.3)}


def test_a_cell_s_progress_line_names_its_most_leaked_device():
    """One line per finished cell (stderr of ``splitfl privacy eval``), by hand."""
    from splitfl.privacy.sweep import cell_line

    base = {"algorithm": "s2fl", "cut_option": None, "defence": "noise", "mp": 0.3081}
    rows = [{**base, "device": 0, "attack": "unsplit", "ap": 0.02},
            {**base, "device": 1, "attack": "inverse", "ap": 0.095},
            {**base, "device": 1, "attack": "labels", "ap": None}]  # fmt: skip
    assert cell_line(3, 16, rows, 90.0) == (
        "cell 3/16 s2fl cut=None noise: acc 0.308, most leaked inverse 0.095 on device 1 (1.5 min)"
    )


def test_a_label_defence_runs_only_with_the_algorithms_only_names(tmp_path):
    """``only``: max-norm/Marvell perturb the head gradients of a U-shaped device; a sweep
    naming them with SplitFed V1 is refused before anything runs unless ``only`` restricts
    them, and then they run with the U-shaped algorithm alone and lower its label leak."""
    sweep = _sweep(
        tmp_path,
        base=config_for("ushaped_sl", rounds=2, **{"data.partition": "iid"}),
        algorithms=["splitfed_v1", "ushaped_sl"],
        defences={
            "none": {},
            "marvell": {"train.defence.label_noise": "marvell", "train.defence.marvell_s": 4.0},
        },
        attacks={"labels": {}},
        samples=32,
    )
    with pytest.raises(ConfigError, match=r"defences\.marvell: with splitfed_v1: .*only\.marvell"):
        load_sweep(sweep)
    assert not (tmp_path / "sweep").exists()
    with pytest.raises(ConfigError, match=r"only\.none"):
        load_sweep({**sweep, "only": {"none": ["ushaped_sl"]}})
    with pytest.raises(ConfigError, match=r"only\.marvell: 's2fl'"):
        load_sweep({**sweep, "only": {"marvell": ["s2fl"]}})
    rows = evaluate_sweep({**sweep, "only": {"marvell": ["ushaped_sl"]}})["rows"]
    cells = {(r["algorithm"], r["defence"]) for r in rows}
    assert cells == {("splitfed_v1", "none"), ("ushaped_sl", "none"), ("ushaped_sl", "marvell")}
    u = [r for r in rows if r["algorithm"] == "ushaped_sl"]
    assert all(r["ap"] is not None for r in u), [r.get("note") for r in u]
    leak = {d: [r["ap"] for r in u if r["defence"] == d] for d in ("none", "marvell")}
    mean = {d: sum(aps) / len(aps) for d, aps in leak.items()}
    assert min(leak["none"]) > 0.95 and mean["marvell"] < mean["none"] - 0.1  # 1.0 vs 0.80


def test_the_label_defence_sweep_file_validates():
    sweep = load_sweep("examples/privacy_label_defences.yaml")
    assert list(cells(sweep)) == [
        ("splitfed_v1", None, "none"),
        ("ushaped_sl", None, "none"),
        ("ushaped_sl", None, "max_norm"),
        ("ushaped_sl", None, "marvell"),
    ]


def test_the_recorded_target_attacks_what_the_server_received(tmp_path):
    """``target: recorded``: each device the record holds in each named round is attacked on
    its recorded tensors: the row's AP is :func:`attack_recorded`'s on that round (the one
    path), whose true inputs are the recorded batch's samples (by its recorded indices),
    and it differs from the final model's attack on the same device (a round-1 part, other
    samples); a round the record does not name is refused before anything runs."""
    grid = {"unsplit": {"iterations": [20]}}
    sweep = _sweep(tmp_path, base=RECORDING, algorithms=["splitfed_v1"], defences={"none": {}},
                   attacks=grid, target="recorded", rounds=[1])  # fmt: skip
    rows = evaluate_sweep(sweep)["rows"]
    run_dir = tmp_path / "sweep" / "runs" / "splitfed_v1-cutNone-none"
    record = [b for b in read_record(run_dir) if b.round == 1]
    first = read_metrics(run_dir / "metrics.jsonl")[0]
    assert [r["device"] for r in rows] == first["clients"]  # every client of round 1
    assert {r["round"] for r in rows} == {1} and all(r["ap"] is not None for r in rows)
    bundle = prepare(load_config(run_dir / "config.yaml")).ctx.bundle
    for r in rows:
        mine = [b for b in record if b.client == r["device"]]
        assert r["cut"] == mine[0].cut
        out = attack_recorded(run_dir, round=1, client=r["device"], samples=4, iterations=20)
        assert r["ap"] == min(1.0, max(0.0, out["ssim"]))
        assert torch.equal(out["true_x"], bundle.train.x[mine[0].indices[:4]])
        spec = RunAttack(str(run_dir), client=r["device"], cut=r["cut"], samples=4, iterations=20)
        final = attack_run(spec)
        assert out["ssim"] != final["ssim"]
    assert "| round |" in (tmp_path / "sweep" / "table.md").read_text()
    with pytest.raises(ConfigError, match=r"^rounds: round 3 is not recorded"):
        load_sweep({**sweep, "rounds": [3], "out": str(tmp_path / "other")})
    assert not (tmp_path / "other").exists()


def test_the_recorded_target_scores_labels_on_the_recorded_head_gradients(tmp_path):
    """U-shaped, ``target: recorded``: the label attack of each recorded device scores the
    head gradients the device sent in that round, as ``attack_recorded(..., "labels")`` does
    (AP: the larger AUC); the final-model target's AUCs on the same device differ."""
    base = config_for("ushaped_sl", rounds=2, **{"data.partition": "iid",
                                                 "privacy.record.rounds": [1, 2]})  # fmt: skip
    sweep = _sweep(tmp_path, base=base, algorithms=["ushaped_sl"], defences={"none": {}},
                   attacks={"labels": {}}, samples=16, target="recorded", rounds=[2])  # fmt: skip
    rows = evaluate_sweep(sweep)["rows"]
    run_dir = tmp_path / "sweep" / "runs" / "ushaped_sl-cutNone-none"
    assert rows and all(r["round"] == 2 for r in rows)
    scored = [r for r in rows if r["ap"] is not None]  # a batch without class 1 is not scored
    assert scored and all("positive" in r["note"] for r in rows if r["ap"] is None)
    differs = 0
    for r in scored:
        out = attack_recorded(run_dir, "labels", round=2, client=r["device"], samples=16)
        assert r["ap"] == max(out["auc_norm"], out["auc_direction"])
        spec = RunAttack(str(run_dir), "labels", client=r["device"], cut=r["cut"], samples=16)
        final = attack_run(spec)
        differs += (out["auc_norm"], out["auc_direction"]) != (
            final["auc_norm"], final["auc_direction"])  # fmt: skip
    assert differs > 0


def test_a_networked_cell_attacks_what_arrived_on_the_wire_as_the_sequential_cell_does(
    tmp_path,
):
    """``target: recorded`` over a networked base run (two device processes, ``network.trust:
    trusted``: plain mean, the sequential run's numbers): every row — the recorded clients,
    their cuts, the attack's score and the final accuracy — equals the sequential cell's;
    the networked server records what arrived on the wire (tests/privacy/test_cut_record.py)."""
    grid = {"unsplit": {"iterations": [20]}}
    networked = {"network.devices": 2, "network.trust": "trusted"}
    over_the_wire = config_for(
        "splitfed_v1", rounds=2, executor="networked", **{"privacy.record.rounds": [1, 2]},
        **networked,
    )  # fmt: skip
    rows = {}
    for name, base in (("seq", RECORDING), ("net", over_the_wire)):
        one = {"algorithms": ["splitfed_v1"], "defences": {"none": {}}, "attacks": grid}
        sweep = _sweep(tmp_path / name, base=base, target="recorded", rounds=[1], **one)
        rows[name] = evaluate_sweep(sweep)["rows"]
    keys = ("round", "device", "cut", "attack", "ap", "mp")
    assert rows["seq"] and [[r[k] for k in keys] for r in rows["net"]] == [
        [r[k] for k in keys] for r in rows["seq"]
    ]

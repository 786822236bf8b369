"""The command line: bad input exits 2 with one line and writes nothing; commands work."""

import subprocess
import sys

import pytest
import yaml

from conftest import tiny_config
from splitfl.cli.main import main
from splitfl.config import ConfigError, load_config
from splitfl.metrics.summary import comparison_table, summarize


def _write(tmp_path, data):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


BAD = [
    ({"algorithm": "nope"}, "algorithm: unknown 'nope'"),
    ({"model": "resnet99"}, "model: unknown 'resnet99'"),
    ({"data.alpha": 0}, "data.alpha: must be > 0"),
    ({"data.alpha": -1.5}, "data.alpha: must be > 0"),
    ({"data.num_clients": 5000}, "data.num_clients:"),
    ({"train.clients_per_round": 50}, "train.clients_per_round: must be in [1, data.num_clients"),
    ({"train.lr": -0.1}, "train.lr: must be > 0"),
    ({"data.partition": "zipf"}, "data.partition: unknown 'zipf'"),
    ({"devices.preset": "mars"}, "devices.preset: unknown 'mars'"),
    ({"data.colour": 3}, "data.colour: unknown field"),
    ({"rounds": "many"}, "rounds: expected an integer"),
    ({"algorithm": "splitfed_v1", "options.splitfed_v1.cut": 9}, "options.splitfed_v1.cut:"),
    ({"options.s2fl.group_loss": "max"}, "options.s2fl.group_loss: allowed: mean, sum"),
    ({"options.s2fl.speed": 1}, "options.s2fl.speed: unknown field"),
    ({"data.partition": "natural"}, "data.partition: 'natural' needs writer ids"),
    ({"data.dataset": "mnist", "data.root": "/nonexistent"}, "/nonexistent"),
]


@pytest.mark.parametrize("change,message", BAD)
def test_bad_config_exits_2_with_one_line_and_no_run_dir(change, message, tmp_path, capsys):
    out_dir = tmp_path / "runs"
    cfg = tiny_config(**{"output.out_dir": str(out_dir)}, **change)
    code = main(["run", str(_write(tmp_path, cfg))])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and message in err, err
    assert not out_dir.exists()


def test_override_errors_name_the_field(tmp_path, capsys):
    path = _write(tmp_path, tiny_config())
    assert main(["validate", str(path), "train.batch_size=0"]) == 2
    assert "train.batch_size: must be >= 1" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.yaml")]) == 2


@pytest.mark.parametrize("command", [["validate"], ["run"], ["compare", "--algorithms", "s2fl"]])
def test_commands_without_a_config_file_are_one_line_errors(command, capsys):
    # `splitfl validate rounds=2` used to check the built-in defaults and say ok
    assert main([*command, "rounds=2"]) == 2
    err = capsys.readouterr().err
    assert err == "error: CONFIG: give a config file (e.g. configs/quickstart.yaml)\n"


def test_load_config_applies_overrides(tmp_path):
    cfg = load_config(_write(tmp_path, tiny_config()), ["train.lr=0.2", "data.p=10"])
    assert cfg.train.lr == 0.2 and cfg.data.p == 10.0
    with pytest.raises(ConfigError):
        load_config(None, ["train.lr"])


def test_list_and_validate(tmp_path, capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("s2fl", "splitfed_v1", "resnet8", "femnist", "s2fl_table1"):
        assert name in out
    assert main(["validate", str(_write(tmp_path, tiny_config()))]) == 0
    assert capsys.readouterr().out.startswith("ok: s2fl on digits")


def test_run_resume_and_compare(tmp_path, capsys):
    path = _write(tmp_path, tiny_config(rounds=2))
    assert main(["run", str(path), "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    assert "| s2fl |" in capsys.readouterr().out
    assert main(["run", "--resume", str(tmp_path / "r"), "--no-progress"]) == 0
    assert (
        main(
            [
                "compare",
                str(path),
                "--algorithms",
                "fedavg,s2fl",
                "--out",
                str(tmp_path / "c"),
                "--no-progress",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "| fedavg |" in out and "| s2fl |" in out
    for name in ("comparison.md", "accuracy.png", "waiting.png", "fedavg/metrics.jsonl"):
        assert (tmp_path / "c" / name).exists()


def test_console_entry_point(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "splitfl", "list"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and "algorithms:" in proc.stdout


def test_overrides_may_follow_options(tmp_path, capsys):
    path = _write(tmp_path, tiny_config(rounds=1))
    code = main(
        [
            "compare",
            str(path),
            "--algorithms",
            "fedavg",
            "--no-progress",
            "--out",
            str(tmp_path / "c"),
            "train.lr=0.2",
        ]
    )
    assert code == 0
    assert (
        yaml.safe_load((tmp_path / "c" / "fedavg" / "config.yaml").read_text())["train"]["lr"]
        == 0.2
    )


def test_comparison_table_columns_line_up():
    rows = [
        {
            "round": 1,
            "sim_time": 2.0,
            "wall_time": 0.1,
            "test_acc": 0.5,
            "test_loss": 1.0,
            "avg_waiting": 0.5,
            "energy_j": 1500.0,
            "traffic_total_cum": 2e6,
        }
    ]
    table = comparison_table({"a": summarize(rows, 0.4)})
    widths = {line.count("|") for line in table.splitlines()}
    assert len(widths) == 1 and "1.50 kJ" in table and "2.0M" in table

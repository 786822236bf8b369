"""Sweep axes narrowed from the command line (``splitfl sweep s.yaml seed=[0]``), and the
trial count printed before the first trial starts."""

from __future__ import annotations

import pytest
import yaml

from conftest import tiny_config
from splitfl.cli.main import main
from splitfl.config import ConfigError
from splitfl.sweeps import expand, load_sweep

AXES = {"algorithm": ["fedavg", "s2fl"], "seed": [0, 1, 2]}


def sweep_file(tmp_path, overrides=(), axes=None):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(tiny_config(rounds=1)))
    spec = {"base": "base.yaml", "overrides": list(overrides), "axes": axes or AXES}
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.mark.parametrize(
    "override,seeds",
    [("seed=[0]", [0]), ("seed=1", [1]), ("seed=[2, 0]", [2, 0]), ("seed=[5]", [5])],
)
def test_override_of_an_axis_sets_its_values(tmp_path, override, seeds):
    spec = load_sweep(sweep_file(tmp_path), [override, "train.lr=0.2"])
    assert spec.axes == {"algorithm": ["fedavg", "s2fl"], "seed": seeds}
    assert spec.overrides == ["train.lr=0.2"]
    trials = expand(spec)
    assert len(trials) == 2 * len(seeds)
    assert [t.config.seed for t in trials[: len(seeds)]] == seeds
    assert all(t.config.train.lr == 0.2 for t in trials)


def test_axis_of_lists_takes_a_flat_list_as_one_value():
    from splitfl.sweeps.spec import narrow_axes

    axes = {"options.ringsfl.prop_lens": [[8, 1], [1, 1]]}
    assert narrow_axes(axes, ["options.ringsfl.prop_lens=[8, 1]"])[0] == {
        "options.ringsfl.prop_lens": [[8, 1]]
    }
    assert narrow_axes(axes, ["options.ringsfl.prop_lens=[[1, 1], [2, 1]]"])[0] == {
        "options.ringsfl.prop_lens": [[1, 1], [2, 1]]
    }


def test_bad_narrowing_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match=r"^seed: repeated values"):
        load_sweep(sweep_file(tmp_path), ["seed=[0, 0]"])
    with pytest.raises(ConfigError, match=r"^seed: must be a non-empty list"):
        load_sweep(sweep_file(tmp_path), ["seed=[]"])


def test_sweep_file_override_of_an_axis_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^sweep.overrides: 'seed=0' sets seed, an axis"):
        load_sweep(sweep_file(tmp_path, overrides=["seed=0"]))


def test_cli_runs_the_narrowed_grid_and_says_so_first(tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["sweep", str(sweep_file(tmp_path)), "--backend", "local", "--out", str(out)]
    assert main([*argv, "seed=[0]", "algorithm=fedavg"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "1 trial (algorithm 1 × seed 1); 1 to run on local"
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == ["algorithm-fedavg_seed-0"]

"""Sweeps: grid expansion, local and Ray trial executors, resume after a kill, failing trials."""

import json
from pathlib import Path

import pytest
import yaml

import splitfl
from conftest import tiny_config
from splitfl.cli.main import main
from splitfl.config import ConfigError
from splitfl.experiment import recorder, runner
from splitfl.sweeps import expand, load_sweep

NAMES = [
    "algorithm-fedavg_seed-0",
    "algorithm-fedavg_seed-1",
    "algorithm-s2fl_seed-0",
    "algorithm-s2fl_seed-1",
]


def _sweep_file(tmp_path, axes=None, rounds=2, overrides=None, **changes):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(tiny_config(rounds=rounds, **changes)))
    spec = {
        "base": "base.yaml",
        "overrides": overrides or [],
        "axes": axes or {"algorithm": ["fedavg", "s2fl"], "seed": [0, 1]},
    }
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def _acc(run_dir):
    return [json.loads(line)["test_acc"] for line in (Path(run_dir) / "metrics.jsonl").open()]


def _rows(run_dir):
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").open()]
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]


def _index(folder):
    return {t["name"]: t for t in json.loads((folder / "trials.json").read_text())["trials"]}


def test_expand_gives_deterministic_names_order_and_configs(tmp_path):
    path = _sweep_file(tmp_path, overrides=["train.lr=0.1"])
    trials = expand(load_sweep(path))
    assert [t.name for t in trials] == NAMES
    assert [t.index for t in trials] == [0, 1, 2, 3]
    assert trials[2].config.algorithm == "s2fl" and trials[2].config.seed == 0
    assert all(t.config.train.lr == 0.1 for t in trials)
    assert trials[3].overrides == ["algorithm=s2fl", "seed=1"]


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"base": "base.yaml", "axes": {"seed": [0]}, "grid": 1}, "sweep.grid: unknown field"),
        ({"axes": {"seed": [0]}}, "sweep.base:"),
        ({"base": "missing.yaml"}, "sweep.base: file not found"),
        ({"base": "base.yaml", "axes": {"seed": 3}}, "sweep.axes.seed: must be a non-empty list"),
        ({"base": "base.yaml", "axes": {"seed": [1, 1]}}, "sweep.axes.seed: repeated values"),
        ({"base": "base.yaml", "axes": {"seed": [0, 0.0]}}, r"0 and 0\.0 are equal"),
    ],
)
def test_malformed_sweep_files_raise_one_line_errors(tmp_path, spec, message):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(tiny_config()))
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError, match=message):
        load_sweep(tmp_path / "s.yaml")


def test_local_sweep_writes_run_dirs_equal_to_plain_runs(tmp_path, capsys):
    path = _sweep_file(tmp_path)
    out = tmp_path / "sw"
    assert main(["sweep", str(path), "--executor", "local", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.count("] algorithm-") == 4 and "4 done" in printed
    index = _index(out)
    assert list(index) == NAMES and {t["status"] for t in index.values()} == {"done"}
    for name in NAMES:
        for f in ("config.yaml", "metrics.jsonl", "summary.json", "checkpoints/last.pt"):
            assert (out / name / f).exists()
    assert yaml.safe_load((out / "sweep.yaml").read_text())["base"]["rounds"] == 2
    for f in ("report.md", "report.csv", "report.html", "accuracy_vs_time.png", "waiting.png"):
        assert (out / f).exists()
    # trial i equals a plain `splitfl run` of the base config with the trial's overrides
    plain = splitfl.run(
        tmp_path / "base.yaml", index[NAMES[3]]["overrides"], run_dir=tmp_path / "p"
    )
    assert _acc(out / NAMES[3]) == [r["test_acc"] for r in plain.metrics]
    assert (out / NAMES[3] / "config.yaml").read_text() == (
        plain.run_dir / "config.yaml"
    ).read_text()


class Killed(BaseException):
    """Stands in for SIGKILL/Ctrl-C: not an Exception, so nothing records it as a failure."""


def test_killed_sweep_resumes_without_rerunning_finished_trials(tmp_path, monkeypatch):
    path = _sweep_file(tmp_path, rounds=3)  # checkpoints after rounds 2 and 3
    full = splitfl.sweep(path, out_dir=tmp_path / "full", backend="local", progress=False)
    assert full.ok

    out = tmp_path / "killed"
    save = recorder.save_checkpoint

    def save_then_die(run_dir, state):
        save(run_dir, state)
        if run_dir.name == NAMES[1] and state["round"] == 2:
            raise Killed

    monkeypatch.setattr(recorder, "save_checkpoint", save_then_die)
    with pytest.raises(Killed):
        splitfl.sweep(path, out_dir=out, backend="local", progress=False, report=False)
    monkeypatch.setattr(recorder, "save_checkpoint", save)
    index = _index(out)
    assert [index[n]["status"] for n in NAMES] == ["done", "running", "pending", "pending"]
    mtime = (out / NAMES[0] / "metrics.jsonl").stat().st_mtime_ns

    calls = {"run": [], "resume": []}
    run, resume = runner.run, runner.resume
    monkeypatch.setattr(runner, "run", lambda c, **kw: calls["run"].append(kw) or run(c, **kw))
    monkeypatch.setattr(
        runner, "resume", lambda d, **kw: calls["resume"].append(Path(d).name) or resume(d, **kw)
    )
    again = splitfl.sweep(path, out_dir=out, backend="local", progress=False)
    assert again.ok
    assert calls["resume"] == [NAMES[1]]
    assert [kw["run_dir"].name for kw in calls["run"]] == NAMES[2:]
    assert (out / NAMES[0] / "metrics.jsonl").stat().st_mtime_ns == mtime
    for name in NAMES:
        assert _rows(out / name) == _rows(tmp_path / "full" / name)
    # once more: nothing left to run
    calls["run"].clear()
    splitfl.sweep(out, backend="local", progress=False, report=False)  # resume by directory
    assert calls["run"] == [] and calls["resume"] == [NAMES[1]]


def test_failing_trials_are_recorded_and_do_not_stop_the_sweep(tmp_path, capsys):
    path = _sweep_file(
        tmp_path,
        axes={"train.lr": [0.05, 1.0e8], "data.alpha": [0.5, -1]},
        overrides=["algorithm=fedavg", "model=mlp"],
    )
    out = tmp_path / "sw"
    # invalid trials are reported up front and nothing runs...
    assert main(["sweep", str(path), "--executor", "local", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "data.alpha: must be > 0" in err and "2 of 4" in err
    assert not out.exists()
    # ...unless --keep-going: they are recorded as failed, divergence too, the rest runs
    code = main(["sweep", str(path), "--executor", "local", "--out", str(out), "--keep-going"])
    assert code == 1
    index = _index(out)
    status = {n: t["status"] for n, t in index.items()}
    assert status == {
        "lr-0.05_alpha-0.5": "done",
        "lr-0.05_alpha--1": "failed",
        "lr-100000000.0_alpha-0.5": "diverged",
        "lr-100000000.0_alpha--1": "failed",
    }
    assert "data.alpha: must be > 0" in index["lr-0.05_alpha--1"]["error"]
    assert "non-finite" in index["lr-100000000.0_alpha-0.5"]["error"]
    error = json.loads((out / "lr-100000000.0_alpha-0.5" / "error.json").read_text())
    assert error["status"] == "diverged" and "NonFiniteLossError" in error["type"]
    table = (out / "report.md").read_text()
    assert "| 0.05 | 0.5 | 1 |" in table
    assert "failed (lr-0.05_alpha--1): data.alpha: must be > 0" in table
    assert "diverged (lr-100000000.0_alpha-0.5)" in table


def test_runtime_exception_in_one_trial_is_recorded(tmp_path, monkeypatch):
    path = _sweep_file(tmp_path, axes={"seed": [0, 1]}, rounds=1)
    run = runner.run

    def flaky(config, **kw):
        if config.seed == 0:
            raise RuntimeError("disk full")
        return run(config, **kw)

    monkeypatch.setattr(runner, "run", flaky)
    result = splitfl.sweep(path, out_dir=tmp_path / "sw", backend="local", progress=False)
    assert [t["status"] for t in result.trials] == ["failed", "done"]
    assert result.trials[0]["error"] == "disk full" and not result.ok


def test_changed_sweep_into_the_same_directory_is_refused(tmp_path):
    path = _sweep_file(tmp_path, axes={"seed": [0]}, rounds=1)
    splitfl.sweep(path, out_dir=tmp_path / "sw", backend="local", progress=False, report=False)
    with pytest.raises(ConfigError, match="holds a different config"):
        splitfl.sweep(path, out_dir=tmp_path / "sw", backend="local", overrides=["train.lr=0.2"])


def test_executor_keyword_is_a_deprecated_alias_of_backend(tmp_path):
    path = _sweep_file(tmp_path, axes={"seed": [0]}, rounds=1)
    with pytest.warns(DeprecationWarning, match="backend="):
        result = splitfl.sweep(path, out_dir=tmp_path / "sw", executor="local", report=False)
    assert result.ok
    with pytest.raises(TypeError, match="give one"):
        splitfl.sweep(path, backend="local", executor="ray")
    with pytest.warns(DeprecationWarning), pytest.raises(ConfigError, match="allowed: ray, local"):
        splitfl.sweep(path, executor="slurm")


def test_missing_ray_gives_a_one_line_hint(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)
    path = _sweep_file(tmp_path, axes={"seed": [0]}, rounds=1)
    assert main(["sweep", str(path), "--out", str(tmp_path / "sw")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--backend local" in err
    assert "pip install -e '" in err and "[ray]'" in err  # from this checkout, not PyPI


@pytest.mark.slow
def test_sweep_on_a_local_ray_instance_matches_local_executor(tmp_path, ray_instance):
    """Two trials, one per algorithm (the seed axis is the local sweep tests'): each Ray
    trial's rows equal the local backend's."""
    path = _sweep_file(tmp_path, axes={"algorithm": ["fedavg", "s2fl"], "seed": [0]})
    names = [NAMES[0], NAMES[2]]
    local = splitfl.sweep(path, out_dir=tmp_path / "local", backend="local", progress=False)
    result = splitfl.sweep(
        path, out_dir=tmp_path / "ray", backend="ray", gpus_per_trial=0, progress=False
    )
    assert result.ok and [t["name"] for t in result.trials] == names
    for name in names:
        assert _rows(tmp_path / "ray" / name) == _rows(local.out_dir / name)
    assert (tmp_path / "ray" / "report.html").exists()


PAPER_SWEEPS = sorted(Path(__file__).parents[2].glob("benchmarks/papers/*/sweep*.yaml"))


@pytest.mark.parametrize("path", PAPER_SWEEPS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_paper_sweep_files_expand_to_valid_trials(path):
    """Every trial's config passes validation (static checks; the data itself lives outside
    the repository and is checked by ``splitfl sweep`` before a real sweep starts)."""
    trials = expand(load_sweep(path))
    assert len(trials) > 1 and len({t.name for t in trials}) == len(trials)
    assert [t.error for t in trials if t.error] == []
    assert "seed" in trials[0].values  # mean ± std over seeds


def test_paper_sweeps_cover_every_paper():
    assert {p.parent.name for p in PAPER_SWEEPS} == {"s2fl", "ringsfl", "mergesfl", "parallelsfl"}

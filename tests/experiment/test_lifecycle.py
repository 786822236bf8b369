"""Run lifecycle (issue 11 items 3, 4, 5, 7): resume edge cases, directory locks, interrupts,
loss explosion. Tiny digits runs of a few rounds."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import splitfl
from splitfl.cli.main import main
from splitfl.config import ConfigError
from splitfl.experiment import loop, round_step
from splitfl.experiment.checkpoint import decode_numpy, encode_numpy
from splitfl.experiment.guards import LossExplosionError, check_explosion
from splitfl.metrics.records import read_metrics
from splitfl.metrics.summary import summarize
from splitfl.rundir.lock import DirectoryLockedError, hold_lock
from splitfl.testing import tiny_config

CFG = tiny_config(rounds=4, **{"output.checkpoint_every": 2})
SRC = str(Path(splitfl.__file__).resolve().parents[1])


class Killed(BaseException):
    """Stands in for kill -9: nothing in the run loop handles it."""


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]


def _model(run_dir):
    return torch.load(run_dir / "model.pt", weights_only=True)


def _summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The uninterrupted 4-round run every resumed run must equal."""
    return splitfl.run(CFG, run_dir=tmp_path_factory.mktemp("full") / "run")


def _stop_in_round(monkeypatch, round_index, exc):
    """Raise ``exc`` as round ``round_index`` (0-based) starts (its torch seed is derived)."""
    derive = round_step.derive_seed

    def stop(seed, *parts):
        if parts == ("torch", round_index):
            raise exc
        return derive(seed, *parts)

    monkeypatch.setattr(round_step, "derive_seed", stop)


def _killed_run(tmp_path, monkeypatch):
    """A run killed during round 4: checkpoint at round 2, three rows in metrics.jsonl."""
    _stop_in_round(monkeypatch, 3, Killed())
    with pytest.raises(Killed):
        splitfl.run(CFG, run_dir=tmp_path / "run")
    monkeypatch.undo()
    return tmp_path / "run"


def _assert_equals_full(resumed, full):
    assert _strip(resumed.metrics) == _strip(full.metrics)
    assert _strip(read_metrics(resumed.run_dir / "metrics.jsonl")) == _strip(full.metrics)
    a, b = _model(full.run_dir), _model(resumed.run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    s, t = _summary(resumed.run_dir), _summary(full.run_dir)
    assert s["status"] == "ok" and s["rounds"] == 4 and s["energy_j"] == t["energy_j"]


DAMAGE = {
    "emptied": lambda text: "",
    "missing": None,
    "truncated": lambda text: text[: len(text) // 2],
    "damaged line": lambda text: text.replace(text.splitlines()[1], '{"round": 2, "tr'),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_resume_restores_damaged_metrics_from_the_checkpoint(damage, full, tmp_path, monkeypatch):
    run_dir = _killed_run(tmp_path, monkeypatch)
    assert _summary(run_dir)["status"] == "stopped at round 3"  # never "ok"
    metrics = run_dir / "metrics.jsonl"
    if DAMAGE[damage] is None:
        metrics.unlink()
    else:
        metrics.write_text(DAMAGE[damage](metrics.read_text()))
    _assert_equals_full(splitfl.resume(run_dir), full)


def test_damaged_metrics_line_is_one_line_error_for_report(tmp_path, capsys):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"round": 1}\n{"round": 2, "tr\n')
    with pytest.raises(ConfigError, match="line 2 is not a JSON metrics row"):
        read_metrics(path)


def _torn(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garbage(path):
    path.write_bytes(b"not a checkpoint at all")


def _foreign(path):
    torch.save({"round": 2, "weights": torch.zeros(3)}, path)


@pytest.mark.parametrize("damage", [_torn, _garbage, _foreign])
def test_damaged_checkpoint_is_one_line_and_exit_2(damage, tmp_path, monkeypatch, capsys):
    run_dir = _killed_run(tmp_path, monkeypatch)
    damage(run_dir / "checkpoints" / "last.pt")
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "damaged or not a splitfl checkpoint" in err, err


@pytest.mark.parametrize(
    "other,shown",
    [
        ({"algorithm": "fedavg"}, 'algorithm ("fedavg" vs "s2fl")'),
        ({"model": "mlp"}, 'model ("mlp" vs "cnn_digits")'),
        ({"seed": 1}, "seed (1 vs 3)"),
        ({"data.num_clients": 40}, "data.num_clients (40 vs 12)"),
    ],
)
def test_checkpoint_of_another_run_is_refused_naming_the_fields(
    other, shown, tmp_path, monkeypatch, capsys
):
    run_dir = _killed_run(tmp_path, monkeypatch)
    rows = (run_dir / "metrics.jsonl").read_text()
    donor = splitfl.run(tiny_config(rounds=1, **other), run_dir=tmp_path / "donor")
    ckpt = "checkpoints/last.pt"
    (run_dir / ckpt).write_bytes((donor.run_dir / ckpt).read_bytes())
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "written under another config" in err, err
    # the other fields the donor's config resolved differently may be listed beside it
    assert f"the config differs in {shown}" in err and "(checkpoint vs config.yaml)" in err, err
    assert (run_dir / "metrics.jsonl").read_text() == rows  # its own rows, not the donor's


def test_a_checkpoint_without_run_identity_is_refused(tmp_path, monkeypatch, capsys):
    run_dir = _killed_run(tmp_path, monkeypatch)
    path = run_dir / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    del state["identity"]  # as written by splitfl before checkpoints carried it
    torch.save(state, path)
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 2
    assert "no run identity; written by an older splitfl?" in capsys.readouterr().err


def test_checkpoint_rows_must_match_its_round(tmp_path, monkeypatch, capsys):
    run_dir = _killed_run(tmp_path, monkeypatch)
    path = run_dir / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    state["metrics"] = state["metrics"].splitlines(keepends=True)[0]  # one row, round 2
    torch.save(state, path)
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 2
    assert "metric rows are not rounds 1..2" in capsys.readouterr().err


def test_numpy_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    state = {"mu": np.arange(6, dtype=np.float32).reshape(2, 3), "b": [np.float64(0.5), 3]}
    torch.save(encode_numpy(state), tmp_path / "s.pt")
    back = decode_numpy(torch.load(tmp_path / "s.pt", weights_only=True))
    assert back["mu"].dtype == np.float32 and np.array_equal(back["mu"], state["mu"])
    assert type(back["b"][0]) is np.float64 and back["b"] == [0.5, 3]


# ----------------------------------------------------------------------------- locks


def test_second_process_on_a_locked_run_directory_is_refused(full, tmp_path, capsys):
    with hold_lock(full.run_dir):
        assert main(["run", "--resume", str(full.run_dir), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(full.run_dir) in err and f"pid {os.getpid()}" in err
    before = (full.run_dir / "metrics.jsonl").read_text()
    splitfl.resume(full.run_dir)  # lock released: works, and adds no rows to a finished run
    assert (full.run_dir / "metrics.jsonl").read_text() == before


def test_lock_of_a_killed_process_vanishes(tmp_path):
    code = (
        "import sys, time; from splitfl.rundir.lock import hold_lock\n"
        f"with hold_lock({str(tmp_path)!r}):\n"
        "    print('locked', flush=True); time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    try:
        assert child.stdout.readline().strip() == b"locked"
        with pytest.raises(DirectoryLockedError, match=f"pid {child.pid}"), hold_lock(tmp_path):
            pass
    finally:
        child.kill()  # SIGKILL: no cleanup runs in the child
        child.wait()
    with hold_lock(tmp_path):
        pass


def _sweep_file(tmp_path, name, seeds):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(tiny_config(rounds=1)))
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"base": "base.yaml", "axes": {"seed": seeds}}))
    return path


def test_a_different_sweep_in_the_same_out_is_refused(tmp_path, capsys):
    out = tmp_path / "sw"
    first = _sweep_file(tmp_path, "first", [0])
    assert main(["sweep", str(first), "--executor", "local", "--out", str(out)]) == 0
    files = {p: p.read_bytes() for p in out.iterdir() if p.is_file()}
    assert {"trials.json", "sweep.yaml", "report.md"} <= {p.name for p in files}
    capsys.readouterr()
    second = _sweep_file(tmp_path, "second", [1])  # no trial name shared with the first
    assert main(["sweep", str(second), "--executor", "local", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another sweep" in err and str(out) in err, err
    assert {p: p.read_bytes() for p in out.iterdir() if p.is_file()} == files
    assert not (out / "seed-1").exists()
    # the same sweep again is a resume; a locked sweep directory is refused
    assert main(["sweep", str(first), "--executor", "local", "--out", str(out)]) == 0
    with hold_lock(out, "sweep"), pytest.raises(DirectoryLockedError, match="sweep directory"):
        splitfl.sweep(first, out_dir=out, backend="local", progress=False)


# ----------------------------------------------------------------------------- interrupts


def _run_cli(run_dir):
    cfg = run_dir.parent / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    return main(["run", str(cfg), "--out", str(run_dir), "--no-progress"])


def test_ctrl_c_mid_round_records_interrupted_and_resume_is_exact(
    full, tmp_path, monkeypatch, capsys
):
    # three rounds done, the periodic checkpoint at 2: the interrupt keeps round 3 (issue 34)
    _stop_in_round(monkeypatch, 3, KeyboardInterrupt())
    run_dir = tmp_path / "run"
    assert _run_cli(run_dir) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "interrupted at round 3 of 4" in err
    assert "checkpoint at round 3" in err
    summary = _summary(run_dir)
    assert summary["status"] == "interrupted at round 3" and summary["rounds"] == 3
    assert not (run_dir / "model.pt").exists()
    monkeypatch.undo()
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 0
    _assert_equals_full(splitfl.resume(run_dir), full)


def test_sigterm_between_rounds_checkpoints_the_last_round(full, tmp_path, monkeypatch):
    check = loop.check_explosion

    def sigterm_after_round_3(rows, *args):
        if len(rows) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # turned into KeyboardInterrupt by the loop
        return check(rows, *args)

    monkeypatch.setattr(loop, "check_explosion", sigterm_after_round_3)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="checkpoint at round 3"):
        splitfl.run(CFG, run_dir=tmp_path / "run")
    assert signal.getsignal(signal.SIGTERM) == before  # handler restored
    assert _summary(tmp_path / "run")["status"] == "interrupted at round 3"
    ckpt = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert ckpt["round"] == 3
    monkeypatch.undo()
    _assert_equals_full(splitfl.resume(tmp_path / "run"), full)


# ----------------------------------------------------------------------------- summaries


def test_summary_never_hides_missing_rows():
    rows = [{"round": k, "avg_waiting": 1.0, "energy_j": 2.0} for k in (1, 2, 4)]
    s = summarize(rows, None, "ok", planned=4)
    assert s["status"] == "incomplete: missing rows for 1 rounds (3)"
    assert s["missing_rounds"] == [3] and s["energy_j"] == 6.0
    assert summarize(rows[:2], None, "ok", planned=4)["status"] == "incomplete: 2 of 4 rounds"
    assert summarize(rows[:2], None, "ok", planned=2)["status"] == "ok"
    assert summarize(rows, None, "interrupted at round 4")["status"] == (
        "interrupted at round 4; missing rows for 1 rounds (3)"
    )


# ----------------------------------------------------------------------------- explosion


class _Train:
    def __init__(self, factor, rounds, recovery=None):
        self.explode_factor, self.explode_rounds = factor, rounds
        self.explode_recovery = recovery


def test_explosion_needs_k_consecutive_rounds_above_the_factor():
    rows = [{"train_loss": v} for v in (2.0, 250.0, 1.0, 201.0, 250.0)]
    check_explosion(rows, 2.0, _Train(100, 3))  # 250, 1, 201: not all above 200
    check_explosion(rows[:4], 2.0, _Train(100, 2))  # 1, 201
    check_explosion(rows, 2.0, _Train(None, 2))  # disabled
    check_explosion(rows, 2.0, _Train(100, 0))  # disabled
    with pytest.raises(LossExplosionError, match="250 > 100 x initial loss 2 for 2"):
        check_explosion(rows, 2.0, _Train(100, 2))  # 201, 250 > 200


def test_explosion_that_never_recovers_is_caught():
    # Prepare: initial loss 2; the quickstart's lr=300 shape: two huge rounds, then 40-75 x
    blew_up = [{"train_loss": v} for v in (1e20, 2e23, 116.0, 100.0, 146.0)]
    recovered = [{"train_loss": v} for v in (1e20, 30.0, 19.0, 25.0, 30.0, 2.5)]
    train = _Train(100, 3, recovery=10)
    # Execute / Assert
    check_explosion(blew_up[:4], 2.0, train)  # 2 rounds after the blow-up so far
    with pytest.raises(LossExplosionError, match=r"above 100 x initial loss 2 in round 2 and "):
        check_explosion(blew_up, 2.0, train)  # 116, 100, 146 all > 10 x 2 after round 2
    for end in range(1, len(recovered) + 1):
        check_explosion(recovered[:end], 2.0, train)  # 19 < 20: it came back
    check_explosion(blew_up, 2.0, _Train(100, 3, recovery=None))  # second test disabled
    check_explosion(blew_up, 2.0, _Train(100, 3, recovery=80))  # 116, 100, 146 < 160


def test_blown_up_run_stays_broken_stops_with_exit_3(tmp_path, capsys, monkeypatch):
    # Prepare: the quickstart at lr=300 blew up to 1e20 and then sat at 40-75 x the initial
    # loss (chance accuracy) and ended "ok". Whether a real high-lr run stays finite depends on
    # the CPU's fp32 kernels, so the rows' training losses are scripted: 3.6e20 in round 1,
    # then 40 (~17 x the initial test loss of ~2.3) every round.
    scripted = {0: 3.6e20}
    real_row = round_step.round_row

    def row(ctx, plan, result, report, waits, traffic, r):
        loss = scripted.get(r, 40.0)  # every client's: the mean and the median the check reads
        return {
            **real_row(ctx, plan, result, report, waits, traffic, r),
            "train_loss": loss,
            "train_loss_median": loss,
        }

    monkeypatch.setattr(round_step, "round_row", row)
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(rounds=6)))
    run_dir = tmp_path / "run"
    # Execute
    code = main(["run", str(cfg), "--out", str(run_dir), "--no-progress"])
    # Assert
    err = capsys.readouterr().err
    assert code == 3 and err.count("\n") == 1
    assert "diverged at round 4: train loss went above 100 x initial loss" in err
    assert _summary(run_dir)["status"].startswith("diverged at round 4: ")


@pytest.mark.parametrize(
    ("value", "message"), [("0.5", "must be > 1"), ("1", "must be > 1"), ("-3", "must be >= 0")]
)
def test_bad_explosion_settings_are_one_line_errors(value, message, tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    assert main(["validate", str(cfg), f"train.explode_factor={value}"]) == 2
    err = capsys.readouterr().err
    assert f"train.explode_factor: {message}" in err and err.count("\n") == 1


@pytest.mark.parametrize("value", ["0.5", "101", "-1"])
def test_bad_recovery_setting_is_a_one_line_error(value, tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    assert main(["validate", str(cfg), f"train.explode_recovery={value}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: train.explode_recovery: must be ") and err.count("\n") == 1


def test_finite_loss_explosion_stops_with_exit_3(tmp_path, capsys):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    run_dir = tmp_path / "run"
    code = main(["run", str(cfg), "train.lr=1e6", "--out", str(run_dir), "--no-progress"])
    assert code == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "diverged at round 3: train loss" in err
    status = _summary(run_dir)["status"]
    assert status.startswith("diverged at round 3: train loss") and "x initial loss" in status
    rows = read_metrics(run_dir / "metrics.jsonl")
    assert all(r["train_loss"] < 1e30 for r in rows)  # finite: the NaN check never fired

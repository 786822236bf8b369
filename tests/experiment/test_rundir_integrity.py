"""Run directories never lie (issue 22 items 1-5): atomic writes (``model.pt`` before
``summary.json``), identity-checked resume, damaged files and OS errors as one-line errors.
Faults are injected by monkeypatching a write (a full disk is a monkeypatched ``ENOSPC``)
or by a subprocess killed at a marker. Tiny digits runs of one or two rounds."""

import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml

import splitfl
from splitfl.cli.main import main
from splitfl.core import atomic
from splitfl.metrics.records import read_metrics
from splitfl.rundir import lock as dirlock
from splitfl.rundir.lock import LOCK_FILE, hold_lock
from splitfl.sweeps.spec import MAX_TRIAL_NAME, trial_name
from splitfl.sweeps.trial import run_state
from splitfl.testing import tiny_config

CFG = tiny_config(rounds=2, **{"output.checkpoint_every": 1})
SRC = str(Path(splitfl.__file__).resolve().parents[1])


class Killed(BaseException):
    """Stands in for kill -9: nothing in the run loop handles it."""


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]


def _summary(run_dir):
    return json.loads((Path(run_dir) / "summary.json").read_text())


def _one_error_line(capsys, *needles):
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert all(n in err for n in needles), err
    return err


def _tmp_files(folder):
    return [p for p in Path(folder).rglob(f"{atomic.TMP_PREFIX}*")]


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    """The uninterrupted 2-round run that every recovered run must equal."""
    return splitfl.run(CFG, run_dir=tmp_path_factory.mktemp("full") / "run")


def _assert_equals_full(run_dir, full):
    assert _summary(run_dir)["status"] == "ok"
    assert _strip(read_metrics(run_dir / "metrics.jsonl")) == _strip(full.metrics)
    a = torch.load(full.run_dir / "model.pt", weights_only=True)
    b = torch.load(run_dir / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not (run_dir / LOCK_FILE).exists() and not _tmp_files(run_dir)


# ----------------------------------------------------------------------------- item 1


def _is_final_model(obj):
    return isinstance(obj, dict) and "format" not in obj  # a checkpoint has a header


def test_a_run_killed_while_saving_its_model_does_not_say_ok(full, tmp_path, monkeypatch):
    save = torch.save

    def killed_at_the_model(obj, f, *args, **kwargs):
        if _is_final_model(obj):
            raise Killed
        return save(obj, f, *args, **kwargs)

    monkeypatch.setattr(torch, "save", killed_at_the_model)
    with pytest.raises(Killed):
        splitfl.run(CFG, run_dir=tmp_path / "run")
    monkeypatch.undo()
    run_dir = tmp_path / "run"
    assert _summary(run_dir)["status"] == "stopped at round 2"  # never "ok" without model.pt
    assert not (run_dir / "model.pt").exists() and run_state(run_dir, 2) == "partial"
    splitfl.resume(run_dir)
    _assert_equals_full(run_dir, full)


CHILD = """
import os, signal, sys, torch
from splitfl.cli.main import main
MARK = sys.argv[2]
save = torch.save

def final_model(obj):
    return isinstance(obj, dict) and "format" not in obj

def marked_save(obj, f, *args, **kwargs):
    if final_model(obj) and MARK == "sigterm":
        os.kill(os.getpid(), signal.SIGTERM)
    if final_model(obj) and MARK == "sigkill" and not hasattr(f, "write"):
        save(obj, f, *args, **kwargs)  # a splitfl that writes model.pt in place
        os.truncate(f, os.path.getsize(f) // 2)
        os.kill(os.getpid(), signal.SIGKILL)
    return save(obj, f, *args, **kwargs)

torch.save = marked_save
try:
    from splitfl.core import atomic
    write_all = atomic._write_all

    def marked_write(fd, data):  # a splitfl that writes model.pt atomically
        name = os.readlink(f"/proc/self/fd/{fd}")
        if MARK == "sigkill" and name.endswith(".pt") and "/checkpoints/" not in name:
            os.write(fd, data[: len(data) // 2])
            os.kill(os.getpid(), signal.SIGKILL)
        write_all(fd, data)

    atomic._write_all = marked_write
except ImportError:
    pass
sys.exit(main(["run", sys.argv[1], "--out", sys.argv[3], "--no-progress"]))
"""


def _child_run(tmp_path, mark):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": SRC}
    args = [sys.executable, "-c", textwrap.dedent(CHILD), str(cfg), mark, str(run_dir)]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300)
    return proc, run_dir


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_sigkill_while_model_pt_is_written_leaves_no_half_model_as_done(full, tmp_path):
    proc, run_dir = _child_run(tmp_path, "sigkill")
    assert proc.returncode == -9, proc.stderr
    assert not (run_dir / "summary.json").exists()
    assert not (run_dir / "model.pt").exists() and run_state(run_dir, 2) == "partial"
    assert len(_tmp_files(run_dir)) == 1  # the half-written model, under a temporary name
    splitfl.resume(run_dir)  # removes it and writes the model
    _assert_equals_full(run_dir, full)


def test_sigterm_while_the_model_is_saved_is_an_interrupt(full, tmp_path):
    proc, run_dir = _child_run(tmp_path, "sigterm")
    assert proc.returncode == 130, proc.stderr
    assert "interrupted at round 2 of 2" in proc.stderr
    assert _summary(run_dir)["status"] == "interrupted at round 2"
    assert run_state(run_dir, 2) == "partial"
    splitfl.resume(run_dir)
    _assert_equals_full(run_dir, full)


# ----------------------------------------------------------------------------- item 3


@pytest.fixture(scope="module")
def finished(full):
    """A finished run's folder, copied by each test before it is edited (``full``'s run)."""
    return full.run_dir


def _edited_copy(finished, tmp_path, edit):
    run_dir = tmp_path / "run"
    shutil.copytree(finished, run_dir)
    path = run_dir / "config.yaml"
    config = yaml.safe_load(path.read_text())
    edit(config)
    path.write_text(yaml.safe_dump(config) if config else "")
    return run_dir


def _setter(key, value):
    def edit(config):
        config["rounds"] = 3
        node = config
        *parents, last = key.split(".")
        for k in parents:
            node = node[k]
        node[last] = value

    return edit


@pytest.mark.parametrize(
    ("key", "value", "shown"),
    [
        ("train.lr", 0.5, "train.lr (0.05 vs 0.5)"),
        ("seed", 1, "seed (3 vs 1)"),
        ("data.alpha", 0.1, "data.alpha (0.5 vs 0.1)"),
        ("algorithm", "fedavg", 'algorithm ("s2fl" vs "fedavg")'),
        ("data.num_clients", 40, "data.num_clients (12 vs 40)"),
    ],
)
def test_resume_under_an_edited_config_is_refused_naming_the_field(
    key, value, shown, finished, tmp_path, capsys
):
    run_dir = _edited_copy(finished, tmp_path, _setter(key, value))
    before = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 2
    _one_error_line(capsys, "written under another config", f"differs in {shown}")
    after = {p.name: p.read_bytes() for p in run_dir.iterdir() if p.is_file()}
    assert after == before  # nothing rewritten


def test_resume_under_an_emptied_config_is_refused(finished, tmp_path, capsys):
    run_dir = _edited_copy(finished, tmp_path, lambda config: config.clear())
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 2
    _one_error_line(capsys, "written under another config", "more (checkpoint vs config.yaml)")


def test_more_rounds_and_other_output_settings_resume_exactly(finished, tmp_path):
    def edit(config):
        config["rounds"] = 3
        config["output"]["checkpoint_every"] = 5

    run_dir = _edited_copy(finished, tmp_path, edit)
    resumed = splitfl.resume(run_dir)
    longer = splitfl.run({**CFG, "rounds": 3}, run_dir=tmp_path / "longer")
    assert _strip(resumed.metrics) == _strip(longer.metrics)
    assert _summary(run_dir)["status"] == "ok"


# ----------------------------------------------------------------------------- item 4


def _run_dir(folder, seed, accs, rounds=None):
    """A hand-made finished run directory with one evaluated row per accuracy."""
    folder.mkdir(parents=True)
    config = {"algorithm": "s2fl", "seed": seed, "rounds": rounds or len(accs)}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [
        {
            "round": i + 1,
            "sim_time": 10.0 * (i + 1),
            "test_acc": acc,
            "test_loss": 1.0,
            "avg_waiting": 1.0,
            "energy_j": 1.0,
            "traffic_total_cum": 1e6 * (i + 1),
        }
        for i, acc in enumerate(accs)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "summary.json").write_text(json.dumps({"status": "ok", "rounds": len(rows)}))
    return folder


def _sweep_dir(root):
    _run_dir(root / "seed-0", 0, [0.4, 0.6])
    _run_dir(root / "seed-1", 1, [0.5, 0.8])
    trials = [
        {"name": f"seed-{s}", "dir": f"seed-{s}", "values": {"seed": s}, "status": "done"}
        for s in (0, 1)
    ]
    (root / "trials.json").write_text(
        json.dumps({"name": "sw", "axes": ["seed"], "trials": trials})
    )
    return root


def _cut(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


DAMAGED_RUN = {  # (damage to seed-1, the file the warning names)
    "summary truncated": (lambda d: _cut(d / "summary.json"), "summary.json"),
    "error.json garbage": (lambda d: (d / "error.json").write_bytes(b"\x00{x"), "error.json"),
    "error.json a list": (lambda d: (d / "error.json").write_text("[1]"), "error.json"),
    "config a YAML list": (lambda d: (d / "config.yaml").write_text("- 1\n- 2\n"), "config.yaml"),
    "config rounds text": (lambda d: (d / "config.yaml").write_text("rounds: x\n"), "config.yaml"),
    "row without sim_time": (
        lambda d: (d / "metrics.jsonl").write_text('{"round": 1, "avg_waiting": 1}\n'),
        "metrics.jsonl",
    ),
    "rows lost at a line end": (
        lambda d: (d / "metrics.jsonl").write_text(
            (d / "metrics.jsonl").read_text().splitlines(keepends=True)[0]
        ),
        "metrics.jsonl",
    ),
    "summary a directory": (
        lambda d: ((d / "summary.json").unlink(), (d / "summary.json").mkdir()),
        "summary.json",
    ),
}


@pytest.mark.parametrize("damage", DAMAGED_RUN)
def test_report_names_a_damaged_run_and_reports_the_others(damage, tmp_path, capsys):
    root = _sweep_dir(tmp_path / "sw")
    hurt, name = DAMAGED_RUN[damage]
    hurt(root / "seed-1")
    assert main(["report", str(root)]) == 0
    out, err = capsys.readouterr()
    assert err.startswith("warning: damaged run seed-1: ") and err.count("\n") == 1, err
    assert name in err.split("\n")[0]
    assert f"damaged (seed-1): {name}" in out  # the table says so too
    assert "| 1/2 |" in out  # seed-0 is still reported


DAMAGED_SWEEP = {  # (damage, report arguments after DIR, what the one-line error names)
    "trials.json truncated": (lambda d: _cut(d / "trials.json"), [], "trials.json"),
    "trials.json a list": (lambda d: (d / "trials.json").write_text("[]"), [], "trials.json"),
    "trial dir outside": (
        lambda d: (d / "trials.json").write_text(
            (d / "trials.json").read_text().replace('"dir": "seed-0"', '"dir": "../x"')
        ),
        [],
        "trials.json",
    ),
    "report.md a directory": (lambda d: (d / "report.md").mkdir(), [], "report.md"),
    "--out a file": (lambda d: (d / "f").write_text("x"), ["--out", "{d}/f"], "--out"),
    "--target 5": (lambda d: None, ["--target", "5"], "--target"),
    "--target nan": (lambda d: None, ["--target", "nan"], "--target"),
    "--target -1": (lambda d: None, ["--target", "-1"], "--target"),
}


@pytest.mark.parametrize("damage", DAMAGED_SWEEP)
def test_a_damaged_sweep_or_bad_report_argument_is_one_line(damage, tmp_path, capsys):
    root = _sweep_dir(tmp_path / "sw")
    hurt, args, name = DAMAGED_SWEEP[damage]
    hurt(root)
    assert main(["report", str(root), *(a.format(d=root) for a in args)]) == 2
    _one_error_line(capsys, name)
    assert not _tmp_files(root)


def test_sweep_rerun_and_resume_repair_a_truncated_summary(tmp_path, capsys):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(tiny_config(rounds=1)))
    spec = tmp_path / "sw.yaml"
    spec.write_text(yaml.safe_dump({"base": "base.yaml", "axes": {"seed": [0]}}))
    out = tmp_path / "out"
    sweep = ["sweep", str(spec), "--backend", "local", "--out", str(out)]
    assert main(sweep) == 0
    good = _summary(out / "seed-0")
    for again in (sweep, ["sweep", "--resume", str(out), "--backend", "local"]):
        _cut(out / "seed-0" / "summary.json")
        assert main(again) == 0
        assert _summary(out / "seed-0") == good
        assert main(["report", str(out)]) == 0
    assert "resumed" in capsys.readouterr().out


# ----------------------------------------------------------------------------- item 5


def _disk_full(monkeypatch, error=errno.ENOSPC, after=0, where=""):
    """Every atomic write after the first ``after`` ones into a path containing ``where``
    fails as on a full disk (or with ``error``)."""
    write_all, seen = atomic._write_all, [0]

    def full_disk(fd, data):
        if where in os.readlink(f"/proc/self/fd/{fd}"):
            seen[0] += 1
            if seen[0] > after:
                raise OSError(error, os.strerror(error))
        write_all(fd, data)

    monkeypatch.setattr(atomic, "_write_all", full_disk)


def _cfg_file(tmp_path, **changes):
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump({**CFG, **changes}))
    return path


def test_disk_full_before_the_first_checkpoint_is_one_line_and_leaves_nothing(
    tmp_path, monkeypatch, capsys
):
    cfg = _cfg_file(tmp_path)
    _disk_full(monkeypatch)
    out = tmp_path / "runs"
    args = ["run", str(cfg), f"output.out_dir={out}", "output.name=r", "--no-progress"]
    assert main(args) == 2
    _one_error_line(capsys, str(out / "r" / "config.yaml"), "No space left on device")
    assert list(out.iterdir()) == []  # no directory holding only .splitfl.lock
    monkeypatch.undo()
    assert main(args) == 0  # the same command works once there is space


def test_disk_full_mid_run_keeps_a_resumable_run(full, tmp_path, monkeypatch, capsys):
    cfg = _cfg_file(tmp_path)
    # config, clients, data, version, metrics, checkpoint 0; round 1 fails
    _disk_full(monkeypatch, after=6)
    run_dir = tmp_path / "run"
    assert main(["run", str(cfg), "--out", str(run_dir), "--no-progress"]) == 2
    _one_error_line(capsys, str(run_dir / "checkpoints" / "last.pt"), "No space left")
    assert not (run_dir / "summary.json").exists() and not _tmp_files(run_dir)
    monkeypatch.undo()
    assert main(["run", "--resume", str(run_dir), "--no-progress"]) == 0
    _assert_equals_full(run_dir, full)


@pytest.mark.parametrize("error", [errno.ENOSPC, errno.EROFS])
def test_an_unwritable_trial_is_failed_and_the_sweep_goes_on(error, tmp_path, monkeypatch, capsys):
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(tiny_config(rounds=1)))
    spec = tmp_path / "sw.yaml"
    spec.write_text(yaml.safe_dump({"base": "base.yaml", "axes": {"seed": [0, 1]}}))
    out = tmp_path / "out"
    _disk_full(monkeypatch, error=error, where="/seed-0/")
    assert main(["sweep", str(spec), "--backend", "local", "--out", str(out)]) == 1
    index = {t["name"]: t for t in json.loads((out / "trials.json").read_text())["trials"]}
    assert index["seed-1"]["status"] == "done"
    assert index["seed-0"]["status"] == "failed"
    assert index["seed-0"]["error"] == f"{out / 'seed-0' / 'config.yaml'}: {os.strerror(error)}"
    assert "Traceback" not in capsys.readouterr().err
    monkeypatch.undo()
    assert main(["sweep", str(spec), "--backend", "local", "--out", str(out)]) == 0


def test_run_out_must_be_new_or_empty(tmp_path, capsys):
    cfg = _cfg_file(tmp_path, rounds=1)
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    assert main(["run", str(cfg), "--out", str(taken), "--no-progress"]) == 2
    _one_error_line(capsys, f"--out: {taken} already exists and is not empty", "--resume")
    assert main(["run", str(cfg), "--out", str(cfg), "--no-progress"]) == 2
    _one_error_line(capsys, f"--out: {cfg}: exists and is not a directory")
    stale = tmp_path / "stale"  # a killed run's directory holding only its lock file
    stale.mkdir()
    (stale / LOCK_FILE).write_text("123\n")
    assert main(["run", str(cfg), "--out", str(stale), "--no-progress"]) == 0
    assert _summary(stale)["status"] == "ok" and not (stale / LOCK_FILE).exists()


def test_two_runs_racing_for_one_name_get_two_directories(tmp_path, monkeypatch):
    mkdir = Path.mkdir
    target = tmp_path / "runs" / "race"

    def other_process_first(self, *args, **kwargs):
        if self == target and not self.exists():
            mkdir(self, parents=True)  # the racing run creates it first
        return mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", other_process_first)
    cfg = tiny_config(rounds=1, **{"output.out_dir": str(tmp_path / "runs"), "output.name": "race"})
    result = splitfl.run(cfg)
    assert result.run_dir == tmp_path / "runs" / "race-1"
    assert _summary(result.run_dir)["status"] == "ok"


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("output.out_dir={f}", "output.out_dir: {f}: exists and is not a directory"),
        ("output.out_dir={f}/sub", "output.out_dir: {f}/sub: {f} is a file"),
        ("output.name=" + "n" * 300, "output.name: 300 bytes long; at most 247"),
        ("output.out_dir={t}/" + "d" * 300, "bytes is longer than the limit of 255"),
    ],
)
def test_validate_refuses_output_paths_that_run_would_refuse(override, message, tmp_path, capsys):
    cfg = _cfg_file(tmp_path, rounds=1)
    fill = {"f": str(cfg), "t": str(tmp_path)}
    for command in ("validate", "run"):
        assert main([command, str(cfg), override.format(**fill)]) == 2
        _one_error_line(capsys, message.format(**fill))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cfg.yaml"]


def test_trial_names_of_many_axes_fit_the_file_system(tmp_path):
    values = {f"options.s2fl.axis_{i}": "v" * 30 + str(i) for i in range(12)}
    name = trial_name(values)
    assert len(name) == MAX_TRIAL_NAME and name != trial_name({**values, "seed": 1})
    assert name == trial_name(dict(values))  # stable
    (tmp_path / name).mkdir()
    assert trial_name({"seed": 0}) == "seed-0"  # short names unchanged


def test_a_lock_file_removed_by_its_finishing_owner_is_never_trusted(tmp_path):
    with hold_lock(tmp_path):
        stale = open(tmp_path / LOCK_FILE, "a+")  # noqa: SIM115 - a second process's handle
    assert not (tmp_path / LOCK_FILE).exists()  # removed at release
    try:
        fcntl.flock(stale, fcntl.LOCK_EX | fcntl.LOCK_NB)  # it locks the removed file ...
        assert not dirlock._same_file(stale, tmp_path / LOCK_FILE)  # ... so it must retry
        with hold_lock(tmp_path):  # and a third process locks the new file
            assert (tmp_path / LOCK_FILE).exists()
    finally:
        stale.close()

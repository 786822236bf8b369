"""Run-directory fuzzer: file-system faults during runs and sweeps, and damaged files under
``splitfl report`` and ``splitfl sweep --resume``; a run directory must never lie.

Faults (``run`` and ``sweep`` through :func:`splitfl.cli.main.main`, in-process): a clean
run is instrumented to list its file-system events (the byte writes, ``fsync`` and renames
of :mod:`splitfl.core.atomic`, the appends to ``metrics.jsonl``, ``mkdir``); then, for every
event, the run is repeated with a fault there: ``ENOSPC`` or ``EROFS`` once or from then on
(a full disk that stays full), half the bytes written before ``ENOSPC``, or ``SIGKILL``
(a forked child killed at the event, half its bytes written). After each case the faults
stop and the directory is checked: a ``summary.json`` saying ``ok`` must come with a
``model.pt`` and metrics equal to an uninterrupted run's; no temporary file may be left by a
process that was not killed; and ``splitfl run --resume`` (or the same command again, when
the run left nothing behind) must finish with exactly the uninterrupted run's rows and model.

Damage (``report``): every file a report reads in a two-trial sweep — ``trials.json``,
``summary.json``, ``error.json``, ``config.yaml``, ``metrics.jsonl`` — truncated, replaced
by garbage, by JSON/YAML of the wrong shape or by a directory, or with a field it needs
removed or of the wrong type; ``report.md`` a directory; bad ``--target``/``--out``. Each
must be a one-line error (exit 2) or a report that names the damaged file in a warning, and
no input file may change. The same damage to finished trials under ``sweep --resume`` must
be repaired (exit 0) or refused in one line.

Counts: cases, one-line errors, warnings naming the damage, tracebacks (must be 0), silent
acceptances (a fault or a damaged file that nothing reported; must be 0), lies (``ok``
without the right model or rows), leftover temporary files, data lost (a recovery that does
not equal the uninterrupted run, or input files a report changed); each must be 0.

    PYTHONPATH=src python benchmarks/fuzz_rundir.py [--quick] [--show 10]
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import hashlib
import io
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml

from splitfl.cli.main import main
from splitfl.core import atomic
from splitfl.experiment import recorder
from splitfl.testing import tiny_config

CFG = tiny_config(rounds=2, **{"output.checkpoint_every": 1})
KINDS = ("write", "fsync", "replace", "append", "mkdir")


@dataclass
class Outcome:
    """What one case did: its class (one-line, warned, recovered, traceback, silent, ...)."""

    case: str
    result: str
    detail: str = ""


# ----------------------------------------------------------------------------- faults


class Faults:
    """Counts file-system events (``KINDS``) under ``root`` and injects one fault kind at
    event number ``at`` (of any kind): ``enospc``/``erofs`` once or ``sticky`` from then
    on, ``half`` (half the bytes, then ENOSPC) or ``kill`` (half the bytes, then SIGKILL)."""

    def __init__(self, root: Path, at: int | None = None, fault: str = "", sticky: bool = False):
        self.root, self.at, self.fault, self.sticky = str(root), at, fault, sticky
        self.events: list[str] = []

    def hit(self, kind: str, path: str, partial: Callable[[], None] | None = None) -> None:
        """Record an event; raise (or die) if the fault is due."""
        if not path.startswith(self.root):
            return
        self.events.append(f"{kind}:{Path(path).name}")
        n = len(self.events)
        due = self.at is not None and (n == self.at or (self.sticky and n > self.at))
        if not due:
            return
        if self.fault in ("half", "kill") and partial is not None:
            partial()
        if self.fault == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        code = errno.EROFS if self.fault == "erofs" else errno.ENOSPC
        raise OSError(code, os.strerror(code))

    @contextlib.contextmanager
    def installed(self):
        """The hooks: :mod:`splitfl.core.atomic`'s ``os`` (write, fsync, replace), the recorder's
        ``append_text`` and ``Path.mkdir``."""
        real_os, real_append, real_mkdir = atomic.os, recorder.append_text, Path.mkdir
        faults = self

        class HookedOs:
            def __getattr__(self, name):
                return getattr(real_os, name)

            @staticmethod
            def write(fd, data):
                name = real_os.readlink(f"/proc/self/fd/{fd}")
                faults.hit("write", name, lambda: real_os.write(fd, bytes(data[: len(data) // 2])))
                return real_os.write(fd, data)

            @staticmethod
            def fsync(fd):
                faults.hit("fsync", real_os.readlink(f"/proc/self/fd/{fd}"))
                return real_os.fsync(fd)

            @staticmethod
            def replace(src, dst):
                faults.hit("replace", str(dst))
                return real_os.replace(src, dst)

        def append(path, text):
            half = lambda: real_append(path, text[: len(text) // 2])  # noqa: E731
            faults.hit("append", str(path), half)
            return real_append(path, text)

        def mkdir(self_path, *args, **kwargs):
            if not self_path.exists():
                faults.hit("mkdir", str(self_path))
            return real_mkdir(self_path, *args, **kwargs)

        atomic.os, recorder.append_text, Path.mkdir = HookedOs(), append, mkdir
        try:
            yield self
        finally:
            atomic.os, recorder.append_text, Path.mkdir = real_os, real_append, real_mkdir


def cli(args: list[str]) -> tuple[int | str, str, str]:
    """``splitfl ARGS`` in-process: (exit code or ``"traceback"``, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code: int | str = main(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:  # noqa: BLE001 - counting them is the point
            code = "traceback"
            traceback.print_exc(file=err)
    return code, out.getvalue(), err.getvalue()


def forked(fn: Callable[[], None], limit: float = 300.0) -> int:
    """Run ``fn`` in a forked child; its exit status (-9 when killed)."""
    pid = os.fork()
    if pid == 0:  # child
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            fn()
        finally:
            os._exit(0)
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -999


# ----------------------------------------------------------------------------- run checks


def _rows(run_dir: Path) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(x).items() if k != "wall_time"} for x in lines]


def _model(run_dir: Path) -> dict:
    return torch.load(run_dir / "model.pt", weights_only=True)


def _equal(run_dir: Path, ref: Path) -> bool:
    try:
        a, b = _model(run_dir), _model(ref)
        same_model = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        return same_model and _rows(run_dir) == _rows(ref)
    except Exception:  # noqa: BLE001 - a damaged file is "not equal"
        return False


def _status(run_dir: Path) -> str | None:
    try:
        return json.loads((run_dir / "summary.json").read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None


def _tmp_files(folder: Path) -> list[Path]:
    return list(folder.rglob(f"{atomic.TMP_PREFIX}*")) if folder.exists() else []


def _one_line_error(code: int | str, err: str) -> bool:
    return code == 2 and err.count("\n") == 1 and err.startswith("error: ")


def check_run_dir(run_dir: Path, ref: Path, killed: bool) -> list[str]:
    """Problems of a faulted run directory before recovery: ``lie``, ``tmp``."""
    problems = []
    if run_dir.exists() and _status(run_dir) == "ok" and not _equal(run_dir, ref):
        problems.append("lie")
    if not killed and _tmp_files(run_dir):
        problems.append("tmp")
    return problems


def recover_run(cfg: Path, run_dir: Path, ref: Path) -> list[str]:
    """Resume (or rerun, if nothing was left) with faults off; ``data lost`` unless the
    result equals the uninterrupted run and holds no temporary or lock file."""
    if run_dir.exists() and (run_dir / "config.yaml").exists():
        code, _, err = cli(["run", "--resume", str(run_dir), "--no-progress"])
    else:
        left = [p.name for p in run_dir.iterdir()] if run_dir.exists() else []
        if any(not n.startswith((".splitfl.lock", atomic.TMP_PREFIX)) for n in left):
            return [f"data lost (half-made directory: {sorted(left)})"]
        code, _, err = cli(["run", str(cfg), "--out", str(run_dir), "--no-progress"])
    if code != 0:
        return [f"data lost (recovery exit {code}: {err.strip()[-200:]})"]
    leftovers = _tmp_files(run_dir) + [p for p in [run_dir / ".splitfl.lock"] if p.exists()]
    if leftovers or not _equal(run_dir, ref):
        return ["data lost (recovered run differs or left files)"]
    return []


def run_cases(work: Path, quick: bool) -> list[Outcome]:
    cfg = work / "cfg.yaml"
    cfg.write_text(yaml.safe_dump(CFG))
    ref = work / "ref"
    probe = Faults(work)
    with probe.installed():
        code, _, err = cli(["run", str(cfg), "--out", str(ref), "--no-progress"])
    assert code == 0, err
    events = probe.events
    print(f"run: {len(events)} file-system events in a clean 2-round run")
    faults = [
        ("enospc", False),
        ("enospc", True),
        ("erofs", True),
        ("half", False),
        ("kill", False),
    ]
    if quick:
        faults = [("enospc", True), ("half", False), ("kill", False)]
    outcomes = []
    for at in range(1, len(events) + 1):
        for fault, sticky in faults:
            name = f"run {fault}{'-sticky' if sticky else ''} at {at} ({events[at - 1]})"
            outcomes.append(
                _run_case(work / f"c{at}-{fault}{int(sticky)}", cfg, ref, at, fault, sticky, name)
            )
    return outcomes


def _run_case(case_dir, cfg, ref, at, fault, sticky, name) -> Outcome:  # noqa: ANN001
    run_dir = case_dir / "run"
    case_dir.mkdir()
    faults = Faults(case_dir, at, fault, sticky)
    args = ["run", str(cfg), "--out", str(run_dir), "--no-progress"]
    if fault == "kill":

        def child():
            with faults.installed():
                cli(args)

        status = forked(child)
        code, err, result = status, "", ("killed" if status == -9 else f"exit {status}")
        if status == -999:
            return Outcome(name, "hang")
    else:
        with faults.installed():
            code, _, err = cli(args)
        result = "one-line" if _one_line_error(code, err) else None
        if code == "traceback":
            return Outcome(name, "traceback", err.strip().splitlines()[-1])
        if code == 0:
            return Outcome(name, "silent", "exit 0 although a write failed")
        if result is None:
            return Outcome(name, "not one line", err.strip()[:200])
    problems = check_run_dir(run_dir, ref, killed=fault == "kill")
    problems += recover_run(cfg, run_dir, ref)
    shutil.rmtree(case_dir, ignore_errors=True)
    if problems:
        return Outcome(name, problems[0].split(" (")[0], "; ".join(problems))
    return Outcome(name, result)


# ----------------------------------------------------------------------------- sweeps


def _sweep_files(work: Path) -> Path:
    (work / "base.yaml").write_text(yaml.safe_dump(tiny_config(rounds=1)))
    spec = work / "sw.yaml"
    spec.write_text(yaml.safe_dump({"base": "base.yaml", "axes": {"seed": [0, 1]}}))
    return spec


def sweep_cases(work: Path, quick: bool) -> list[Outcome]:
    """A full disk from every event of a clean 2-trial sweep on (exit 1 or 2 in one line,
    never a traceback), or SIGKILL at it; the same sweep afterwards finishes with the
    clean sweep's runs."""
    spec = _sweep_files(work)
    ref = work / "ref"
    probe = Faults(ref)
    with probe.installed():
        code, _, err = cli(["sweep", str(spec), "--backend", "local", "--out", str(ref)])
    assert code == 0, err
    print(f"sweep: {len(probe.events)} file-system events in a clean 2-trial sweep")
    step = 3 if quick else 1
    outcomes = []
    for at in range(1, len(probe.events) + 1, step):
        for fault in ("enospc", "kill"):
            name = f"sweep {fault} at {at} ({probe.events[at - 1]})"
            outcomes.append(_sweep_case(work / f"s{at}{fault}", spec, ref, at, fault, name))
    return outcomes


def _sweep_case(out: Path, spec: Path, ref: Path, at: int, fault: str, name: str) -> Outcome:
    args = ["sweep", str(spec), "--backend", "local", "--out", str(out)]
    faults = Faults(out, at, fault, sticky=fault == "enospc")
    if fault == "kill":

        def child():
            with faults.installed():
                cli(args)

        status = forked(child)
        code, err, result = status, "", "killed" if status == -9 else f"exit {status}"
        if status == -999:
            return Outcome(name, "hang")
    else:
        with faults.installed():
            code, _, err = cli(args)
        if code == "traceback":
            return Outcome(name, "traceback", err.strip().splitlines()[-1])
        if code == 0:
            return Outcome(name, "silent", "exit 0 although a write failed")
        lines = [x for x in err.splitlines() if x.strip()]
        result = "one-line" if code in (1, 2) and len(lines) <= 1 else "not one line"
    code, _, err = cli(args)
    same = code == 0 and all(_equal(out / t, ref / t) for t in ("seed-0", "seed-1"))
    if not same or _tmp_files(out) or (out / ".splitfl.lock").exists():
        result = "data lost"
        err = f"recovery exit {code}: {err.strip()[-200:]}"
    shutil.rmtree(out, ignore_errors=True)
    return Outcome(name, result, "" if result in ("one-line", "killed") else err[:200])


# ----------------------------------------------------------------------------- damage


def _cut(frac: float) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(data[: max(0, min(len(data) - 1, int(len(data) * frac)))])

    return damage


def _text(text: str | bytes) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        path.write_bytes(text if isinstance(text, bytes) else text.encode())

    return damage


def _directory(path: Path) -> None:
    path.unlink()
    path.mkdir()


def _json_edit(edit: Callable[[dict], None]) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        data = json.loads(path.read_text())
        edit(data)
        path.write_text(json.dumps(data))

    return damage


def _row_edit(key: str, value) -> Callable[[Path], None]:  # noqa: ANN001
    def damage(path: Path) -> None:
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        if value is _DROP:
            rows[-1].pop(key)
        else:
            rows[-1][key] = value
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))

    return damage


_DROP = object()
WHOLE_FILE = {
    **{f"cut {f}": _cut(f) for f in (0.0, 0.1, 0.5, 0.9)},
    "garbage": _text(b"\x00\xff\xfe garbage {["),
    "non-utf8": _text(b"\xff\xfe\xfd"),
    "a directory": _directory,
}
JSON_SHAPES = {
    "a list": _text("[1, 2]"),
    "a number": _text("7"),
    "null": _text("null"),
    "last byte cut": _cut(0.9999),
}
YAML_SHAPES = {"a list": _text("- 1\n- 2\n"), "a scalar": _text("7\n"), "bad yaml": _text("a: [")}
FIELDS = ("round", "sim_time", "avg_waiting", "traffic_total_cum", "test_acc", "test_loss")
ROW_EDITS = {
    **{
        f"row without {k}": _row_edit(k, _DROP)
        for k in FIELDS
        if k not in ("test_acc", "test_loss")
    },
    **{f"{k} text": _row_edit(k, "x") for k in FIELDS},
    **{f"{k} NaN": _row_edit(k, float("nan")) for k in FIELDS},
    **{f"{k} bool": _row_edit(k, True) for k in FIELDS},
    "rows lost at a line end": lambda p: p.write_text(
        "".join(p.read_text().splitlines(keepends=True)[:-1])
    ),
}
SUMMARY_EDITS = {
    "status a number": _json_edit(lambda d: d.update(status=5)),
    "rounds text": _json_edit(lambda d: d.update(rounds="2")),
    "rounds missing": _json_edit(lambda d: d.pop("rounds")),
}
INDEX_EDITS = {
    "trials a dict": _json_edit(lambda d: d.update(trials={})),
    "axes text": _json_edit(lambda d: d.update(axes="seed")),
    "entry a list": _json_edit(lambda d: d["trials"].__setitem__(0, [])),
    "dir escapes": _json_edit(lambda d: d["trials"][0].update(dir="../..")),
    "dir missing": _json_edit(lambda d: d["trials"][0].pop("dir")),
    "values a list": _json_edit(lambda d: d["trials"][0].update(values=[1])),
    "name a number": _json_edit(lambda d: d["trials"][0].update(name=3)),
}


def damage_table() -> list[tuple[str, str, Callable[[Path], None]]]:
    """(file relative to the sweep directory, damage name, damage)."""
    out = []
    for name, fn in {**WHOLE_FILE, **JSON_SHAPES, **INDEX_EDITS}.items():
        out.append(("trials.json", name, fn))
    for trial in ("seed-0", "seed-1"):
        for name, fn in {**WHOLE_FILE, **JSON_SHAPES, **SUMMARY_EDITS}.items():
            out.append((f"{trial}/summary.json", name, fn))
        for name, fn in {**WHOLE_FILE, **JSON_SHAPES}.items():
            out.append((f"{trial}/error.json", name, fn))
        for name, fn in {
            **YAML_SHAPES,
            "rounds text": _text("rounds: x\n"),
            "a directory": _directory,
            "non-utf8": _text(b"\xff\xfe\xfd"),
        }.items():
            out.append((f"{trial}/config.yaml", name, fn))
        for name, fn in {**WHOLE_FILE, **ROW_EDITS}.items():
            out.append((f"{trial}/metrics.jsonl", name, fn))
    return out


def _tree_hash(folder: Path, skip: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.is_file() and not p.name.startswith(skip):
            h.update(str(p.relative_to(folder)).encode() + p.read_bytes())
    return h.hexdigest()


REPORT_FILES = ("report.", "accuracy_vs_time", "waiting", "traffic_to_target")


def report_cases(work: Path, quick: bool) -> list[Outcome]:
    spec = _sweep_files(work)
    clean = work / "clean"
    code, _, err = cli(["sweep", str(spec), "--backend", "local", "--out", str(clean)])
    assert code == 0, err
    table = damage_table()[:: 3 if quick else 1]
    extra = [
        ("report.md", "a directory", _directory),
        *(("", f"--target {t}", None) for t in ("5", "nan", "-1", "0")),
        ("", "--out a file", None),
    ]
    outcomes = []
    for i, (rel, name, damage) in enumerate(table + extra):
        case = work / f"r{i}"
        shutil.copytree(clean, case)
        args = ["report", str(case)]
        if rel.endswith("error.json"):  # a failed trial's record, then damaged
            (case / rel).write_text(json.dumps({"status": "failed", "error": "x"}))
        if damage is not None:
            damage(case / rel)
        elif name.startswith("--target"):
            args += name.split()
        else:
            (case / "f").write_text("x")
            args += ["--out", str(case / "f")]
        before = _tree_hash(case, REPORT_FILES)
        code, _, err = cli(args)
        label = f"report: {rel or 'args'} {name}"
        outcomes.append(_classify_report(label, code, err, Path(rel).name))
        if _tree_hash(case, REPORT_FILES) != before:
            outcomes.append(Outcome(label, "data lost", "the report changed an input file"))
        shutil.rmtree(case, ignore_errors=True)
    outcomes += resume_cases(work, clean, table)
    return outcomes


def _classify_report(label: str, code, err: str, file_name: str) -> Outcome:  # noqa: ANN001
    if code == "traceback":
        return Outcome(label, "traceback", err.strip().splitlines()[-1])
    if _one_line_error(code, err):
        return Outcome(label, "one-line")
    warned = [x for x in err.splitlines() if x.startswith("warning: damaged run")]
    if code == 0 and warned and all(x.count("\n") == 0 for x in warned):
        named = any(file_name in x for x in warned)
        return Outcome(label, "warned" if named else "silent", "" if named else warned[0])
    return Outcome(label, "silent" if code == 0 else "not one line", err.strip()[:200])


def resume_cases(work: Path, clean: Path, table) -> list[Outcome]:  # noqa: ANN001
    """Damaged files of finished trials under ``sweep --resume``: repaired or one line."""
    outcomes = []
    for i, (rel, name, damage) in enumerate(table):
        if rel.endswith("error.json"):
            continue  # an error.json beside a finished run: not a file a resume reads
        case = work / f"q{i}"
        shutil.copytree(clean, case)
        damage(case / rel)
        code, _, err = cli(["sweep", "--resume", str(case), "--backend", "local"])
        label = f"sweep --resume: {rel} {name}"
        if code == "traceback":
            outcomes.append(Outcome(label, "traceback", err.strip().splitlines()[-1]))
        elif code == 0:
            trials = ("seed-0", "seed-1")
            ok = all(_equal(case / t, clean / t) for t in trials) and not _tmp_files(case)
            outcomes.append(Outcome(label, "recovered" if ok else "data lost"))
        else:  # 2: refused in one line; 1: a trial failed, recorded in trials.json
            one = code in (1, 2) and len([x for x in err.splitlines() if x.strip()]) <= 1
            outcomes.append(Outcome(label, "one-line" if one else "not one line", err[:200]))
        shutil.rmtree(case, ignore_errors=True)
    return outcomes


# ----------------------------------------------------------------------------- main


def main_fuzz(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer fault kinds and damages")
    parser.add_argument("--show", type=int, default=10, help="failing cases to list")
    parser.add_argument("--only", choices=("run", "sweep", "report"), help="one part")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="fuzz-rundir-") as tmp:
        work = Path(tmp)
        for part, fn in (("run", run_cases), ("sweep", sweep_cases), ("report", report_cases)):
            if args.only in (None, part):
                (work / part).mkdir()
                outcomes += fn(work / part, args.quick)
    counts = Counter(o.result for o in outcomes)
    part = lambda o: "resume" if o.case.startswith("sweep --resume") else o.case.split()[0]  # noqa: E731
    for (name, result), n in sorted(Counter((part(o), o.result) for o in outcomes).items()):
        print(f"  {name:8s} {result:14s} {n}")
    print(f"cases: {len(outcomes)} in {time.perf_counter() - start:.0f} s")
    for key in ("one-line", "warned", "recovered", "killed"):
        print(f"  {key:28s} {counts.get(key, 0)}")
    bad = ("traceback", "silent", "lie", "tmp", "data lost", "not one line", "hang")
    for key in bad:
        print(f"  {key:28s} {counts.get(key, 0)}")
    failing = [o for o in outcomes if o.result in bad]
    for o in failing[: args.show]:
        print(f"  ! {o.result}: {o.case}: {o.detail}")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main_fuzz())

"""Every code block of ``README.md`` and ``docs/`` runs, or is checked as far as it can be
here. A block's mode is the HTML comment on the line above it (blank lines between allowed):

    <!-- snippet: MODE [ARGS] [| PROGRAM: why it is not run; ...] -->

* ``run [key=value ...]``: bash — every command runs, in a fresh folder holding the
  repository's ``configs/`` and ``benchmarks/`` and a copy of ``examples/``: ``splitfl ...``
  in this process with the overrides appended to each command that takes them (a long run
  becomes ``rounds=1``), ``cd DIR``, ``python FILE ...`` in a subprocess; python — executed
  there, ``splitfl.run``/``compare``/``sweep`` given the overrides too.
* ``validate``: nothing runs; each ``splitfl`` command's flags are parsed by the CLI's parser
  and its config loaded through ``splitfl.load_config`` with its overrides (``compare``: once
  per algorithm; ``sweep``: every trial), ``python FILE`` compiled; python blocks compiled.
* ``skip REASON``: not run here (a deployment across machines, a GPU, the whole suite); its
  ``splitfl`` flags are still parsed and the configs it names that exist loaded; a YAML block
  is read against the schema (types, ranges, unknown keys), registries not consulted.
* ``excerpt PATH``: every line of the block is a line of ``PATH`` (a file that a test runs).
* ``sweep``: a YAML sweep file: loaded by the sweep loader, every trial's config validated.
* ``config [dir=PATH]``: a YAML config loaded through ``splitfl.load_config`` (the default
  for YAML); ``dir``: the folder it sits in (its ``imports:``).
* ``known-issue REASON``: a YAML block that fails to load today (strict xfail: fixed, the
  marker must go).

``PROGRAM: why`` names programs of a ``run``/``validate`` block that are not run (``pip``:
installing is the environment's job). A bash or python block without a marker fails; other
languages (``text``, ``toml``, output) are not code to run.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import py_compile
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKER = re.compile(r"^<!-- snippet: (.*?) -->$")
MODES = ("run", "validate", "skip", "excerpt", "sweep", "config", "known-issue")
CODE = ("bash", "sh", "python", "yaml")
#: splitfl commands whose trailing key=value arguments are config overrides
TAKES_OVERRIDES = ("run", "compare", "validate", "sweep", "launch", "server")


@dataclass
class Block:
    file: Path
    line: int
    lang: str
    code: str
    mode: str
    args: list[str]
    not_run: dict[str, str]

    @property
    def id(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}:{self.mode}"


def _marker(lines: list[str], fence: int) -> str | None:
    i = fence - 1
    while i >= 0 and not lines[i].strip():
        i -= 1
    match = MARKER.match(lines[i].strip()) if i >= 0 else None
    return match.group(1) if match else None


def blocks(path: Path) -> list[Block]:
    lines = path.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang = lines[i][3:].strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            marker = _marker(lines, i)
            spec, _, rest = (marker or "").partition("|")
            words = shlex.split(spec)
            not_run = {}
            for item in filter(None, (p.strip() for p in rest.split(";"))):
                prog, _, why = item.partition(":")
                not_run[prog.strip()] = why.strip()
            mode = words[0] if words else ("config" if lang == "yaml" else "")
            out.append(
                Block(path, i + 1, lang, "\n".join(lines[i + 1 : end]), mode, words[1:], not_run)
            )
            i = end
        i += 1
    return [b for b in out if b.lang in CODE]


ALL = [b for f in FILES for b in blocks(f)]


def test_every_code_block_is_marked():
    bad = [b.id for b in ALL if b.mode not in MODES]
    assert not bad, f"code blocks without a snippet marker (see {__name__}): {bad}"
    for b in ALL:
        if b.mode in ("skip", "known-issue"):
            assert b.args, f"{b.id}: say why it is not run"
        for prog, why in b.not_run.items():
            assert why, f"{b.id}: say why {prog} is not run"


# --- shell -----------------------------------------------------------------------------------


def commands(code: str) -> list[list[str]]:
    """The block's commands as argv lists (continuations joined, comments dropped, ``&&``
    split)."""
    text = re.sub(r"\\\n", " ", code)
    out = []
    for line in text.splitlines():
        argv: list[str] = []
        for word in shlex.split(line, comments=True):
            if word in ("&&", ";"):
                out.append(argv)
                argv = []
            else:
                argv.append(word)
        out.append(argv)
    return [a for a in out if a]


def splitfl_argv(argv: list[str]) -> list[str] | None:
    """``splitfl ...`` / ``python -m splitfl ...`` → the arguments after it, else None."""
    if argv[0] == "splitfl":
        return argv[1:]
    if argv[:3] in (["python", "-m", "splitfl"], ["python3", "-m", "splitfl"]):
        return argv[3:]
    return None


def parse_cli(argv: list[str]):
    from splitfl.cli.main import build_parser

    try:
        args, _ = build_parser().parse_known_args(argv)
    except SystemExit as err:
        raise AssertionError(f"splitfl {' '.join(argv)}: the CLI refuses these arguments") from err
    return args


def check_configs(argv: list[str], cwd: Path, need_files: bool) -> None:
    """Load the config a ``splitfl`` command names, with its overrides, as the command
    would before it runs anything."""
    import splitfl
    from splitfl.sweeps.spec import expand, load_sweep

    args = parse_cli(argv)
    positional = [a for a in getattr(args, "args", None) or [] if "=" not in a]
    overrides = [a for a in [*(getattr(args, "args", None) or []), *argv] if _is_override(a)]
    overrides = list(dict.fromkeys(overrides))
    imports = getattr(args, "imports", None) or None
    target = positional[0] if positional else getattr(args, "config", None)
    if args.command not in ("run", "compare", "validate", "sweep", "launch", "server"):
        return
    if getattr(args, "resume", None) or target is None:
        return
    path = cwd / target
    if Path(target).stem.isupper():  # a placeholder: CONFIG.yaml, SWEEP.yaml
        return
    if not path.is_file():
        assert not need_files, f"splitfl {' '.join(argv)}: {target} does not exist"
        return
    with _chdir(cwd):
        if args.command == "sweep":
            trials = expand(load_sweep(path, overrides))
            bad = [t.error for t in trials if t.config is None]
            assert not bad, bad
        elif args.command == "compare":
            for algorithm in args.algorithms.split(","):
                splitfl.load_config(path, [*overrides, f"algorithm={algorithm}"], imports)
        else:
            splitfl.load_config(path, overrides, imports)


def _is_override(word: str) -> bool:
    return "=" in word and not word.startswith("-")


@contextlib.contextmanager
def _chdir(path: Path):
    old = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def sandbox(tmp_path: Path) -> Path:
    """A folder where the docs' relative paths resolve: the repository's ``configs/`` and
    ``benchmarks/`` (read), a copy of ``examples/`` (runs write next to their configs)."""
    box = tmp_path / "repo"
    box.mkdir()
    for name in ("configs", "benchmarks"):
        (box / name).symlink_to(ROOT / name)
    shutil.copytree(
        ROOT / "examples", box / "examples", ignore=shutil.ignore_patterns("runs", "__pycache__")
    )
    return box


def run_shell(block: Block, box: Path, execute: bool) -> None:
    from splitfl.cli.main import main

    cwd = box
    for argv in commands(block.code):
        rest = splitfl_argv(argv)
        if argv[0] == "cd":
            cwd = cwd / argv[1]
            assert cwd.is_dir(), f"{block.id}: cd {argv[1]}: no such folder"
        elif rest is not None:
            if "..." in rest:  # arguments elided in the text: nothing to parse
                continue
            if not execute:
                check_configs(rest, cwd, need_files=block.mode != "skip")
                continue
            parse_cli(rest)
            if rest[0] in TAKES_OVERRIDES and "--resume" not in rest:
                rest = [*rest, *block.args]
            with _chdir(cwd):
                code = main(rest)
            assert code == 0, f"{block.id}: splitfl {' '.join(rest)} exited {code}"
        elif argv[0] in ("python", "python3") and argv[1].endswith(".py"):
            script = cwd / argv[1]
            assert script.is_file(), f"{block.id}: {argv[1]} does not exist"
            if not execute:
                py_compile.compile(str(script), doraise=True)
                continue
            env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
            subprocess.run([sys.executable, *argv[1:]], cwd=cwd, env=env, check=True)
        elif block.mode == "skip":
            continue
        else:
            assert argv[0] in block.not_run, (
                f"{block.id}: `{' '.join(argv)}` is not run: name {argv[0]} in the marker "
                "with the reason (| PROGRAM: why)"
            )


# --- python ----------------------------------------------------------------------------------


def _with_overrides(fn, extra: list[str]):
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.arguments["overrides"] = [*(bound.arguments.get("overrides") or []), *extra]
        return fn(*bound.args, **bound.kwargs)

    return wrapper


def run_python(block: Block, box: Path, monkeypatch) -> None:
    import splitfl

    for name in ("run", "compare", "sweep"):
        monkeypatch.setattr(splitfl, name, _with_overrides(getattr(splitfl, name), block.args))
    code = compile(block.code, block.id, "exec")
    with _chdir(box):
        exec(code, {"__name__": "__snippet__"})


# --- yaml ------------------------------------------------------------------------------------


def check_yaml(block: Block, box: Path) -> None:
    import splitfl
    from splitfl.config import load_config as read_against_schema
    from splitfl.sweeps.spec import expand, load_sweep

    folder = box
    for arg in block.args:
        if arg.startswith("dir="):
            folder = box / arg[4:]
    path = folder / f"snippet-{block.line}.yaml"
    path.write_text(block.code + "\n")
    with _chdir(folder):
        if block.mode == "sweep":
            trials = expand(load_sweep(path))
            assert trials and all(t.config is not None for t in trials), [t.error for t in trials]
        elif block.mode == "skip":
            read_against_schema(path)
        else:
            splitfl.load_config(path)


# --- the test --------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [b for b in ALL if b.mode in MODES], ids=lambda b: b.id)
def test_snippet(block: Block, tmp_path, monkeypatch):
    if block.mode == "excerpt":
        source = (ROOT / block.args[0]).read_text().splitlines()
        have = {line.strip() for line in source}
        missing = [s for s in block.code.splitlines() if s.strip() and s.strip() not in have]
        assert not missing, f"{block.id}: not in {block.args[0]}: {missing[:3]}"
        return
    box = sandbox(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "src"))
    if block.lang == "yaml":
        if block.mode == "known-issue":
            with pytest.raises(Exception):  # noqa: B017 - any failure to load
                check_yaml(block, box)
            pytest.xfail(" ".join(block.args))
        check_yaml(block, box)
    elif block.lang == "python":
        if block.mode == "run":
            run_python(block, box, monkeypatch)
        else:
            compile(block.code, block.id, "exec")
    else:
        run_shell(block, box, execute=block.mode == "run")

"""What software wrote a run directory: ``version.json`` (splitfl's version, and the git
commit with a dirty flag when splitfl runs from a git checkout; torch and Python versions).

Written atomically by every process that starts or resumes the run, so it names the software
that wrote the newest rows. The commit is read from the checkout's files (``HEAD``, loose and
packed refs, worktrees) without running git; only the dirty flag asks ``git status`` (None
where git is missing or fails).
"""

from __future__ import annotations

import json
import platform
import subprocess
import tomllib
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import torch

from splitfl.core.atomic import write_atomic

VERSION_FILE = "version.json"


def checkout_root() -> Path | None:
    """The git checkout splitfl's own source lies in (``ROOT/src/splitfl`` or
    ``ROOT/splitfl``), or None (an installed wheel; a venv inside another repository)."""
    package = Path(__file__).resolve().parents[1]  # splitfl/experiment/provenance.py
    for root in (package.parent.parent, package.parent):
        if (root / ".git").exists() and package in (root / "src" / "splitfl", root / "splitfl"):
            return root
    return None


def git_dir(root: Path) -> Path | None:
    """``root/.git``, or the folder a ``.git`` file (a worktree, a submodule) points to."""
    dot = root / ".git"
    if dot.is_dir():
        return dot
    try:
        text = dot.read_text().strip()
    except OSError:
        return None
    if not text.startswith("gitdir:"):
        return None
    target = Path(text[len("gitdir:") :].strip())
    return target if target.is_absolute() else (root / target).resolve()


def head_commit(gitdir: Path) -> str | None:
    """The commit ``HEAD`` names (detached, a loose ref or a packed one), or None."""
    try:
        head = (gitdir / "HEAD").read_text().strip()
        if not head.startswith("ref:"):
            return head or None
        ref = head[len("ref:") :].strip()
        common = gitdir
        if (gitdir / "commondir").is_file():
            common = (gitdir / (gitdir / "commondir").read_text().strip()).resolve()
        for base in (gitdir, common):
            if (base / ref).is_file():
                return (base / ref).read_text().strip()
        packed = common / "packed-refs"
        lines = packed.read_text().splitlines() if packed.is_file() else []
    except OSError:
        return None
    for line in lines:
        sha, _, name = line.partition(" ")
        if name.strip() == ref:
            return sha
    return None


def is_dirty(root: Path) -> bool | None:
    """Whether tracked files differ from the commit (``git status``); None if unknown."""
    try:
        out = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return bool(out.stdout.strip())


def splitfl_version() -> str | None:
    """splitfl's version (``pyproject.toml``'s, as ``splitfl.__version__``): the installed
    distribution's, else that of the checkout splitfl runs from; None if neither is found."""
    try:
        return version("splitfl")
    except PackageNotFoundError:
        pass
    root = checkout_root()
    try:
        project = tomllib.loads((root / "pyproject.toml").read_text()) if root else {}
    except (OSError, tomllib.TOMLDecodeError):
        return None
    return project.get("project", {}).get("version")


def software_record() -> dict[str, Any]:
    """``version.json``'s content: versions, and the checkout's commit and dirty flag."""
    root = checkout_root()
    gitdir = git_dir(root) if root is not None else None
    return {
        "splitfl_version": splitfl_version(),
        "git_commit": head_commit(gitdir) if gitdir is not None else None,
        "git_dirty": is_dirty(root) if gitdir is not None else None,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "written": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def write_version(run_dir: Path) -> dict[str, Any]:
    """Write ``run_dir/version.json`` atomically; returns its content."""
    record = software_record()
    write_atomic(Path(run_dir) / VERSION_FILE, json.dumps(record, indent=2))
    return record


#: How ``data.json``'s ``class_names`` are ordered.
_CLASS_ORDER = (
    "label k is class_names[k]: image folders' sub-folder names and string labels (CSV, TSV, "
    "JSONL) sorted as Python sorts strings"
)


def write_data_record(ctx, path: Path) -> None:
    """``data.json``: what the model was trained on and takes — the dataset, the per-sample
    input shape and dtype, the classes (their names where the data names them: an image
    folder's class folders, in label order) — and where it was cut (module paths of a
    graph-split model), so ``model.pt`` can be used without the config."""
    bundle, model = ctx.bundle, ctx.model
    record = {
        "dataset": bundle.name,
        "input_shape": [int(d) for d in bundle.input_shape],
        "input_dtype": str(bundle.test.x.dtype).removeprefix("torch."),
        "num_classes": int(bundle.num_classes),
        "class_names": None if bundle.class_names is None else list(bundle.class_names),
        "class_order": None if bundle.class_names is None else _CLASS_ORDER,
        "model": ctx.config.model,
        "cut_points": list(model.cut_names) or list(model.cut_points),
        "parameter_names": "user" if model.origin != "blocks" else "blocks.<i>.<name>",
    }
    write_atomic(path, json.dumps(record, indent=2))

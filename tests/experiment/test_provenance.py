"""``version.json``: the software that wrote a run directory (splitfl version, git commit)."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

import splitfl
from conftest import tiny_config
from splitfl.experiment.provenance import checkout_root, git_dir, head_commit

SHA_A = "a" * 40
SHA_B = "b" * 40


def test_head_commit_reads_loose_packed_and_detached_heads(tmp_path):
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "refs" / "heads" / "main").write_text(SHA_A + "\n")
    assert head_commit(git) == SHA_A
    (git / "refs" / "heads" / "main").unlink()
    (git / "packed-refs").write_text(f"# pack-refs with: peeled\n{SHA_B} refs/heads/main\n")
    assert head_commit(git) == SHA_B
    (git / "HEAD").write_text(SHA_A + "\n")  # detached
    assert head_commit(git) == SHA_A
    (git / "HEAD").write_text("ref: refs/heads/gone\n")
    assert head_commit(git) is None


def test_worktree_git_file_and_common_refs(tmp_path):
    common = tmp_path / "repo" / ".git"
    (common / "refs" / "heads").mkdir(parents=True)
    (common / "refs" / "heads" / "wt").write_text(SHA_B + "\n")
    private = common / "worktrees" / "wt"
    private.mkdir(parents=True)
    (private / "HEAD").write_text("ref: refs/heads/wt\n")
    (private / "commondir").write_text("../..\n")
    checkout = tmp_path / "wt"
    checkout.mkdir()
    (checkout / ".git").write_text(f"gitdir: {private}\n")
    assert git_dir(checkout) == private
    assert head_commit(git_dir(checkout)) == SHA_B


def test_run_directory_records_version_and_commit(tmp_path):
    cfg = tiny_config(rounds=1, **{"output.plots": True})
    result = splitfl.run(cfg, run_dir=tmp_path / "run", progress=False)
    record = json.loads((result.run_dir / "version.json").read_text())
    assert record["splitfl_version"] == splitfl.__version__
    assert set(record) >= {"git_commit", "git_dirty", "torch_version", "python_version"}
    assert not (result.run_dir / ".splitfl.lock").exists()  # a finished run holds no lock
    assert result.wait_plots() and (result.run_dir / "loss.png").is_file()
    root = checkout_root()
    if root is None:  # an installed wheel: no checkout to name
        assert record["git_commit"] is None and record["git_dirty"] is None
        return
    if shutil.which("git") is None:
        pytest.skip("git is not installed: cannot cross-check the commit")
    head = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    assert record["git_commit"] == head
    assert isinstance(record["git_dirty"], bool)

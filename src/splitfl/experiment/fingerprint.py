"""A fingerprint of the data a run read, kept in its checkpoints: a resume after the data
changed would mix two datasets in one run, and is refused in one line naming what changed.

* Files the user brings (``data.format`` under ``data.root``; ``data.test_path``): one entry
  per file, by its path relative to the root (``data.root`` may move: a resume may name
  another folder) — the SHA-256 of its content while the run has hashed at most
  :data:`HASH_BUDGET` bytes in files of at most :data:`SMALL_FILE` bytes each, else its size
  and modification time. A folder of more than :data:`MAX_LISTED` files keeps one entry per
  top-level sub-folder (a digest of its files' paths, sizes and times).
* Data a loader or a callable returns (registered datasets, ``data.dataset:
  package.module:callable``, the embedded digits): the SHA-256 of the loaded tensors (labels
  and in-memory inputs; lazy inputs by their shape and dtype only: a lazily read dataset of
  a loader or callable is compared by its labels), under the key ``loaded data``.

Checkpoints written before fingerprints existed hold none: they resume, with a note that the
data could not be compared.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Any

import torch

from splitfl.config import ConfigError, ExperimentConfig
from splitfl.data import DatasetBundle

#: Files up to this size are fingerprinted by content (SHA-256) ...
SMALL_FILE = 64 << 20
#: ... until this many bytes have been hashed; other files by size and modification time.
HASH_BUDGET = 1 << 30
#: Files listed one by one; a larger folder is summarised per top-level sub-folder.
MAX_LISTED = 2000
LOADED = "loaded data"


def data_fingerprint(config: ExperimentConfig, bundle: DatasetBundle) -> dict[str, str]:
    """``{entry: digest}`` of the data ``config`` reads (``bundle``: what it loaded)."""
    d = config.data
    roots = [("data.root", d.root)] if d.format is not None and d.root else []
    if d.source == "devices" and d.test_path:
        roots = [("data.test_path", d.test_path)]
    if not roots:
        return {LOADED: bundle_digest(bundle)}
    out: dict[str, str] = {}
    budget = [HASH_BUDGET]
    for field, root in roots:
        out.update({f"{field}/{k}": v for k, v in files_fingerprint(Path(root), budget).items()})
    return out


def files_fingerprint(root: Path, budget: list[int]) -> dict[str, str]:
    """The files of ``root`` (a file or a folder), each by its path under ``root``."""
    if root.is_file():
        return {root.name: file_digest(root, budget)}
    files = sorted(p for p in root.rglob("*") if p.is_file())
    if len(files) <= MAX_LISTED:
        return {p.relative_to(root).as_posix(): file_digest(p, budget) for p in files}
    groups: dict[str, Any] = {}
    for p in files:
        rel = p.relative_to(root)
        key = rel.parts[0] + ("/" if len(rel.parts) > 1 else "")
        stat = p.stat()
        line = f"{rel.as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n"
        groups.setdefault(key, hashlib.sha256()).update(line.encode())
    return {k: "listing:" + h.hexdigest() for k, h in groups.items()}


def file_digest(path: Path, budget: list[int]) -> str:
    """``sha256:<hex>`` of a small file while ``budget[0]`` bytes remain to hash, else
    ``size=<bytes>,mtime_ns=<ns>``."""
    stat = path.stat()
    if stat.st_size > SMALL_FILE or stat.st_size > budget[0]:
        return f"size={stat.st_size},mtime_ns={stat.st_mtime_ns}"
    budget[0] -= stat.st_size
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def bundle_digest(bundle: DatasetBundle) -> str:
    """``sha256:<hex>`` of a bundle's labels and inputs, split by split."""
    h = hashlib.sha256(f"{bundle.num_classes} {tuple(bundle.input_shape)}".encode())
    for part in (bundle.train, bundle.test):
        for t in (part.y, part.x):
            _update(h, t)
    return "sha256:" + h.hexdigest()


def _update(h: Any, t: Any) -> None:
    """Add a tensor to ``h``: its shape, dtype and bytes (lazy inputs: shape and dtype only;
    their samples are read when a batch needs them, never for this). A broadcast view (a
    zero stride: ``labels_only``'s one zero sample for every index, ``executor: timing``) adds
    its strides and the one stored copy, never the expanded bytes (128,117 IMAGE-100 samples
    at 3×144×144 would be 31.9 GB)."""
    h.update(f"{tuple(t.shape)} {t.dtype}".encode())
    if isinstance(t, torch.Tensor) and t.numel():
        if 0 in t.stride():
            h.update(f"broadcast {t.stride()}".encode())
            t = t[tuple(0 if s == 0 else slice(None) for s in t.stride())]
        h.update(t.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())


def fingerprint_mismatch(stored: Any, current: dict[str, str]) -> str | None:
    """None if ``stored`` (a checkpoint's) equals ``current``; else what changed, in words.
    A checkpoint without one (written before fingerprints) compares as equal."""
    if stored is None or stored == current:
        return None
    if not isinstance(stored, dict):
        return "its data fingerprint is unreadable"
    changed = [k for k in sorted(stored.keys() & current.keys()) if stored[k] != current[k]]
    removed = sorted(stored.keys() - current.keys())
    added = sorted(current.keys() - stored.keys())
    words = [f"{k} changed ({_how(stored[k], current[k])})" for k in changed]
    words += [f"{k} is gone" for k in removed] + [f"{k} is new" for k in added]
    more = f" and {len(words) - 3} more" if len(words) > 3 else ""
    return "; ".join(words[:3]) + more


def _how(old: str, new: str) -> str:
    if old.startswith("sha256:") and new.startswith("sha256:"):
        return "content"
    return f"{old} vs {new}" if len(old) + len(new) < 90 else "size or modification time"


def check_fingerprint(stored: Any, current: dict[str, str], path: Path) -> None:
    """Refuse a resume whose data differs from the checkpoint's (one line); a checkpoint
    without a fingerprint resumes with a note saying the data was not compared."""
    if stored is None:
        print(
            f"note: {path} holds no data fingerprint (written by an older splitfl): the data "
            "could not be compared with what the run was trained on",
            file=sys.stderr,
        )
    mismatch = fingerprint_mismatch(stored, current)
    if mismatch:
        raise ConfigError(
            "--resume",
            f"the data differs from what {path} was trained on: {mismatch}; restore the "
            "data or start a new run (a resume would mix two datasets in one run)",
        )

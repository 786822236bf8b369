"""Checkpoints: the single source of truth a resumed run restarts from.

``checkpoints/last.pt`` holds the global model, the algorithm state, the server optimiser's
state (``train.server_optimizer``: m, v), the clock, the
cumulative traffic, the initial loss (for the explosion check) and the ``metrics.jsonl``
lines of every round up to its round. On resume the metric rows come from the checkpoint and
``metrics.jsonl`` is rewritten from them, so an emptied, missing, truncated or damaged
``metrics.jsonl`` cannot drop rows and the resumed run still equals an uninterrupted one.

A checkpoint records the identity of its run (:func:`run_identity`): the resolved config
minus the fields a resume may change (:data:`MAY_CHANGE`), as JSON, and its SHA-256. A resume
whose ``config.yaml`` differs in any other field (an edited ``config.yaml``, a checkpoint
copied from another run) is refused in one line naming the differing fields; otherwise the
run directory would claim a config that produced only its later rounds. It also records a
fingerprint of the data the run read (:mod:`splitfl.experiment.fingerprint`, under ``data``):
a resume after the data files changed is refused in one line naming them.

Checkpoints are read with ``torch.load(weights_only=True)``: only tensors, containers,
numbers and strings. NumPy arrays in an algorithm's state (ParallelSFL's moving averages)
are stored as tensors tagged :data:`NUMPY_TAG` and turned back on load. A file that is not
such a checkpoint (truncated, foreign, or written before splitfl stored metrics in it) is a
one-line :class:`~splitfl.config.ConfigError`.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from splitfl.config import ConfigError, ExperimentConfig, flatten
from splitfl.core.atomic import write_atomic
from splitfl.experiment.validation import resolve_config

FORMAT = "splitfl-checkpoint"
VERSION = 4  # 4: the data fingerprint (3: the run's identity, 2: metric rows)
NUMPY_TAG = "__numpy__"
REQUIRED = ("round", "global_state", "algorithm", "clock", "traffic", "metrics", "identity")

#: Config fields a resume may change (dotted prefixes): extending ``rounds``, where and how
#: the run is shown and saved (``output``), the network endpoints, certificates and tokens
#: (``network``, as ``--resume`` overrides), the torch device and thread count, and where the
#: data files lie and how their checksums are checked, and how many workers ``executor:
#: parallel`` uses, where (results do not depend on them). Every other field is the run's
#: identity: changing it mid-run would change what the earlier rounds computed.
MAY_CHANGE = (
    "rounds",
    "output",
    "network",
    "device",
    "threads",
    "data.root",
    "data.verify",
    "import_dirs",  # where the user's modules are found, not what the run is
    "parallel",
)


def run_identity(config: ExperimentConfig) -> dict[str, Any]:
    """The fields that identify a run: the flattened resolved config (a preset's default
    ``devices.contention`` filled in, as ``config.yaml`` holds it) without :data:`MAY_CHANGE`."""
    return {
        k: v
        for k, v in flatten(resolve_config(config).to_dict()).items()
        if not any(k == f or k.startswith(f + ".") for f in MAY_CHANGE)
    }


def identity_record(config: ExperimentConfig) -> dict[str, str]:
    """What a checkpoint stores: the identity as canonical JSON and its SHA-256."""
    text = json.dumps(run_identity(config), sort_keys=True)
    return {"config": text, "sha256": hashlib.sha256(text.encode()).hexdigest()}


def identity_mismatch(stored: Any, config: ExperimentConfig) -> str | None:
    """None if ``stored`` (a checkpoint's identity record) is ``config``'s; else which fields
    differ, with the checkpoint's and the config's values."""
    if stored == identity_record(config):
        return None
    try:
        old = json.loads(stored["config"])
    except (TypeError, KeyError, ValueError):
        return "its run identity is unreadable"
    new = run_identity(config)
    unset = "<unset>"
    # a field newer than the checkpoint (absent from it) counts as its default value
    default = flatten(ExperimentConfig().to_dict())
    keys = sorted(k for k in {*old, *new} if old.get(k, default.get(k, unset)) != new.get(k, unset))
    if not keys:
        return None
    shown = [f"{k} ({_short(old.get(k, unset))} vs {_short(new.get(k, unset))})" for k in keys]
    more = f" and {len(keys) - 4} more" if len(keys) > 4 else ""
    return f"the config differs in {', '.join(shown[:4])}{more} (checkpoint vs config.yaml)"


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def encode_numpy(obj: Any) -> Any:
    """``obj`` with NumPy arrays/scalars replaced by ``{NUMPY_TAG: tensor}`` (loadable with
    ``weights_only=True``); object arrays are refused."""
    if isinstance(obj, np.ndarray | np.generic):
        arr = np.asarray(obj)
        if arr.dtype == object:
            raise TypeError("object arrays cannot be checkpointed")
        return {NUMPY_TAG: torch.from_numpy(arr.copy()), "scalar": isinstance(obj, np.generic)}
    if isinstance(obj, dict):
        return {k: encode_numpy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        if set(map(type, obj)) <= PLAIN:  # a per-client table: nothing to encode
            return obj
        return type(obj)(encode_numpy(v) for v in obj)
    return obj


#: element types that neither :func:`encode_numpy` nor :func:`decode_numpy` change
PLAIN = frozenset({int, float, bool, str, type(None)})


def decode_numpy(obj: Any) -> Any:
    """Inverse of :func:`encode_numpy` (same dtypes, shapes and values)."""
    if isinstance(obj, dict):
        if NUMPY_TAG in obj:
            arr = obj[NUMPY_TAG].numpy()
            return arr[()] if obj.get("scalar") else arr
        return {k: decode_numpy(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        if set(map(type, obj)) <= PLAIN:
            return obj
        return type(obj)(decode_numpy(v) for v in obj)
    return obj


def save_checkpoint(run_dir: Path, state: dict[str, Any]) -> None:
    """Write ``run_dir/checkpoints/last.pt`` atomically (a kill leaves the old or the new)."""
    folder = run_dir / "checkpoints"
    folder.mkdir(exist_ok=True)
    save_atomic({"format": FORMAT, "version": VERSION, **encode_numpy(state)}, folder / "last.pt")


def save_atomic(obj: Any, path: Path) -> None:
    """``torch.save`` to ``path`` atomically (serialised in memory, so a full disk is an
    OSError naming ``path``, not an error inside torch's zip writer)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    write_atomic(path, buf.getvalue())


def _damaged(path: Path, why: str) -> ConfigError:
    return ConfigError("--resume", f"{path} is damaged or not a splitfl checkpoint ({why})")


def load_checkpoint(
    path: Path, model_shapes: dict[str, torch.Size], config: ExperimentConfig
) -> dict[str, Any]:
    """Read and check a checkpoint; ``state["rows"]`` are its metric rows (rounds 1..round).

    Raises:
        ConfigError: one line, for any file that is not a complete splitfl checkpoint of
            this run (:func:`run_identity`) whose model has these state shapes and at most
            ``config.rounds`` rounds.
    """
    rounds = config.rounds
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as err:  # noqa: BLE001 - truncated zip, pickle garbage, foreign objects
        raise _damaged(path, str(err).strip().splitlines()[0][:120] or type(err).__name__) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise _damaged(path, "no splitfl checkpoint header; written by an older splitfl?")
    missing = [k for k in REQUIRED if k not in state]
    if missing == ["identity"]:
        raise _damaged(path, "no run identity; written by an older splitfl?")
    if missing:
        raise _damaged(path, f"missing {', '.join(missing)}")
    mismatch = identity_mismatch(state["identity"], config)
    if mismatch:
        raise ConfigError(
            "--resume",
            f"{path} was written under another config: {mismatch}; restore config.yaml (a "
            f"resume may change only {', '.join(MAY_CHANGE)}) or start a new run",
        )
    k = state["round"]
    if not isinstance(k, int) or not 0 <= k <= rounds:
        raise _damaged(path, f"round {k!r} outside 0..{rounds}")
    model = state["global_state"]
    if (
        not isinstance(model, dict)
        or sorted(model) != sorted(model_shapes)
        or any(not torch.is_tensor(v) or v.shape != model_shapes[k] for k, v in model.items())
    ):
        raise _damaged(path, "its model parameters do not match the config's model")
    if not server_state_fits(state.get("server_optimizer", {}), model_shapes):
        raise _damaged(path, "its server optimizer state does not match the config's model")
    state["rows"] = parse_rows(state["metrics"], k, path)
    state["algorithm"] = decode_numpy(state["algorithm"])
    return state


def server_state_fits(state: Any, model_shapes: dict[str, torch.Size]) -> bool:
    """``train.server_optimizer``'s checkpointed state is ``{part: {name: tensor}}`` with
    the model's tensor names and shapes (``{}``: none, or written before it existed)."""
    if not isinstance(state, dict):
        return False
    return all(
        isinstance(part, dict)
        and all(
            k in model_shapes and torch.is_tensor(t) and t.shape == model_shapes[k]
            for k, t in part.items()
        )
        for part in state.values()
    )


def parse_rows(text: Any, rounds: int, path: Path) -> list[dict[str, Any]]:
    """The checkpoint's ``metrics.jsonl`` text as rows; exactly rounds ``1..rounds``."""
    try:
        rows = [json.loads(line) for line in str(text).splitlines()]
    except ValueError:
        raise _damaged(path, "its metric rows are not JSON") from None
    if [r.get("round") if isinstance(r, dict) else None for r in rows] != list(
        range(1, rounds + 1)
    ):
        raise _damaged(path, f"its metric rows are not rounds 1..{rounds}")
    return rows

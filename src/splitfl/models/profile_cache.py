"""The on-disk cache of model profiles, keyed by content.

Measuring a model's per-block profile runs a training step per block (about two seconds for a
small CNN on a CPU); the result depends only on the architecture and the input shape, so it
is kept in ``$SPLITFL_CACHE_DIR/profiles/<key>.json`` (default ``$XDG_CACHE_HOME/splitfl``,
else ``~/.cache/splitfl``; ``SPLITFL_CACHE_DIR=`` empty turns the cache off). The key is the
SHA-256 of everything the measurement depends on: the model's structure (its ``repr``, the
shapes and dtypes of its state, the plain attributes of every module), the code of every
module class that is not torch's own, the torch version, the input shape and the
measurement's own settings. Entries are JSON (never unpickled), written atomically
(:func:`splitfl.core.atomic.write_atomic`); an unreadable or malformed entry is measured again and
replaced, and a cache folder that cannot be written is skipped.
"""

from __future__ import annotations

import hashlib
import json
import os
import types
from pathlib import Path
from typing import Any

import torch
import torch.fx
from torch import nn

from splitfl.core.atomic import write_atomic

#: Bump when what a profile entry holds, or how it is measured, changes.
CACHE_FORMAT = 2
_PLAIN = (int, float, str, bool, type(None))
_MODULE_INTERNALS = {"training", "_is_full_backward_hook"}


def cache_dir() -> Path | None:
    """The profile cache folder, or None when ``SPLITFL_CACHE_DIR`` is set empty."""
    env = os.environ.get("SPLITFL_CACHE_DIR")
    if env is not None:
        return Path(env).expanduser() / "profiles" if env else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "splitfl" / "profiles"


def _code_digest(code: types.CodeType, h: Any) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _code_digest(const, h)
        else:
            h.update(repr(const).encode())


def _class_code(cls: type) -> str:
    """Digest of the methods of ``cls`` and its bases outside torch (a changed ``forward``
    changes the key); torch's own classes are covered by the torch version."""
    h = hashlib.sha256()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] in ("torch", "builtins"):
            continue
        h.update(f"{klass.__module__}.{klass.__qualname__}".encode())
        for name, value in sorted(vars(klass).items()):
            func = getattr(value, "__func__", value)
            if isinstance(func, types.FunctionType):
                h.update(name.encode())
                _code_digest(func.__code__, h)
    return h.hexdigest()


def _plain_attributes(module: nn.Module) -> dict[str, Any]:
    """A module's settings that its ``repr`` may not show (ints, floats, strings, tuples)."""
    out = {}
    for key, value in vars(module).items():
        if key in _MODULE_INTERNALS or key.startswith("_"):
            continue
        if isinstance(value, _PLAIN) or (
            isinstance(value, tuple | list) and all(isinstance(v, _PLAIN) for v in value)
        ):
            out[key] = repr(value)
    return out


def architecture_key(
    model: nn.Module, input_shape: tuple[int, ...], settings: dict[str, Any]
) -> str:
    """SHA-256 (hex) of what a profile of ``model`` for ``input_shape`` depends on."""
    modules = list(model.modules())
    content = {
        "format": CACHE_FORMAT,
        "torch": torch.__version__,
        "settings": settings,
        "input_shape": [int(d) for d in input_shape],
        "repr": repr(model),
        "state": [[k, list(t.shape), str(t.dtype)] for k, t in model.state_dict().items()],
        "attributes": [[type(m).__qualname__, _plain_attributes(m)] for m in modules],
        "code": sorted({_class_code(type(m)) for m in modules}),
        # a graph-split model's pieces: the code fx generated from the user's forward
        "graphs": [m.code for m in modules if isinstance(m, torch.fx.GraphModule)],
    }
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def read_entry(key: str) -> Any:
    """The JSON stored under ``key``, or None (no cache, no entry, or unreadable)."""
    folder = cache_dir()
    if folder is None:
        return None
    try:
        return json.loads((folder / f"{key}.json").read_text())
    except (OSError, ValueError):
        return None


def write_entry(key: str, value: Any) -> None:
    """Store ``value`` (JSON) under ``key``; a folder that cannot be written is skipped."""
    folder = cache_dir()
    if folder is None:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
        write_atomic(folder / f"{key}.json", json.dumps(value, sort_keys=True))
    except OSError:
        pass

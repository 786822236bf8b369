"""An exception the user's model raised inside a round, as one line.

The model's forward and backward run deep inside an executor (a device part, the server
part, a batched stack of them); a Python traceback of them says little to the user. When a
round raises from within a module of the model (a ``self`` in the traceback that is an
``nn.Module``), :func:`model_round_error` words it as one line: the round, the client(s)
whose batch it was (a :class:`~splitfl.core.plan.ClientTask`, a
:class:`~splitfl.roles.sides.Smashed` or a :class:`~splitfl.roles.sides.DeviceRole` held by
the innermost frame that holds one), the module under the user's own name
(:func:`~splitfl.models.base.user_state_dict`'s naming) and its type, and the exception's
type and message; torch's BatchNorm error on a batch of one also names
``train.drop_last``. Errors that splitfl words itself pass unchanged.
"""

from __future__ import annotations

from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import nn

from splitfl.config import ConfigError
from splitfl.core.plan import ClientTask
from splitfl.models.base import user_state_dict
from splitfl.roles.sides import DeviceRole, Smashed

#: Frames in these folders are not the user's code (splitfl's, torch's).
_NOT_USERS = (str(Path(__file__).parents[1]), str(Path(torch.__file__).parent))

#: torch's message for a BatchNorm batch with one value per channel (torch.nn.functional).
BATCH_OF_ONE = "Expected more than 1 value per channel when training"


class ModelRoundError(ConfigError):
    """The user's model raised inside round ``rounds_done + 1`` (one line on ``model``)."""

    def __init__(self, message: str, rounds_done: int):
        super().__init__("model", message)
        self.message, self.rounds_done = message, rounds_done


def _frames(err: BaseException) -> list[FrameType]:
    """The frames of ``err``'s traceback (and of the exception it was raised from), outermost
    first."""
    frames: list[FrameType] = []
    for e in (err, err.__cause__):
        tb = e.__traceback__ if e is not None else None
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
    return frames


def _clients_of(value: Any) -> set[int]:
    """The clients ``value`` belongs to: a task, smashed data, a device role, or a list of
    them."""
    if isinstance(value, ClientTask | Smashed):
        return {int(value.client)}
    if isinstance(value, DeviceRole):
        return {int(value.task.client)}
    if isinstance(value, list | tuple) and value and len(value) <= 10_000:
        found = [_clients_of(v) for v in value]
        if all(found):
            return set().union(*found)
    return set()


def _clients(frames: list[FrameType]) -> list[int]:
    """The clients of the innermost frame that holds a task, smashed data or a device role."""
    for frame in reversed(frames):
        found: set[int] = set()
        for value in frame.f_locals.values():
            found |= _clients_of(value)
        if found:
            return sorted(found)
    return []


def _module_name(outer: nn.Module, inner: nn.Module, model: nn.Module) -> str:
    """``inner``'s path inside ``outer`` (a part or the model: ``blocks.<i>.<name>``) under
    the user's own names."""
    path = next((n for n, m in outer.named_modules() if m is inner), "")
    if not path.startswith("blocks."):
        return path or type(outer).__name__
    return next(iter(user_state_dict(model, {path: None}))) or path


def model_round_error(err: BaseException, model: nn.Module, round_idx: int) -> str | None:
    """One line for ``err``, raised by a module of the model in round ``round_idx`` (0-based),
    or None when it did not come from inside a module (splitfl's own errors, a bug)."""
    frames = _frames(err)
    modules = [f.f_locals.get("self") for f in frames]
    modules = [m for m in modules if isinstance(m, nn.Module)]
    if not modules:
        return None
    outer, inner = modules[0], modules[-1]
    clients = _clients(frames)
    who = (
        f"client {clients[0]}"
        if len(clients) == 1
        else f"clients {', '.join(map(str, clients[:8]))}{' ...' if len(clients) > 8 else ''}"
        if clients
        else "the server"
    )
    name = _module_name(outer, inner, model)
    text = str(err).strip().splitlines()
    what = f"{type(err).__name__}: {text[0][:300]}" if text else type(err).__name__
    user = [f for f in frames if not f.f_code.co_filename.startswith(_NOT_USERS)]
    if user:
        what += f" ({Path(user[-1].f_code.co_filename).name} line {user[-1].f_lineno})"
    line = f"round {round_idx + 1}, {who}: module {name} ({type(inner).__name__}) raised {what}"
    if BATCH_OF_ONE in str(err):
        line += (
            "; a batch of one sample reached BatchNorm: set train.drop_last: single (or auto), "
            "or a larger train.batch_size"
        )
    return line

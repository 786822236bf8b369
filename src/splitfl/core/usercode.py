"""User code run inside splitfl, and the one line its exceptions become.

Modules named in ``imports:``, model and dataset builders (``model:``/``data.dataset:``
import paths, registered ones), the items of a user's torch ``Dataset`` and a model's forward
on the probe batch all run user code. :func:`user_code` brackets each of those calls (in
:mod:`splitfl.extensions`, :mod:`splitfl.data.convert` and :mod:`splitfl.experiment.context`):
any exception the code raises — a ``KeyError`` as much as a ``ValueError`` — and an exit it
asks for (``sys.exit``, ``os._exit``) become the caller's one-line error, naming what was
called, the exception's type and message, and the user's file and line
(:func:`error_line`). The errors splitfl already words as one line pass through unchanged.
(Imports nothing from splitfl.)
"""

from __future__ import annotations

import contextlib
import os
import threading
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

#: splitfl's own folder: frames in it are not the user's.
_OURS = str(Path(__file__).parent)


def error_line(err: BaseException) -> str:
    """``Type: message`` of ``err`` (its first line), with the file and line of user code
    (outside splitfl and importlib) it came from."""
    text = str(err).strip().splitlines()
    line = f"{type(err).__name__}: {text[0][:300]}" if text else type(err).__name__
    frames = traceback.extract_tb(err.__traceback__)
    user = [f for f in frames if "importlib" not in f.filename and _OURS not in f.filename]
    if user and not isinstance(err, ModuleNotFoundError):
        line += f" ({Path(user[-1].filename).name} line {user[-1].lineno})"
    return line


class ExitCalled(Exception):  # noqa: N818 - what happened, not an error of splitfl's
    """User code called ``os._exit`` (turned into this while :func:`user_code` runs)."""


#: ``os._exit`` itself; while user code runs (in any thread: :data:`_REFUSING` counts the
#: blocks) it is replaced by :func:`_refuse_exit` in this process.
_REAL_EXIT = os._exit
_REFUSING = {"depth": 0, "pid": 0}
_LOCK = threading.Lock()


def _refuse_exit(code: int = 0) -> None:
    if os.getpid() != _REFUSING["pid"]:  # a forked child (multiprocessing) ends as it meant to
        _REAL_EXIT(code)
    raise ExitCalled(f"os._exit({code})")


@contextlib.contextmanager
def _exits_refused() -> Iterator[None]:
    with _LOCK:
        if _REFUSING["depth"] == 0:
            _REFUSING["pid"], os._exit = os.getpid(), _refuse_exit
        _REFUSING["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _REFUSING["depth"] -= 1
            if _REFUSING["depth"] == 0:
                os._exit = _REAL_EXIT


@contextlib.contextmanager
def user_code(
    what: str,
    error: Callable[[str], Exception],
    passthrough: tuple[type[BaseException], ...] = (),
) -> Iterator[None]:
    """Run the block as ``what`` (e.g. ``"cases:load"``, ``"cannot import 'cases'"``): an
    exception it raises, other than ``passthrough`` (splitfl's own one-line errors), becomes
    ``error("<what>: <Type>: <message> (<file> line <n>)")``; ``sys.exit(n)`` and
    ``os._exit(n)`` become ``error("<what>: it called sys.exit(n)")``. ``os._exit`` is
    replaced while the block runs (in this process only: a child it forks exits as usual)."""
    try:
        with _exits_refused():
            yield
    except passthrough:
        raise
    except ExitCalled as err:
        raise error(f"{what}: it called {err}") from None
    except SystemExit as err:
        raise error(f"{what}: it called sys.exit({err.code!r})") from None
    except Exception as err:  # noqa: BLE001 - any failure of user code is one line
        raise error(f"{what}: {error_line(err)}") from None

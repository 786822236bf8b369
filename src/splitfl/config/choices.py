"""One-line messages for a value that is not one of the allowed names, with a "did you
mean" for a near miss (``algorithm: unknown 's2lf' (did you mean 's2fl'?); allowed: ...``).
Used by every registry check (algorithms, models, datasets, presets, config fields)."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(value: str, allowed: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the closest of ``allowed`` to ``value``, or ``""``."""
    names = [str(a) for a in allowed]
    close = difflib.get_close_matches(str(value), names, n=1, cutoff=0.6)
    if not close:  # case slips: 'MNIST' for 'mnist'
        close = [n for n in names if n.lower() == str(value).lower()][:1]
    return f" (did you mean {close[0]!r}?)" if close else ""


def unknown_choice(value: str, allowed: Iterable[str]) -> str:
    """``unknown 'v' (did you mean 'w'?); allowed: a, b, c``."""
    names = [str(a) for a in allowed]
    return f"unknown {value!r}{did_you_mean(value, names)}; allowed: {', '.join(names)}"

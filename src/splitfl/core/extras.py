"""How to install one of splitfl's extras from where *this* splitfl was installed.

splitfl is not published on PyPI (asking pip for ``splitfl`` with an extra would fetch whatever
someone else uploads under the name), so an install hint in an error message must point at
this copy:

* a source checkout (an editable install, or ``src/`` on ``PYTHONPATH``: a ``pyproject.toml``
  beside ``src/splitfl``) → ``pip install -e '.[ray]'`` in the checkout (its path when the
  current directory is elsewhere);
* a wheel or folder installed by path (``direct_url.json`` of the installed distribution,
  PEP 610) that still exists → ``pip install '<that path>[ray]'``;
* otherwise → the extra's own requirements, read from the installed metadata
  (``pip install 'ray>=2.9'``).

(Imports nothing from splitfl.)
"""

from __future__ import annotations

import json
import re
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

#: This file's package root (``.../src/splitfl``).
_PACKAGE = Path(__file__).resolve().parents[1]


def checkout_root() -> Path | None:
    """The source checkout this splitfl runs from (``pyproject.toml`` beside ``src/``), or
    None for an installed copy (a wheel's files in site-packages)."""
    root = _PACKAGE.parent.parent
    if _PACKAGE.parent.name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


def _installed_from() -> Path | None:
    """The wheel file or folder the installed distribution came from (PEP 610's
    ``direct_url.json``), where it still exists."""
    try:
        text = metadata.distribution("splitfl").read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        return None
    url = json.loads(text).get("url", "") if text else ""
    parsed = urlparse(url)
    if parsed.scheme != "file":
        return None
    path = Path(unquote(parsed.path))
    return path if path.exists() else None


def extra_requirements(extra: str) -> list[str]:
    """The requirements the installed metadata lists for ``extra`` (``Requires-Dist: ray>=2.9;
    extra == "ray"``)."""
    try:
        requires = metadata.requires("splitfl") or []
    except metadata.PackageNotFoundError:
        return []
    marker = re.compile(rf"""extra\s*==\s*["']{re.escape(extra)}["']""")
    return [r.split(";")[0].strip() for r in requires if ";" in r and marker.search(r)]


def install_extra(extra: str, packages: str = "") -> str:
    """The command that installs splitfl's ``extra`` here (module docstring); ``packages``
    (e.g. ``"ray>=2.9"``) stands in where neither a checkout nor the metadata says."""
    root = checkout_root()
    if root is not None:
        where = "." if Path.cwd().resolve() == root else str(root)
        return f"pip install -e '{where}[{extra}]'"
    source = _installed_from()
    if source is not None:
        return f"pip install '{source}[{extra}]'"
    wanted = extra_requirements(extra) or packages.split()
    return "pip install " + " ".join(f"'{r}'" for r in wanted)

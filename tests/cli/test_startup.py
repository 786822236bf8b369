"""Start-up: ``splitfl list`` and ``splitfl validate`` import nothing they do not use (the
compiler stack, plotting, Ray, scikit-learn, SciPy's optimisers). Checked on ``sys.modules`` in
a fresh interpreter, not timed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import splitfl

SRC = str(Path(splitfl.__file__).resolve().parents[1])
QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
HEAVY = (
    "torch._dynamo",
    "torch._inductor",
    "matplotlib",
    "ray",
    "sklearn",
    "scipy.optimize",
    "scipy.stats",
)


def imported_after(argv: list[str], tmp_path: Path) -> list[str]:
    """The :data:`HEAVY` modules loaded by ``splitfl <argv>`` in a fresh interpreter."""
    code = (
        "import json, sys\n"
        "from splitfl.cli.main import main\n"
        f"code = main({argv!r})\n"
        f"print(json.dumps([code, [m for m in {HEAVY!r} if m in sys.modules]]))\n"
    )
    env = {**os.environ, "PYTHONPATH": SRC, "SPLITFL_CACHE_DIR": str(tmp_path / "cache")}
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=True,
        timeout=300,
    )
    code, loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert code == 0, out.stderr
    return loaded


@pytest.mark.parametrize(
    "argv",
    [["list"], ["validate", str(QUICKSTART), "output.out_dir=runs"]],
    ids=["list", "validate"],
)
def test_command_imports_no_heavy_module(argv, tmp_path):
    # validate with an empty profile cache: the profile is measured, without torch._dynamo
    assert imported_after(argv, tmp_path) == []


def test_digits_read_without_scikit_learn_are_its_arrays():
    from sklearn.datasets import load_digits

    from splitfl.data.loaders.digits import digits_arrays

    images, target = digits_arrays()
    raw = load_digits()
    assert images.dtype == raw.images.dtype and target.dtype == raw.target.dtype
    assert (images == raw.images).all() and (target == raw.target).all()

"""Issue 52 items 6 and 7: install hints that work from where splitfl was installed (it is
not on PyPI: ``pip install 'splitfl[ray]'`` would fetch someone else's package), and a
loader's missing dependency named in one line with the package to install."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

import splitfl
from splitfl.core import extras
from splitfl.data.base import DatasetError
from splitfl.ray_cluster import import_ray

ROOT = Path(__file__).resolve().parents[2]


def test_a_checkout_is_told_to_install_the_extra_editable_from_itself(monkeypatch, tmp_path):
    monkeypatch.setattr(extras, "_PACKAGE", ROOT / "src" / "splitfl")
    monkeypatch.chdir(ROOT)
    assert extras.install_extra("ray") == "pip install -e '.[ray]'"
    monkeypatch.chdir(tmp_path)  # elsewhere: the checkout's path
    assert extras.install_extra("net") == f"pip install -e '{ROOT}[net]'"


def test_an_installed_copy_is_told_its_wheel_or_the_extras_packages(monkeypatch, tmp_path):
    site = tmp_path / "site-packages" / "splitfl"  # no pyproject.toml beside it
    monkeypatch.setattr(extras, "_PACKAGE", site)
    wheel = tmp_path / "splitfl-0.1.0-py3-none-any.whl"
    wheel.write_bytes(b"")
    monkeypatch.setattr(extras, "_installed_from", lambda: wheel)
    assert extras.install_extra("ray") == f"pip install '{wheel}[ray]'"
    monkeypatch.setattr(extras, "_installed_from", lambda: None)
    monkeypatch.setattr(extras, "extra_requirements", lambda extra: ["ray>=2.9"])
    assert extras.install_extra("ray") == "pip install 'ray>=2.9'"
    monkeypatch.setattr(extras, "extra_requirements", lambda extra: [])
    assert extras.install_extra("net", "cryptography>=41") == "pip install 'cryptography>=41'"


def test_the_hints_in_error_messages_point_here(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(splitfl.ConfigError) as err:
        import_ray()
    assert "pip install -e '" in str(err.value) and "[ray]'" in str(err.value)
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(splitfl.ConfigError, match=r"needs the mlflow package: pip install -e '"):
        splitfl.validate({"output": {"tracking": ["mlflow"]}})
    monkeypatch.setitem(sys.modules, "transformers", None)  # the Hugging Face extra
    from splitfl.models.hf import load_hf_model

    monkeypatch.chdir(ROOT.parent)  # outside the checkout: its path, not '.'
    with pytest.raises(ImportError, match=re.escape(f"pip install -e '{ROOT}[hf]'")):
        load_hf_model("hf-config:nowhere", 2)
    # no message, docstring or doc asks PyPI for a `splitfl[...]`
    pypi = re.compile(r"pip install '?splitfl\[")
    files = [*(ROOT / "src").rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    assert [str(f) for f in files if pypi.search(f.read_text())] == []


def test_the_digits_without_scikit_learn_say_which_package_in_one_line(monkeypatch):
    """The quickstart on a minimal device install without scikit-learn (issue 52 item 7):
    one line naming the package, not ``No module named 'sklearn'``."""
    monkeypatch.setitem(sys.modules, "sklearn", None)
    for name in [m for m in sys.modules if m.startswith("sklearn.")]:
        # a submodule an earlier test imported would still import (the parent is not checked)
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(DatasetError) as err:
        splitfl.validate(str(ROOT / "configs" / "quickstart.yaml"))
    line = str(err.value)
    assert "\n" not in line
    assert line.startswith("digits: its loader needs the scikit-learn package (import sklearn)")
    assert line.endswith("pip install scikit-learn")


def test_the_minimal_device_install_names_every_package_the_quickstart_needs():
    """The deployment guide's minimal pairing (``docs/how-to/deploy-on-devices.md``) names
    every package the quickstart's digits need (scikit-learn among them)."""
    text = (ROOT / "docs" / "how-to" / "deploy-on-devices.md").read_text()
    minimal = next(line for line in text.splitlines() if "minimal: pip install --no-deps" in line)
    assert minimal.split("&& pip install ")[1].split() == [
        "numpy",
        "pyyaml",
        "grpcio",
        "cryptography",
        "scikit-learn",
    ]

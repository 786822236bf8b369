"""Issue 52 item 2: YAML 1.1 reads an unquoted ``on`` as ``True``; ``eval: {on: both}`` as
the README writes it must mean ``eval.on: both``, and a boolean key is refused in one line
that names the quirk."""

from __future__ import annotations

import pytest
import yaml

import splitfl
from splitfl.cli.main import main
from splitfl.config import ConfigError, load_config
from splitfl.config.parse import load_yaml
from splitfl.testing import tiny_config


def _file(tmp_path, text: str):
    config = yaml.safe_dump({k: v for k, v in tiny_config().items() if k != "eval"})
    path = tmp_path / "c.yaml"
    path.write_text(config + text)
    return path


def test_eval_on_as_the_readme_writes_it(tmp_path, capsys):
    path = _file(tmp_path, "eval: {on: both, every: 2}\n")
    assert load_config(path).eval.on == "both"
    assert main(["validate", str(path)]) == 0
    block = "eval:\n  on: clients\n"
    assert load_config(_file(tmp_path, block)).eval.on == "clients"
    # other YAML 1.1 words as keys stay the words written; values are unchanged
    assert load_yaml("a: {yes: 1, Off: 2}\nb: on") == {"a": {"yes": 1, "Off": 2}, "b": True}


def test_a_boolean_key_is_refused_naming_the_quirk(tmp_path, capsys):
    path = _file(tmp_path, "eval: {true: both}\n")
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "boolean key 'true': YAML 1.1 reads an unquoted on/off" in err[0]
    assert "quote the key" in err[0]
    # a mapping the user read with yaml.safe_load: `on` became True
    read = yaml.safe_load("eval: {on: both}")
    with pytest.raises(ConfigError, match=r"^eval.True: boolean key True: YAML 1.1"):
        splitfl.validate({**tiny_config(), **read})

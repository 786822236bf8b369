"""Where ``splitfl server`` listens: ``--listen``, else the config's ``network.listen``, else
127.0.0.1:7070; a resumed server without ``--listen`` keeps the run's recorded address.

The old command set ``network.listen`` to its flag's default (127.0.0.1:7070) on every
start and every resume, over whatever the config or the stopped run said: devices told the
config's address (or the first run's ``--listen``) redialled a port nobody listened on.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from splitfl.cli import network as server_cli
from splitfl.cli.entry import main as cli_main
from splitfl.config.parse import load_config
from splitfl.testing import config_for


@pytest.fixture
def started(monkeypatch):
    """The config and overrides ``splitfl server`` would run or resume with (not run)."""
    seen: dict[str, object] = {}

    def fake_run(config, overrides, **kwargs):
        seen.update(config=config, overrides=overrides)
        return None

    def fake_resume(run_dir, overrides=None, **kwargs):
        seen.update(config=str(Path(run_dir) / "config.yaml"), overrides=overrides)
        return None

    monkeypatch.setattr(server_cli, "run", fake_run)
    monkeypatch.setattr(server_cli, "resume", fake_resume)
    monkeypatch.setattr(server_cli, "_report", lambda result: 0)
    return seen


def _listen(seen: dict) -> str:
    return load_config(seen["config"], seen["overrides"]).network.listen


def _config(tmp_path: Path, **changes) -> str:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(config_for("splitfed_v1", rounds=1, **changes)))
    return str(path)


def test_the_configs_address_is_kept(tmp_path, started):
    config = _config(tmp_path, **{"network.listen": "127.0.0.1:9123"})
    assert cli_main(["server", config, "--no-progress"]) == 0
    assert _listen(started) == "127.0.0.1:9123"


def test_an_override_names_the_address(tmp_path, started):
    argv = ["server", _config(tmp_path), "network.listen=127.0.0.1:9124", "--no-progress"]
    assert cli_main(argv) == 0
    assert _listen(started) == "127.0.0.1:9124"


def test_without_an_address_the_server_listens_on_7070(tmp_path, started):
    assert cli_main(["server", _config(tmp_path), "--no-progress"]) == 0
    assert _listen(started) == server_cli.SERVER_LISTEN == "127.0.0.1:7070"


def test_the_flag_wins(tmp_path, started):
    config = _config(tmp_path, **{"network.listen": "127.0.0.1:9123"})
    assert cli_main(["server", config, "--listen", "127.0.0.1:9125", "--no-progress"]) == 0
    assert _listen(started) == "127.0.0.1:9125"


def test_a_resumed_server_listens_where_the_run_did(tmp_path, started):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.yaml").write_text(
        Path(_config(tmp_path, **{"network.listen": "127.0.0.1:9126"})).read_text()
    )
    assert cli_main(["server", "--resume", str(run_dir), "--no-progress"]) == 0
    assert _listen(started) == "127.0.0.1:9126"
    assert cli_main(["server", "--resume", str(run_dir), "--listen", "127.0.0.1:9127"]) == 0
    assert _listen(started) == "127.0.0.1:9127"

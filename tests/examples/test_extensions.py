"""Extension points (issue 23): a user's module outside the source tree — a plain
``nn.Sequential`` model by import path and a registered dataset — through ``splitfl run``,
``--resume``, a Ray sweep, ``splitfl launch`` and a device process; public registries that
refuse to shadow a name; "did you mean"; ``dir(splitfl)``."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml
from torch import nn

import splitfl
from conftest import tiny_config
from splitfl import extensions
from splitfl.algorithms import ALGORITHMS, S2FL
from splitfl.cli.main import main
from splitfl.config import ConfigError
from splitfl.data.base import DATASETS
from splitfl.experiment.checkpoint import identity_mismatch, identity_record
from splitfl.models.registry import MODELS
from splitfl.net.server.testbed import Testbed
from splitfl.sweeps.backends import runtime_env
from splitfl.sweeps.spec import Trial

SRC = str(Path(splitfl.__file__).resolve().parents[1])

#: A user's module: a plain nn.Sequential model (import path) and a registered dataset.
USER_MODULE = textwrap.dedent(
    '''
    """A researcher's own model and data, outside splitfl's source tree."""
    from torch import nn

    import splitfl
    from splitfl.data.base import load_dataset


    def small_cnn(input_shape, num_classes):
        c, h, w = input_shape
        return nn.Sequential(
            nn.Sequential(nn.Conv2d(c, 8, 3, padding=1), nn.ReLU()),
            nn.Sequential(nn.Flatten(), nn.Linear(8 * h * w, 32), nn.ReLU()),
            nn.Linear(32, num_classes),
        )


    @splitfl.register_dataset("{dataset}", "the digits, registered by a user module")
    def my_digits(root=None):
        return load_dataset("digits")
    '''
)


def _project(folder: Path, module: str = "user_ext", **changes) -> Path:
    """``folder`` with the user's module and a config naming it; returns the config."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{module}.py").write_text(USER_MODULE.format(dataset=f"{module}_digits"))
    cfg = tiny_config(algorithm="splitfed_v1", rounds=2, model=f"{module}:small_cnn", **changes)
    cfg["data"]["dataset"] = f"{module}_digits"
    cfg["data"]["num_clients"] = 4
    cfg["train"]["clients_per_round"] = 4
    cfg["imports"] = [module]
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env() -> dict[str, str]:
    """Only splitfl's source on PYTHONPATH: the user's module is found by splitfl."""
    return {**os.environ, "PYTHONPATH": SRC}


def _splitfl(*args: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "splitfl", *args]
    return subprocess.run(
        cmd, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=timeout, check=False
    )


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_cli_runs_and_resumes_a_user_module_outside_the_tree(tmp_path):
    proj = _project(tmp_path / "proj").parent
    done = _splitfl("run", "config.yaml", "--out", "run", "--no-progress", cwd=proj)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = yaml.safe_load((proj / "run" / "config.yaml").read_text())
    assert saved["imports"] == ["user_ext"] and saved["import_dirs"] == [str(proj.resolve())]
    assert saved["model"] == "user_ext:small_cnn" and len(_rows(proj / "run")) == 2
    # resume from another folder, one round more: found where the run found it
    saved["rounds"] = 3
    (proj / "run" / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    (tmp_path / "elsewhere").mkdir()
    done = _splitfl(
        "run", "--resume", str(proj / "run"), "--no-progress", cwd=tmp_path / "elsewhere"
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert [r["round"] for r in _rows(proj / "run")] == [1, 2, 3]


def test_cli_import_flag_and_one_line_import_errors(tmp_path, monkeypatch, capsys):
    """In this process (``main``): a module found in the current directory only."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    proj = _project(tmp_path / "proj", module="user_ext_flag").parent
    monkeypatch.chdir(proj)
    cfg = yaml.safe_load((proj / "config.yaml").read_text())
    del cfg["imports"]
    cfg["model"] = "cnn_digits"
    (proj / "plain.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["validate", "plain.yaml"]) == 2
    assert "data.dataset: unknown 'user_ext_flag_digits'" in capsys.readouterr().err
    assert main(["validate", "plain.yaml", "--import", "user_ext_flag"]) == 0
    assert capsys.readouterr().out.startswith("ok: splitfed_v1 on user_ext_flag_digits")
    (proj / "broken_h1.py").write_text("import torch\nraise RuntimeError('no GPU here')\n")
    assert main(["validate", "config.yaml", "--import", "broken_h1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "error: imports: cannot import 'broken_h1': RuntimeError: no GPU here (broken_h1.py line 2)"
    ), err


@pytest.mark.slow
def test_ray_sweep_trials_import_the_user_module(tmp_path, ray_instance):
    """``splitfl sweep --backend ray`` in a process of its own, joining the session's Ray
    instance by ``--address`` (its own local start cost 13-16 s of a 120 s test on a busy
    machine; a job that joins still ships the module as its ``py_modules`` and gets fresh
    workers of its own)."""
    proj = _project(tmp_path / "proj").parent
    log = tmp_path / "imported-from.txt"  # where each process found the module
    with (proj / "user_ext.py").open("a") as f:
        f.write(f"\nopen({str(log)!r}, 'a').write(__file__ + '\\n')\n")
    sweep = {"base": "config.yaml", "axes": {"seed": [0, 1]}}
    (proj / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    address = ray_instance.get_runtime_context().gcs_address
    args = ("sweep", "sweep.yaml", "--backend", "ray", "--address", address, "--out", "sw")
    done = _splitfl(*args, cwd=proj, timeout=400)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    index = json.loads((proj / "sw" / "trials.json").read_text())["trials"]
    assert [t["status"] for t in index] == ["done", "done"]
    assert all(len(_rows(proj / "sw" / t["name"])) == 2 for t in index)
    # imported by the driver and again by the Ray worker(s) that ran the trials
    assert len(log.read_text().split()) >= 2


def test_a_ray_trial_ships_the_modules_that_are_not_installed(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))
    path = _project(tmp_path, module="user_ext_ray")
    config = splitfl.load_config(path)
    env = runtime_env([(Trial(0, "t", {}, config), tmp_path / "t")])
    assert env == {"py_modules": [str((tmp_path / "user_ext_ray.py").resolve())]}
    plain = splitfl.load_config(None, ["data.dataset=digits"])
    assert runtime_env([(Trial(0, "t", {}, plain), tmp_path / "t")]) is None


@pytest.mark.slow
def test_launch_devices_import_the_user_module(tmp_path):
    proj = _project(tmp_path / "proj").parent
    launch = ("launch", "config.yaml", "--devices", "2", "--out", "net", "--no-progress")
    with ThreadPoolExecutor(2) as pool:  # the sequential run beside the launch (own folders)
        started = pool.submit(_splitfl, *launch, cwd=proj)
        seq = _splitfl("run", "config.yaml", "--out", "seq", "--no-progress", cwd=proj)
        done = started.result()
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    assert len(_rows(proj / "net")) == 2
    assert seq.returncode == 0, seq.stderr[-2000:]
    a = torch.load(proj / "net" / "model.pt", weights_only=True)
    b = torch.load(proj / "seq" / "model.pt", weights_only=True)
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-5


@pytest.mark.slow
def test_launched_devices_that_cannot_import_end_the_run_with_one_line(tmp_path):
    proj = _project(tmp_path / "proj").parent
    with (proj / "user_ext.py").open("a") as f:  # importable by the server, not by devices
        f.write("\nimport os, sys\nif sys.argv[0].endswith(os.path.join('device', 'cli.py')):\n")
        f.write("    raise ImportError('not installed on this device')\n")
    done = _splitfl("launch", "config.yaml", "--devices", "2", "--out", "net", cwd=proj)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 2, done.stderr[-2000:]
    assert last.startswith("error: network.devices: 0 of 2 devices ready after "), last
    assert "(exit 2: splitfl device local-" in last and "imports: cannot import 'user_ext'" in last
    assert "ImportError: not installed on this device" in last


@pytest.mark.slow
def test_a_device_without_the_module_says_so_in_one_line_and_exits_2(tmp_path):
    proj = _project(tmp_path / "proj").parent
    bed = Testbed.create(tmp_path / "bed", ["a"])
    address = f"127.0.0.1:{bed.port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "splitfl", "server", "config.yaml", "--listen", address]
        + ["--tokens", str(bed.tokens_file), "--out", "net", "--no-progress"],
        cwd=proj,
        env=_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    token = bed.folder / "a.token"
    token.write_text(bed.tokens["a"])
    try:
        args = ["device", "--server", address, "--name", "a", "--token-file", str(token)]
        device = _splitfl(*args, "--retry-s", "120", cwd=bed.folder, timeout=200)
    finally:
        server.kill()
        server.wait(10)
    lines = device.stderr.strip().splitlines()
    assert device.returncode == 2, device.stderr
    assert lines[-1].startswith("splitfl device a: error: imports: cannot import 'user_ext': ")


def test_builtin_model_by_import_path_equals_its_registered_name(tmp_path):
    by_path = splitfl.run(
        tiny_config(model="splitfl.models.zoo.small:cnn_digits", rounds=2), run_dir=tmp_path / "p"
    )
    by_name = splitfl.run(tiny_config(model="cnn_digits", rounds=2), run_dir=tmp_path / "n")
    a = torch.load(by_path.run_dir / "model.pt", weights_only=True)
    b = torch.load(by_name.run_dir / "model.pt", weights_only=True)
    assert sorted(a) == sorted(b) and all(torch.equal(a[k], b[k]) for k in a)
    strip = [{k: v for k, v in r.items() if k != "wall_time"} for r in by_path.metrics]
    assert strip == [{k: v for k, v in r.items() if k != "wall_time"} for r in by_name.metrics]


def test_builder_contract_sequential_cut_points_and_one_line_errors(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "path", [*sys.path, str(tmp_path)])
    (tmp_path / "user_contract.py").write_text(
        textwrap.dedent(
            """
            from torch import nn

            def blocks(input_shape, num_classes):
                return [nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, num_classes)]

            def declared():
                seq = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
                seq.cut_points = [2]
                return seq

            def number(num_classes):
                return 3

            def wrong_input(input_shape, num_classes):
                return nn.Sequential(nn.Linear(5, 3), nn.Linear(3, num_classes))

            def flat_output(input_shape, num_classes):
                return nn.Sequential(nn.Linear(8, 4), nn.Flatten(), nn.Linear(32, 4), nn.Flatten(0))
            """
        )
    )
    model = extensions.build_model("user_contract:blocks", (1, 8, 8), 10)
    # every block boundary but 1: a device part of a bare Flatten has nothing to train
    assert model.num_blocks == 4 and model.cut_points == (2, 3) and model.default_cut == 3
    assert extensions.build_model("user_contract:declared", (1, 8, 8), 10).cut_points == (2,)
    messages = {
        "user_contract:number": "model: user_contract:number returned int; expected an nn.Module",
        "user_contract:wrong_input": "model: user_contract:wrong_input does not fit digits",
        "user_contract:flat_output": "model: user_contract:flat_output gives outputs [8]",
        "user_contract:nothing": "model: 'user_contract:nothing': module 'user_contract' has no",
        "no_such_module_h1:f": "model: cannot import 'no_such_module_h1': ModuleNotFoundError",
    }
    for spec, message in messages.items():
        with pytest.raises(ConfigError) as err:
            splitfl.validate(tiny_config(model=spec))
        assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_a_model_object_in_a_mapping_says_what_to_give():
    with pytest.raises(ConfigError, match=r"^model: got a Sequential object; .* import path"):
        splitfl.run(tiny_config(model=nn.Sequential(nn.Flatten(), nn.Linear(64, 10))))


def test_registering_a_taken_name_is_an_error_unless_replace():
    def builder(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(64, num_classes))

    with pytest.raises(ValueError, match="'cnn_digits' is already registered"):
        splitfl.register_model("cnn_digits")(builder)
    with pytest.raises(ValueError, match="'mnist' is already registered"):
        splitfl.register_dataset("mnist")(lambda root=None: None)

    class Shadow(S2FL):
        pass

    with pytest.raises(ValueError, match="'s2fl' is already registered"):
        splitfl.register_algorithm(Shadow)
    assert ALGORITHMS["s2fl"] is S2FL and MODELS["cnn_digits"].builder is not builder
    assert DATASETS["mnist"].loader.__name__ != "<lambda>"
    old = MODELS["mlp"]
    try:
        splitfl.register_model("mlp", replace=True)(builder)
        assert MODELS["mlp"].builder is builder
    finally:
        MODELS["mlp"] = old


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"algorithm": "s2lf"}, "algorithm: unknown 's2lf' (did you mean 's2fl'?)"),
        ({"model": "cnn_digit"}, "model: unknown 'cnn_digit' (did you mean 'cnn_digits'?)"),
        ({"data": {"dataset": "digit"}}, "data.dataset: unknown 'digit' (did you mean 'digits'?)"),
        (
            {"devices": {"preset": "s2fl_table"}},
            "devices.preset: unknown 's2fl_table' (did you mean 's2fl_table1'?)",
        ),
        ({"round": 3}, "round: unknown field (did you mean 'rounds'?)"),
    ],
)
def test_typos_of_registered_names_suggest_the_name(changes, message):
    with pytest.raises(ConfigError) as err:
        splitfl.validate({**tiny_config(), **changes})
    assert str(err.value).startswith(message), str(err.value)


def test_dir_lists_the_lazy_api():
    names = dir(splitfl)
    for name in ("run", "sweep", "validate", "register_model", "register_dataset"):
        assert name in names


def test_an_installed_plugin_registers_itself(tmp_path, monkeypatch):
    site = tmp_path / "site"
    dist = site / "splitfl_h1_plugin-0.1.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: splitfl-h1-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[splitfl.plugins]\nh1 = splitfl_h1_plugin:setup\n")
    (site / "splitfl_h1_plugin.py").write_text(
        "import splitfl\n"
        "from torch import nn\n"
        "def setup():\n"
        "    splitfl.register_model('h1_plugin_mlp')(\n"
        "        lambda input_shape, num_classes: [nn.Flatten(), nn.Linear(64, 16),\n"
        "                                          nn.Linear(16, num_classes)])\n"
    )
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    monkeypatch.setattr(extensions, "_plugins_loaded", False)
    try:
        assert splitfl.validate(tiny_config(model="h1_plugin_mlp")).startswith("ok:")
    finally:
        MODELS.pop("h1_plugin_mlp", None)


def test_a_checkpoint_from_before_imports_existed_still_resumes():
    """A field newer than a checkpoint counts as its default (``imports: []``)."""
    config = splitfl.load_config(None, ["data.dataset=digits"])
    old = json.loads(identity_record(config)["config"])
    assert old.pop("imports") == [] and "import_dirs" not in old  # where, not what
    stored = {"config": json.dumps(old, sort_keys=True), "sha256": "older"}
    assert identity_mismatch(stored, config) is None
    assert 'imports ("<unset>" vs ["json"])' in identity_mismatch(
        stored, config.replace(imports=["json"])
    )


def test_a_device_refuses_a_name_registered_only_in_the_server_in_one_line():
    config = splitfl.load_config(None, ["data.dataset=digits"])
    config = config.replace(data=dataclasses.replace(config.data, dataset="only_on_server"))
    with pytest.raises(ConfigError) as err:
        extensions.device_imports(config)
    message = str(err.value)
    assert message.startswith("data.dataset: unknown 'only_on_server'") and "\n" not in message
    assert message.endswith("reaches devices through a module in imports:)")

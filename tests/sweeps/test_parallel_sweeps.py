"""``executor: parallel`` in sweeps and on a Ray cluster's address.

A sweep trial holding workers reserves them with it (``splitfl/sweeps/resources.py``); its
results equal the same trial with ``executor: sequential``, on the ``local`` and the ``ray``
sweep backend; Ray addresses (``splitfl run --address``, ``parallel.address``, ``splitfl
sweep --address``) are checked in one line. One Ray instance serves the module's Ray tests;
the address tests come first and need Ray not started in this process.
"""

import io
import json
import os
import socket
from pathlib import Path

import pytest
import torch
import yaml

import splitfl
from splitfl.cli.main import main
from splitfl.config import ConfigError, ExperimentConfig, ParallelConfig
from splitfl.experiment.progress import round_progress
from splitfl.sweeps.resources import Demand, check_fits, trial_demand
from splitfl.testing import tiny_config

PARALLEL = {"parallel.workers": 2, "parallel.timeout_s": 120}


def _write(tmp_path: Path, axes: dict, **changes) -> Path:
    """A base config and a sweep file over ``axes`` (2 rounds of the tiny digits config)."""
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(tiny_config(rounds=2, **changes)))
    spec = {"base": "base.yaml", "axes": axes}
    (tmp_path / "sweep.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    return tmp_path / "sweep.yaml"


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").open()]
    return [{k: v for k, v in r.items() if k != "wall_time"} for r in rows]


def assert_same_runs(folder: Path, names: list[str]) -> None:
    """Every run directory in ``names`` has the first one's metric rows and final model,
    bit for bit."""
    assert len(names) > 1  # something is compared
    ref_rows, ref = _rows(folder / names[0]), torch.load(folder / names[0] / "model.pt")
    for name in names[1:]:
        assert _rows(folder / name) == ref_rows, name
        model = torch.load(folder / name / "model.pt")
        assert all(torch.equal(ref[k], model[k]) for k in ref), name


def _free_port() -> int:
    """A local port where nothing listens (bound, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


# --- what a trial reserves -------------------------------------------------------------------


def test_a_trial_reserves_its_workers():
    local = ExperimentConfig(
        executor="parallel", parallel=ParallelConfig(workers=2, threads=2, gpus_per_worker=0.25)
    )
    why = "1 for its driver + 2 workers × 2"
    assert trial_demand(local, 1, 0.5) == Demand({"CPU": 5, "GPU": 1.0}, [], why)
    ray_cfg = ExperimentConfig(
        executor="parallel",
        parallel=ParallelConfig(workers=3, backend="ray", threads=2, gpus_per_worker=1.5),
    )
    demand = trial_demand(ray_cfg, 0.5, 0)
    assert demand.driver == {"CPU": 0.5} and demand.workers == [{"CPU": 2, "GPU": 2}] * 3
    assert dict(demand.total()) == {"CPU": 6.5, "GPU": 6}
    assert trial_demand(ExperimentConfig(), 1, 0) == Demand({"CPU": 1})
    assert trial_demand(ray_cfg, 0, 0).driver == {}  # the task then asks for nothing


def test_a_trial_that_cannot_fit_the_cluster_is_one_line():
    two_nodes = [{"CPU": 2.0, "memory": 1e9}, {"CPU": 2.0}]
    ray_cfg = ExperimentConfig(executor="parallel", parallel=ParallelConfig(backend="ray"))
    check_fits(two_nodes, trial_demand(ray_cfg, 2, 0), "t")  # 4 CPUs over two nodes
    with pytest.raises(ConfigError) as err:
        check_fits(two_nodes, trial_demand(ray_cfg, 2.5, 0), "t")
    assert str(err.value) == (
        "--cpus-per-trial: trial t needs 4.5 CPUs (2.5 for its driver + 2 workers × 1) but "
        "the Ray cluster has 4; lower --cpus-per-trial, parallel.workers or parallel.threads"
    )
    local = ExperimentConfig(executor="parallel")  # local workers run in the trial's task
    with pytest.raises(ConfigError, match=r"trial t: no Ray node has \{'CPU': 3"):
        check_fits(two_nodes, trial_demand(local, 1, 0), "t")
    with pytest.raises(ConfigError, match="needs 1 GPUs but the Ray cluster has 0"):
        check_fits(two_nodes, trial_demand(ExperimentConfig(), 1, 1), "t")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _bar_name(config: ExperimentConfig) -> str:
    bar = round_progress(config, 0, True, stream=_Terminal())
    bar.close()
    return bar.desc


def test_the_progress_bar_names_the_workers():
    cfg = ExperimentConfig(executor="parallel", parallel=ParallelConfig(workers=3, backend="ray"))
    assert _bar_name(cfg) == "s2fl [3 workers, ray]"
    assert _bar_name(ExperimentConfig()) == "s2fl"


def test_a_local_ray_start_gives_its_gcs_two_minutes_unless_the_user_chose(monkeypatch):
    """Ray's GCS server must bind its port within 30 s by default; under CI's load it did not
    (``Timed out waiting for file .../gcs_server_port_...``). splitfl's starts wait 120 s,
    and a value the user set is kept."""
    from splitfl import ray_cluster

    seen = []

    class FakeRay:
        def is_initialized(self):
            return False

        def init(self, **kwargs):
            seen.append((os.environ.get("RAY_gcs_server_port_wait_time_s"), kwargs))

    monkeypatch.delenv("RAY_gcs_server_port_wait_time_s", raising=False)
    assert ray_cluster.join_ray(FakeRay(), None) is True
    assert seen[-1][0] == "120" and seen[-1][1]["num_cpus"] == os.cpu_count()
    monkeypatch.setenv("RAY_gcs_server_port_wait_time_s", "45")
    ray_cluster.join_ray(FakeRay(), None)
    assert seen[-1][0] == "45"


# --- addresses (Ray not started in this process) ---------------------------------------------


@pytest.fixture
def no_ray():
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized(), "the address tests must run before the Ray tests"


def test_run_address_flag_mirrors_the_api_and_a_bad_one_is_one_line(tmp_path, capsys, no_ray):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(tiny_config(executor="parallel", **{"parallel.backend": "ray"})))
    out = tmp_path / "r"
    assert main(["run", str(cfg), "--address", "no address", "--out", str(out)]) == 2
    err = _one_line_error(capsys)
    assert err.startswith("error: parallel.address: 'no address' is not a Ray cluster address")
    assert main(["run", str(cfg), "parallel.address=foo", "--out", str(out)]) == 2
    assert "parallel.address: 'foo' is not a Ray cluster address" in _one_line_error(capsys)
    nobody = f"127.0.0.1:{_free_port()}"  # well formed, nothing listening: no minutes-long wait
    assert main(["run", str(cfg), "--address", nobody, "--out", str(out)]) == 2
    assert f"error: parallel.address: nothing answers at {nobody}" in _one_line_error(capsys)
    assert not out.exists()  # nothing of the run is left
    with pytest.raises(ConfigError, match=f"parallel.address: nothing answers at {nobody}"):
        splitfl.run(cfg, address=nobody, run_dir=out)
    assert not out.exists()
    with pytest.raises(ConfigError, match="parallel.address: a Ray cluster address needs"):
        splitfl.run(tiny_config(executor="parallel"), address="auto", run_dir=out)


def test_resume_takes_an_address(tmp_path, capsys, no_ray):
    """A resumed run's workers may run elsewhere (``parallel`` is not what the run is)."""
    out = tmp_path / "r"
    splitfl.run(tiny_config(rounds=1), run_dir=out)
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--address", "foo"]) == 2
    assert "error: parallel.address: 'foo' is not a Ray cluster" in _one_line_error(capsys)
    with pytest.raises(ConfigError, match=r"--resume: only rounds, network\.\* and parallel"):
        splitfl.resume(out, overrides=["seed=3"])  # rounds may grow (issue 34 item 7)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--address", "foo"], "--address: 'foo' is not a Ray cluster address"),
        (["--address", "ray://h:0"], "--address: 'ray://h:0' is not a Ray cluster address"),
        (["--backend", "local", "--address", "auto"], "--address: a Ray cluster address needs"),
        (["--cpus-per-trial", "-1"], "--cpus-per-trial: must be a number >= 0"),
        (["--address", "NOBODY"], "--address: nothing answers at 127.0.0.1:"),
    ],
)
def test_sweep_address_and_resources_are_checked_in_one_line(
    tmp_path, capsys, no_ray, flags, message
):
    path = _write(tmp_path, {"seed": [0]})
    flags = [f"127.0.0.1:{_free_port()}" if f == "NOBODY" else f for f in flags]
    assert main(["sweep", str(path), "--out", str(tmp_path / "sw"), *flags]) == 2
    assert _one_line_error(capsys).startswith(f"error: {message}")
    assert not (tmp_path / "sw").exists()


# --- sweeps of parallel trials ---------------------------------------------------------------


def test_local_sweep_of_parallel_trials_equals_sequential(tmp_path):
    """Trials one after another in this process, with local worker processes (Ray-actor
    workers: the Ray sweep below and tests/executors/test_parallel.py)."""
    changes = {**PARALLEL, "parallel.backend": "local"}
    path = _write(tmp_path, {"executor": ["sequential", "parallel"]}, **changes)
    result = splitfl.sweep(path, out_dir=tmp_path / "sw", backend="local", progress=False)
    assert result.ok
    assert_same_runs(tmp_path / "sw", ["executor-sequential", "executor-parallel"])


@pytest.mark.slow
def test_ray_sweep_reserves_parallel_workers_and_equals_sequential(tmp_path, capsys, ray_instance):
    """Trials on Ray with Ray-actor and local-process workers equal the sequential run; the
    actor workers ran in the trial's placement group on the sweep's cluster (not a Ray
    instance of their own), released afterwards."""
    from ray._private.state import actors
    from ray.util import placement_group_table

    before = set(placement_group_table()) | set(actors())
    path = _write(tmp_path, {"parallel.backend": ["local", "ray"]}, executor="parallel", **PARALLEL)
    ref = tmp_path / "sw" / "sequential"
    splitfl.run(tiny_config(rounds=2, executor="sequential"), run_dir=ref)
    result = splitfl.sweep(path, out_dir=tmp_path / "sw", backend="ray")
    assert result.ok, result.trials
    assert_same_runs(tmp_path / "sw", ["sequential", *(t["name"] for t in result.trials)])
    out = capsys.readouterr().out
    assert "a parallel trial reserves 3 CPUs (1 for its driver + 2 workers × 1)" in out
    groups = [g for k, g in placement_group_table().items() if k not in before]
    assert [g["bundles"] for g in groups] == [{0: {"CPU": 1.0}, 1: {"CPU": 1.0}, 2: {"CPU": 1.0}}]
    assert groups[0]["state"] == "REMOVED"
    workers = [a for k, a in actors().items() if k not in before]
    assert {a["ActorClassName"] for a in workers} == {"_RayWorker"}
    assert len(workers) == 2 and all(a["State"] == "DEAD" for a in workers)


def test_a_parallel_trial_larger_than_the_cluster_is_refused_before_it_runs(
    tmp_path, capsys, ray_instance
):
    path = _write(tmp_path, {"seed": [0]}, executor="parallel", **PARALLEL)
    code = main(["sweep", str(path), "--out", str(tmp_path / "sw"), "--cpus-per-trial", "2"])
    assert code == 2
    err = _one_line_error(capsys)
    assert "trial seed-0 needs 4 CPUs (2 for its driver + 2 workers × 1)" in err
    assert "the Ray cluster has 3" in err
    assert not (tmp_path / "sw" / "seed-0").exists()

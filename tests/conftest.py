"""Shared test setup: single-threaded torch (fast and stable on a shared 2-core machine), a
profile cache of the session's own, reference runs made once per session, one local Ray
instance for the tests that need one."""

import json
import os
from pathlib import Path

import pytest
import torch

import splitfl
from splitfl.net.server.testbed import Testbed
from splitfl.testing import tiny_config  # noqa: F401  (tests import it from here)


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True, scope="session")
def _deadlines_for_a_busy_machine():
    """Networked tests' rounds get a 10 s deadline floor instead of the default 2 s: a round
    that waits on another test's Ray start on a busy 2-core machine is slow, not late (seen:
    every member of an honest RingSFL round dropped at 2 s). Tests of the deadline set
    ``network.round_deadline_min_s`` themselves."""
    Testbed.round_deadline_min_s = 10.0
    yield
    Testbed.round_deadline_min_s = None


@pytest.fixture(autouse=True, scope="session")
def _own_profile_cache(tmp_path_factory):
    """Model profiles cached in a folder of this test session (and its subprocesses), never
    the user's ``~/.cache/splitfl``."""
    os.environ["SPLITFL_CACHE_DIR"] = str(tmp_path_factory.mktemp("splitfl-cache"))
    yield


@pytest.fixture(scope="session")
def sequential_run(tmp_path_factory):
    """``splitfl.run(config)`` made once per session for each config (a dict, e.g. from
    ``config_for``) and shared by the tests that only read it: the reference runs that
    equivalence tests compare another executor or an interrupted run with. Returns the
    run's ``RunResult``; its folder must not be written to."""
    runs = {}

    def run(config: dict):
        key = json.dumps(config, sort_keys=True)
        if key not in runs:
            runs[key] = splitfl.run(config, run_dir=tmp_path_factory.mktemp("reference") / "run")
        return runs[key]

    return run


@pytest.fixture
def ray_instance():
    """One local Ray instance with 3 CPUs, its workers importing this splitfl, shared by the
    tests that run on a Ray instance this process started (starting one takes seconds, and
    its warm workers serve the next test): started by the first such test, shut down after
    the last one of the run of them (:func:`pytest_runtest_teardown`)."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        from splitfl.ray_cluster import init_ray

        src = str(Path(splitfl.__file__).resolve().parents[1])
        init_ray(
            ray,
            num_cpus=3,
            include_dashboard=False,
            log_to_driver=False,
            runtime_env={"env_vars": {"PYTHONPATH": src}},
        )
    return ray


def _on_ray(item) -> bool:
    return item is not None and "ray_instance" in getattr(item, "fixturenames", ())


def pytest_runtest_teardown(item, nextitem):
    """After the last test of a run of :func:`ray_instance` tests, its Ray instance stops:
    the tests after it run with no Ray started in this process, as they would alone."""
    if _on_ray(item) and not _on_ray(nextitem):
        import ray

        if ray.is_initialized():
            ray.shutdown()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """The tests on :func:`ray_instance` run first (each group in its collected order), as
    one xdist group (``--dist loadgroup``, pyproject's addopts): one worker starts one Ray
    instance and runs them while the other works through the rest; last, they held one
    worker at the end of the suite while the other sat idle. ``tryfirst``: xdist's worker
    reads the ``xdist_group`` marks in its own hook, registered after this conftest and so
    called before it (the marks came too late and the group was split over both workers,
    each starting Ray; tests/test_conftest.py)."""
    for item in items:
        if _on_ray(item):
            item.add_marker(pytest.mark.xdist_group("ray"))
    items.sort(key=lambda item: not _on_ray(item))


__all__ = ["tiny_config"]


def force_batching(monkeypatch, use_vmap: bool) -> None:
    """Make ``executor: vectorized`` batch its clients (one vmap, or row by row) instead of
    running its CPU default, the reference loop: its entry in the one runtime registry is
    replaced for the test."""
    import dataclasses

    from splitfl.executors.vectorized import VectorizedExecutor
    from splitfl.experiment.runtimes import RUNTIMES

    def build(config, device):  # noqa: ANN001
        return VectorizedExecutor(device, config.precision, config.channels_last, use_vmap=use_vmap)

    runtime = dataclasses.replace(RUNTIMES["vectorized"], build=build)
    monkeypatch.setitem(RUNTIMES, "vectorized", runtime)

"""README "Your own algorithm": ``examples/own_algorithm`` (Power-of-Choice selection on
SplitFed, written outside ``src/``) run as a user runs it, from a copy outside the tree; its
selection by hand; a resume through its checkpointed state; its option errors in one line."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from test_examples import _env, _python

from splitfl.algorithms import ALGORITHMS
from splitfl.config import ConfigError

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_algorithm"


@pytest.fixture
def project(tmp_path) -> Path:
    copy = tmp_path / "elsewhere" / "own_algorithm"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    return copy


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_algorithm_example_runs_and_resumes_exactly(project):
    """Four rounds straight, and two rounds resumed for two more. Not fewer: with d = 8
    candidates of 16 clients and 4 a round, round 2 always finds 4 unseen candidates (they
    rank first), so only rounds 3 and 4 read the checkpointed losses."""
    with ThreadPoolExecutor(2) as pool:  # the two runs at once (separate output folders)
        runs = [
            pool.submit(_python, "-m", "splitfl", "run", "config.yaml", *args, cwd=project)
            for args in (("rounds=4", "output.out_dir=full"), ("rounds=2", "output.out_dir=part"))
        ]
        for done in runs:
            done.result()
    (part,) = (project / "part").iterdir()
    _python("-m", "splitfl", "run", "--resume", str(part), "rounds=4", cwd=project)
    (full,) = (project / "full").iterdir()
    straight, resumed = _rows(full), _rows(part)
    assert [r["round"] for r in straight] == [1, 2, 3, 4]
    assert all(len(r["clients"]) == 4 for r in straight)
    # the selection after the resume read the checkpointed losses: the same clients, numbers
    assert [r["clients"] for r in resumed] == [r["clients"] for r in straight]
    assert [r["test_acc"] for r in resumed] == [r["test_acc"] for r in straight]


@pytest.mark.parametrize(
    ("override", "line"),
    [
        ("options.power_of_choice.d=0", "error: options.power_of_choice.d: must be an integer"),
        ("options.power_of_choice.d=2", "error: options.power_of_choice.d: must be >= clients"),
        ("executor=timing", "error: executor: timing: power_of_choice selects clients by"),
    ],
)
def test_the_example_options_fail_in_one_line_before_the_run(project, override, line):
    proc = subprocess.run(
        [sys.executable, "-m", "splitfl", "run", "config.yaml", override, "output.out_dir=x"],
        cwd=project,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().startswith(line) and len(proc.stderr.strip().splitlines()) == 1
    assert not (project / "x").exists()


def _load_example():
    """A fresh copy of the example module. A run of the example's config in this process (the
    own-algorithm tutorial's snippet, tests/examples/test_docs_snippets.py) has registered
    it already: that registration and module are set aside and put back."""
    registered = ALGORITHMS.pop("power_of_choice", None)
    imported = sys.modules.pop("power_of_choice", None)
    spec = importlib.util.spec_from_file_location("power_of_choice", EXAMPLE / "power_of_choice.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["power_of_choice"] = module  # dataclasses look their module up
    try:
        spec.loader.exec_module(module)
    finally:
        ALGORITHMS.pop("power_of_choice", None)  # the example registers itself
        sys.modules.pop("power_of_choice", None)
        if registered is not None:
            ALGORITHMS["power_of_choice"] = registered
        if imported is not None:
            sys.modules["power_of_choice"] = imported
    return module


def test_power_of_choice_keeps_the_highest_loss_candidates_by_hand():
    poc = _load_example()
    sizes = np.array([0, 10, 0, 30, 20, 0])  # only clients 1, 3, 4 can be drawn
    ctx = SimpleNamespace(
        config=SimpleNamespace(train=SimpleNamespace(clients_per_round=2)),
        num_clients=6,
        data_sizes=sizes,
        resolve_cut=lambda cut, name: 2 if cut is None else cut,  # the view's cut resolution
    )
    algo = poc.PowerOfChoice(poc.PowerOfChoiceOptions(d=3), ctx)
    assert algo.options.cut == 2  # resolved when the algorithm was built
    rng = np.random.default_rng(0)
    first = algo.select_clients(1, rng)  # all unseen: two of the drawable clients
    assert len(first) == 2 and set(first) <= {1, 3, 4}
    algo.last_loss = {1: 0.5, 3: 2.0, 4: 1.0}
    assert algo.select_clients(2, rng) == [3, 4]  # the two highest losses of {1, 3, 4}
    algo.last_loss = {1: 0.5, 3: 2.0}  # client 4 not seen yet: it counts as the highest
    assert algo.select_clients(3, rng) == [3, 4]
    restored = poc.PowerOfChoice(poc.PowerOfChoiceOptions(d=3), ctx)
    restored.load_state_dict(json.loads(json.dumps(algo.state_dict())))
    assert restored.last_loss == algo.last_loss
    with pytest.raises(ConfigError, match=r"^options\.power_of_choice\.d: must be >= "):
        poc.PowerOfChoice(poc.PowerOfChoiceOptions(d=1), ctx)

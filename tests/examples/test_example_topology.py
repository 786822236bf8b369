"""docs/how-to/add-a-topology.md: a training pattern added from outside the tree
(``examples/own_topology``) runs on the sequential, parallel and timing executors, which
agree, and its plans cross processes through the plan codec."""

import json
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from test_examples import _python

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "own_topology"
DOC = Path(__file__).resolve().parents[2] / "docs" / "how-to" / "add-a-topology.md"


@pytest.fixture
def project(tmp_path) -> Path:
    copy = tmp_path / "elsewhere" / "own_topology"
    shutil.copytree(EXAMPLE, copy, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    return copy


def _rows(out: Path) -> list[dict]:
    (run_dir,) = out.iterdir()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_how_to_commands_run_and_the_executors_agree(project):
    commands = [line for line in DOC.read_text().splitlines() if line.startswith("python -m")]
    assert len(commands) == 3
    argvs = []
    for i, line in enumerate(commands):
        args = line.split()[1:] + [f"output.out_dir=out{i}"]
        args[3] = "config.yaml"  # the copy's own config (the doc's path is from the repository)
        argvs.append(args)
    with ThreadPoolExecutor(3) as pool:  # the three commands at once (own output folders)
        for done in [pool.submit(_python, *args, cwd=project) for args in argvs]:
            done.result()
    sequential, parallel, timing = (_rows(project / f"out{i}") for i in range(3))
    assert [r["test_acc"] for r in sequential] == [r["test_acc"] for r in parallel]
    assert [r["train_loss"] for r in sequential] == [r["train_loss"] for r in parallel]
    assert [r["round_time"] for r in sequential] == [r["round_time"] for r in timing]
    assert sequential[-1]["test_acc"] > 0.5  # 89 % after the config's 4 rounds


def test_the_patterns_plans_cross_the_plan_codec(project, monkeypatch):
    monkeypatch.syspath_prepend(str(project))
    import shuffled_turns

    from splitfl.core.plan import ClientTask, RoundPlan
    from splitfl.core.plan_codec import decode, encode

    plan = RoundPlan([ClientTask(0, 2)], topology=shuffled_turns.ShuffledTurns(seed=5))
    value, tensors = encode(plan)
    assert value["topology"]["@type"] == "ShuffledTurns"
    assert decode(value, tensors, RoundPlan).topology == plan.topology
    with pytest.raises(ValueError, match="ShuffledTurns.seed"):
        shuffled_turns.ShuffledTurns(seed=-1)

"""``executor: parallel`` returns what the sequential executor returns, bit for bit.

Equivalence runs in float64 on the tiny digits configs, with dropout added to a device block
and a server block: a unit's result then depends on its torch stream too, so a unit seeded by
the order it runs in (rather than by the round and its group) fails these tests.
"""

from pathlib import Path

import pytest
import torch
from torch import nn

import splitfl
from splitfl.algorithms import ALGORITHMS, ALIASES, algorithm_names
from splitfl.config import ConfigError, ParallelConfig
from splitfl.core.seeding import derive_seed, rng_for
from splitfl.executors import NonFiniteLossError, ParallelExecutor, SequentialExecutor
from splitfl.executors.parallel import coupled
from splitfl.experiment.round_step import measure
from splitfl.experiment.runner import as_config, prepare
from splitfl.testing import config_for

HARD = {"train.lr": 0.01, "train.momentum": 0.9, "train.weight_decay": 1e-4}


def _class(name: str):
    return ALGORITHMS[ALIASES[name][0] if name in ALIASES else name]


#: MergeSFL without feature merging trains each worker as its own group (its listing says so).
SPLIT_BY_OPTIONS = {"mergesfl-w/o-FM"}
UNITS = [n for n in algorithm_names() if not _class(n).coupled_round or n in SPLIT_BY_OPTIONS]
COUPLED = [n for n in algorithm_names() if n not in UNITS]


def _prepare(algorithm: str, **changes):
    """The algorithm's tiny config on its model with dropout in a device block and a server
    block (``parallel_models.py``), in float64."""
    ring = algorithm.startswith("ringsfl")
    hard = {"train.lr": 0.01} if ring else HARD
    model = "parallel_models:" + ("mlp_dropout" if ring else "cnn_digits_dropout")
    dropout = {"model": model, "import_dirs": [str(Path(__file__).parents[1])]}
    cfg = as_config(config_for(algorithm, **{**hard, **dropout, **changes}))
    prep = prepare(cfg, dtype=torch.float64)
    assert any(isinstance(m, nn.Dropout) for m in prep.ctx.model.modules())
    return cfg, prep


@pytest.fixture(scope="module")
def executor():
    """Two local workers for the whole module: every algorithm's tiny config has the same
    data and model architecture, which is what the workers hold."""
    _, prep = _prepare("splitfed_v1")
    ex = ParallelExecutor(parallel=ParallelConfig(workers=2, timeout_s=120))
    ex.open(prep.ctx)
    yield ex
    ex.close()


def assert_identical(ref, got) -> None:
    """Same updates in the same order, same server copies: every tensor bit for bit."""
    key = [(u.client, u.cut, u.group, u.samples, u.steps, u.loss_sum) for u in ref.updates]
    assert key == [(u.client, u.cut, u.group, u.samples, u.steps, u.loss_sum) for u in got.updates]
    for u, v in zip(ref.updates, got.updates, strict=True):
        assert u.state.keys() == v.state.keys()
        assert all(torch.equal(u.state[k], v.state[k]) for k in u.state), u.client
        assert (u.aux_state is None) == (v.aux_state is None)
    assert list(ref.server_states) == list(got.server_states)
    for g, state in ref.server_states.items():
        assert all(torch.equal(state[k], got.server_states[g][k]) for k in state), g


def _rounds(algorithm: str, ex, rounds: int = 2):
    """Both executors from the same state and plan, round after round (aggregating the
    sequential result); yields each round's plan and results."""
    cfg, prep = _prepare(algorithm)
    ctx, alg = prep.ctx, prep.algorithm
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    for r in range(rounds):
        torch.manual_seed(derive_seed(cfg.seed, "torch", r))
        clients = alg.select_clients(r, rng_for(cfg.seed, "select", r))
        plan = alg.plan_round(r, clients, rng_for(cfg.seed, "plan", r))
        seed = derive_seed(cfg.seed, "b", r)
        torch.manual_seed(derive_seed(cfg.seed, "torch", r))  # as the runner, per executor
        ref = SequentialExecutor().run_round(ctx, state, plan, seed)
        torch.manual_seed(derive_seed(cfg.seed, "torch", r))
        got = ex.run_round(ctx, state, plan, seed)
        yield plan, ref, got
        report, _ = measure(cfg, alg, plan, ref, r)
        alg.observe(r, plan, report)
        state = alg.aggregate(state, plan, ref)


@pytest.mark.parametrize("algorithm", UNITS)
def test_parallel_round_is_bit_identical_to_sequential(algorithm, executor):
    units = len(executor.stats["unit_seconds"])
    for plan, ref, got in _rounds(algorithm, executor):
        assert coupled(plan) == "", "the round must be dealt to the workers"
        assert_identical(ref, got)
    assert len(executor.stats["unit_seconds"]) >= units + 4  # dealt, not run in the driver


@pytest.mark.parametrize("algorithm", COUPLED)
def test_coupled_rounds_run_in_the_driver_and_equal_sequential(algorithm, executor):
    before = dict(executor.stats["bytes_to_workers"]), executor.stats["coupled_rounds"]
    for plan, ref, got in _rounds(algorithm, executor, rounds=1):
        assert coupled(plan)
        assert_identical(ref, got)
    assert executor.stats["bytes_to_workers"] == before[0]  # nothing was sent
    assert executor.stats["coupled_rounds"] == before[1] + 1


def test_a_diverging_unit_raises_the_sequential_error(executor):
    _, prep = _prepare("splitfed_v1", **{"train.lr": 1e9})
    ctx, alg = prep.ctx, prep.algorithm
    plan = alg.plan_round(0, alg.select_clients(0, rng_for(3, "select", 0)), rng_for(3, "p", 0))
    state = ctx.model.state_dict()
    with pytest.raises(NonFiniteLossError) as ref:
        SequentialExecutor().run_round(ctx, state, plan, 7)
    with pytest.raises(NonFiniteLossError) as got:
        executor.run_round(ctx, state, plan, 7)
    assert str(got.value) == str(ref.value)
    for _, ref_result, result in _rounds("splitfed_v1", executor, rounds=1):
        assert_identical(ref_result, result)  # the workers are still in step


def test_splitfl_run_with_the_parallel_executor_equals_sequential(tmp_path, sequential_run):
    parallel = config_for("s2fl", rounds=2, executor="parallel")
    runs = {  # executor: sequential is the default
        "sequential": sequential_run(config_for("s2fl", rounds=2)),
        "parallel": splitfl.run(parallel, run_dir=tmp_path / "parallel"),
    }
    a, b = (torch.load(r.run_dir / "model.pt", weights_only=True) for r in runs.values())
    assert all(torch.equal(a[k], b[k]) for k in a)
    drop = ("wall_time",)
    rows = [
        [{k: v for k, v in row.items() if k not in drop} for row in r.metrics]
        for r in runs.values()
    ]
    assert rows[0] == rows[1]


def test_ray_workers_equal_sequential(ray_instance):
    ex = ParallelExecutor(parallel=ParallelConfig(workers=2, backend="ray", timeout_s=180))
    _, prep = _prepare("s2fl")
    ex.open(prep.ctx)
    try:
        for _, ref, got in _rounds("s2fl", ex, rounds=1):
            assert_identical(ref, got)
    finally:
        ex.close()


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"parallel.workers": 0}, "parallel.workers: must be in [1, 1024]"),
        ({"parallel.backend": "mpi"}, "parallel.backend: unknown 'mpi'; allowed: local, ray"),
        ({"parallel.threads": 0}, "parallel.threads: must be in [1, "),
        ({"parallel.address": "auto"}, "parallel.address: a Ray cluster address needs"),
        ({"parallel.gpus_per_worker": 1.0}, "parallel.gpus_per_worker: needs device: cuda"),
        ({"parallel.timeout_s": 0}, "parallel.timeout_s: must be > 0"),
        ({"parallel.max_retries": -1}, "parallel.max_retries: must be in [0, 100]"),
    ],
)
def test_bad_parallel_values_are_one_line_errors(changes, message):
    with pytest.raises(ConfigError) as err:
        as_config(config_for("s2fl", executor="parallel", **changes))
    assert str(err.value).startswith(message), str(err.value)


def test_a_graph_split_model_on_parallel_workers_equals_sequential(tmp_path, sequential_run):
    """Workers build an ``nn.Module`` with its own forward from its import path and cut it
    where the config says (a skip crossing the cut): bit-identical to the sequential run."""
    graph = {
        "model": "graph_models:small_resnet",
        "split.cut_points": ["layer1", "layer2"],
        "import_dirs": [str(Path(__file__).parents[1])],
    }
    runs = {
        "sequential": sequential_run(config_for("mergesfl", rounds=2, **graph)),
        "parallel": splitfl.run(
            config_for("mergesfl", rounds=2, executor="parallel", **graph),
            run_dir=tmp_path / "parallel",
        ),
    }
    a, b = (torch.load(r.run_dir / "model.pt", weights_only=True) for r in runs.values())
    assert "layer1.conv1.weight" in a  # the user's own parameter names
    assert all(torch.equal(a[k], b[k]) for k in a)

"""The vectorised executor computes what the sequential reference computes."""

import copy

import pytest
import torch
from torch import nn

import splitfl
from conftest import force_batching, tiny_config
from splitfl.algorithms import ALGORITHMS
from splitfl.config import ConfigError
from splitfl.core.plan import ClientTask, RoundPlan
from splitfl.core.seeding import derive_seed, rng_for
from splitfl.core.topology import ServerSpec, Star
from splitfl.executors import SequentialExecutor
from splitfl.executors.rowstack import RowStack, chain_ema, sgd_rows
from splitfl.executors.vectorized import VectorizedExecutor
from splitfl.experiment.round_step import measure as _measure
from splitfl.experiment.runner import as_config, prepare
from splitfl.experiment.runtimes import RUNTIMES
from splitfl.testing import config_for as cfg_for

HARD = {"train.lr": 0.01, "train.momentum": 0.9, "train.weight_decay": 1e-4}
#: Executors are compared in float64 (``prepare(..., dtype=torch.float64)``): kernel-order
#: noise is ~1e-16 there on any machine, a real discrepancy stays ≥ 1e-4 (fp32 comparisons
#: failed on AVX2-only machines, where oneDNN's grouped-convolution kernels round differently).
F64_ATOL = 1e-9


def hard(algorithm: str) -> dict:
    """HARD, less momentum and weight decay for RingSFL (its plain-SGD ring rejects them)."""
    return {"train.lr": 0.01} if algorithm.startswith("ringsfl") else HARD


@pytest.fixture(params=[True, False], ids=["vmap", "rows"])
def use_vmap(request, monkeypatch):
    """Both batched ways of running a bucket: one vmap (the GPU default) and row by row."""
    force_batching(monkeypatch, request.param)
    return request.param


def assert_same_result(ref, got, atol: float = 1e-5) -> None:
    """Two executors' RoundResults agree: who, how much, parameters and server copies."""
    assert [(u.client, u.cut, u.group, u.samples, u.steps) for u in ref.updates] == [
        (u.client, u.cut, u.group, u.samples, u.steps) for u in got.updates
    ]
    for u, v in zip(ref.updates, got.updates, strict=True):
        assert u.loss_sum == pytest.approx(v.loss_sum, rel=atol)
        assert u.state.keys() == v.state.keys()
        for k in u.state:
            assert torch.allclose(u.state[k].double(), v.state[k].double(), atol=atol), k
    assert ref.server_states.keys() == got.server_states.keys()
    for g, state in ref.server_states.items():
        assert state.keys() == got.server_states[g].keys()
        for k in state:
            assert torch.allclose(state[k].double(), got.server_states[g][k].double(), atol=atol)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_vectorized_round_equals_sequential_round(algorithm, use_vmap):
    """Each round, from the same global state and plan, both executors return the same
    updates. (Rounds are compared one at a time: over several rounds these small-batch
    BatchNorm runs are chaotic — a 6e-8 perturbation of the global state changes the
    *sequential* executor's own next round by up to 5e-4 — so end-to-end comparisons would
    measure that sensitivity, not the executor.)"""
    compare_rounds(as_config(cfg_for(algorithm, **hard(algorithm))), use_vmap)


def compare_rounds(cfg, use_vmap: bool, rounds: int = 2) -> set[int]:
    """Both executors from the same global state and plan, round after round (aggregating
    the sequential result), in float64; returns the cut points the plans used."""
    prep = prepare(cfg, dtype=torch.float64)
    ctx, alg = prep.ctx, prep.algorithm
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    cuts = set()
    for r in range(rounds):
        torch.manual_seed(derive_seed(cfg.seed, "torch", r))
        plan = alg.plan_round(
            r, alg.select_clients(r, rng_for(cfg.seed, "select", r)), rng_for(cfg.seed, "plan", r)
        )
        cuts |= {t.cut for t in plan.tasks}
        seed = derive_seed(cfg.seed, "b", r)
        torch.manual_seed(derive_seed(cfg.seed, "torch", r))  # as the runner, per executor
        ref = SequentialExecutor().run_round(ctx, state, plan, seed)
        torch.manual_seed(derive_seed(cfg.seed, "torch", r))
        got = VectorizedExecutor(use_vmap=use_vmap).run_round(ctx, state, plan, seed)
        assert_same_result(ref, got, atol=F64_ATOL)
        report, _ = _measure(cfg, alg, plan, ref, r)
        alg.observe(r, plan, report)
        state = alg.aggregate(state, plan, ref)
    return cuts


@pytest.mark.parametrize("algorithm", ["s2fl", "mergesfl", "ringsfl"])
def test_config_selects_the_vectorized_executor(algorithm, use_vmap, tmp_path, sequential_run):
    """``executor: vectorized`` through the runner: one round gives the same model and
    metrics as ``executor: sequential`` (made once for both ways of running a bucket)."""
    config = {
        ex: cfg_for(algorithm, rounds=1, executor=ex, **hard(algorithm))
        for ex in ("sequential", "vectorized")
    }
    runs = {
        "sequential": sequential_run(config["sequential"]),
        "vectorized": splitfl.run(config["vectorized"], run_dir=tmp_path / "vectorized"),
    }
    a, b = (torch.load(r.run_dir / "model.pt", weights_only=True) for r in runs.values())
    for key in a:
        assert torch.allclose(a[key].float(), b[key].float(), atol=1e-5, rtol=0), key
    (ra,), (rb,) = runs["sequential"].metrics, runs["vectorized"].metrics
    assert ra["sim_time"] == rb["sim_time"]
    assert ra["train_loss"] == pytest.approx(rb["train_loss"], rel=1e-5)
    assert ra["test_acc"] == pytest.approx(rb["test_acc"], abs=2e-3)


@pytest.mark.parametrize("max_rows", [None, 2])
def test_mixed_cuts_unequal_batches_and_steps_in_one_group(use_vmap, max_rows):
    """One server copy shared by members with different cuts, batch sizes and step counts (the
    hard case: per-block server masks, BatchNorm chaining across buckets, short last batch),
    all in one batched call or packed two rows (whole groups) per call; server forwards per
    member or on merged batches per cut point (concatenated across batch-size buckets)."""
    prep = prepare(as_config(tiny_config(**HARD)), dtype=torch.float64)
    ctx = prep.ctx
    tasks = [
        ClientTask(client=0, cut=1, group=0, batch_size=8, steps=3, lr=0.01),
        ClientTask(client=1, cut=2, group=0, batch_size=16, steps=2, lr=0.01),
        ClientTask(client=2, cut=1, group=0, batch_size=16, steps=4, lr=0.01),
        ClientTask(client=3, cut=2, group=1, batch_size=12, steps=2, lr=0.02),
        ClientTask(client=4, cut=ctx.model.num_blocks, group=2, batch_size=16, steps=2, lr=0.01),
    ]
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    combos = [("mean", "own", "separate"), ("sum", "union", "separate")]
    combos += [("mean", "own", "concat"), ("sum", "union", "concat")]
    for group_loss, device_grad, group_forward in combos:
        server = ServerSpec(
            group_loss=group_loss, device_grad=device_grad, lr=0.03, forward=group_forward
        )
        plan = RoundPlan(tasks, topology=Star(server=server))
        torch.manual_seed(0)
        ref = SequentialExecutor().run_round(ctx, state, plan, round_seed=7)
        torch.manual_seed(0)
        ex = VectorizedExecutor(use_vmap=use_vmap, max_rows=max_rows)
        got = ex.run_round(ctx, state, plan, round_seed=7)
        assert ex.fallbacks == 0
        assert_same_result(ref, got, atol=F64_ATOL)


def test_sgd_rows_equals_torch_sgd_per_row():
    torch.manual_seed(0)
    lin = nn.Linear(3, 2)
    copies = [copy.deepcopy(lin) for _ in range(3)]
    lrs = [0.1, 0.05, 0.2]
    stack = RowStack.from_states(lin, [c.state_dict() for c in copies], lrs, "cpu")
    opts = [
        torch.optim.SGD(c.parameters(), lr=lr, momentum=0.9, weight_decay=0.01)
        for c, lr in zip(copies, lrs, strict=True)
    ]
    active = [[True, True, False], [True, False, True], [True, True, True]]
    for step, on in enumerate(active):
        x = torch.randn(3, 4, 3)
        for i, (c, opt) in enumerate(zip(copies, opts, strict=True)):
            if on[i]:
                opt.zero_grad()
                c(x[i]).pow(2).sum().backward()
                opt.step()
        out = torch.func.vmap(lambda p, xb: torch.func.functional_call(lin, p, (xb,)))(
            stack.params, x
        )
        mask = torch.tensor(on)
        (out.pow(2).sum(dim=(1, 2)) * mask).sum().backward()
        sgd_rows(stack, dict.fromkeys(stack.params, mask), 0.9, 0.01)
        stack.zero_grad()
        for i, c in enumerate(copies):
            for name, p in c.named_parameters():
                assert torch.allclose(stack.params[name][i], p, atol=1e-7), (step, i, name)


def test_chain_ema_equals_batchnorm_applied_in_order():
    torch.manual_seed(0)
    bn = nn.BatchNorm1d(4, momentum=0.3)
    start = bn.running_mean.clone()
    singles = []
    batches = [torch.randn(5, 4) + i for i in range(3)]
    for xb in batches:
        one = copy.deepcopy(bn)
        one(xb)
        singles.append(one.running_mean.clone())
    for xb in batches:
        bn(xb)
    chained = chain_ema(start, torch.stack(singles), 0.3)
    assert torch.allclose(chained, bn.running_mean, atol=1e-6)


@pytest.mark.parametrize("algorithm", ["splitfed_v2", "vanilla_sl", "locfedmix_sl"])
def test_sequential_by_definition_plans_use_the_reference(algorithm):
    prep = prepare(as_config(cfg_for(algorithm)))
    ctx, alg = prep.ctx, prep.algorithm
    import numpy as np

    plan = alg.plan_round(
        0, alg.select_clients(0, np.random.default_rng(0)), np.random.default_rng(1)
    )
    assert not VectorizedExecutor.batchable(plan, ctx.model)
    ex = VectorizedExecutor(use_vmap=True)
    ex.run_round(ctx, ctx.model.state_dict(), plan, round_seed=1)
    assert ex.fallbacks == 1


@pytest.mark.parametrize("version", ["ringsfl", "ringsfl-v2"])
def test_ring_with_batchnorm_equals_sequential(version, use_vmap):
    """RingSFL on a BatchNorm CNN with uneven lengths: several starts run through the same
    client's blocks, so its running statistics chain and its gradients add up."""
    changes = {
        "model": "cnn_digits",
        "data.num_clients": 3,
        "train.clients_per_round": 3,
        "options.ringsfl.prop_lens": "3:1:1",
    }
    config = as_config(tiny_config(algorithm=version, **changes, **hard(version)))
    prep = prepare(config, dtype=torch.float64)
    ctx, alg = prep.ctx, prep.algorithm
    import numpy as np

    plan = alg.plan_round(
        0, alg.select_clients(0, np.random.default_rng(0)), np.random.default_rng(1)
    )
    assert (
        len(set(plan.topology.spec.lengths.values())) > 1
    )  # uneven: blocks shared by several starts
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    ref = SequentialExecutor().run_round(ctx, state, plan, round_seed=3)
    ex = VectorizedExecutor(use_vmap=use_vmap)
    got = ex.run_round(ctx, state, plan, round_seed=3)
    assert ex.fallbacks == 0
    assert_same_result(ref, got, atol=F64_ATOL)


@pytest.mark.parametrize("executor", ["sequential", "vectorized"])
def test_bf16_and_channels_last_stay_close_to_fp32(executor, use_vmap, tmp_path):
    """bf16 autocast changes rounding only: after two rounds the training loss is within a
    few percent of the fp32 run's."""
    runs = {
        precision: splitfl.run(
            tiny_config(
                algorithm="s2fl",
                rounds=2,
                executor=executor,
                precision=precision,
                channels_last=precision == "bf16",
            ),
            run_dir=tmp_path / precision,
        )
        for precision in ("fp32", "bf16")
    }
    assert runs["bf16"].summary["status"] == "ok"
    fp32, bf16 = (r.metrics[-1]["train_loss"] for r in runs.values())
    assert bf16 == pytest.approx(fp32, rel=0.05)
    assert fp32 != bf16  # bf16 really ran


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"executor": "gpu"}, "executor"),
        ({"precision": "fp8"}, "precision"),
        ({"device": "tpu"}, "device"),
    ],
)
def test_bad_engine_settings_are_rejected(changes, field):
    with pytest.raises(ConfigError) as err:
        splitfl.validate(tiny_config(**changes))
    assert str(err.value).startswith(field)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-GPU message")
def test_cuda_without_gpu_is_one_line_error():
    with pytest.raises(ConfigError, match="no CUDA GPU"):
        splitfl.validate(tiny_config(device="cuda"))


def test_cpu_default_is_the_reference_loop_and_gpu_default_is_vmap():
    assert VectorizedExecutor("cpu").mode == "reference"
    assert VectorizedExecutor("cpu", use_vmap=False).mode == "rows"
    assert VectorizedExecutor("cuda").mode == "vmap"  # constructing touches no GPU


def test_every_executor_is_listed():
    assert set(splitfl.catalog()["executors"]) == set(RUNTIMES)
    assert RUNTIMES.keys() >= {"sequential", "vectorized", "timing", "parallel", "networked"}


#: An ``nn.Module`` with its own forward, split by its graph where a skip crosses the cut
#: (two tensors cross after ``mid``; tests/graph_models.py).
GRAPH_SPLIT = {"model": "graph_models:unet", "split.cut_points": ["mid", "up"], "split.cut": "mid"}


@pytest.mark.parametrize("algorithm", ["s2fl", "mergesfl", "splitfed_v1", "ringsfl"])
def test_vectorized_equals_sequential_on_a_graph_split_model(algorithm, use_vmap):
    """Tuple activations (the U-Net's skip and activation) through the row stacks, merged
    batches, per-member gradients and the batched ring, as the sequential executor runs them."""
    ring = {"split.cut_points": ["down", "mid", "up"]} if algorithm == "ringsfl" else {}
    cfg = as_config(cfg_for(algorithm, **hard(algorithm), **{**GRAPH_SPLIT, **ring}))
    cuts = compare_rounds(cfg, use_vmap)
    assert 1 in cuts or algorithm == "ringsfl"  # the two-tensor cut was trained (a ring
    # crosses every block boundary)

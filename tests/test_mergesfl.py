"""MergeSFL integration: feature merging gradients, Eq. (17) aggregation, state estimation."""

import numpy as np
import torch

import splitfl
from conftest import tiny_config
from splitfl.algorithms.base import ClientTask, RoundPlan
from splitfl.engine.executor import SequentialExecutor
from splitfl.engine.runner import as_config, prepare


def _ctx(**changes):
    return prepare(as_config(tiny_config(algorithm="mergesfl", **changes))).ctx


def _run(ctx, plan):
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    return SequentialExecutor().run_round(ctx, state, plan, round_seed=11)


def test_feature_merging_gives_each_worker_its_own_mean_loss_gradient():
    """One merged top-model step returns to each worker exactly the gradient of its own mean
    loss: its device update equals the one from a separate top-model copy (Eq. 16 + slices)."""
    ctx = _ctx()
    cut = ctx.cut_points[1]
    tasks = [ClientTask(0, cut, 0, 4, 1, 0.1), ClientTask(1, cut, 0, 12, 1, 0.3)]
    merged = _run(ctx, RoundPlan(tasks, "per_step", "mean", "own", server_lr=0.1))
    separate = [ClientTask(0, cut, 0, 4, 1, 0.1), ClientTask(1, cut, 1, 12, 1, 0.3)]
    alone = _run(ctx, RoundPlan(separate, "per_step", "mean", "own", server_lr=0.1))
    for a, b in zip(merged.updates, alone.updates, strict=True):
        for key in a.state:
            assert torch.allclose(a.state[key], b.state[key], atol=1e-6), key
    # while the 'union' reading scales a worker's gradient by d_i / Σd (here 4/16 and 12/16)
    union = _run(ctx, RoundPlan(tasks, "per_step", "mean", "union", server_lr=0.1))
    key = next(k for k in union.updates[0].state if k.endswith("weight"))
    init = ctx.model.state_dict()[key]
    step_union = union.updates[0].state[key] - init
    step_own = merged.updates[0].state[key] - init
    assert torch.allclose(step_union, step_own * 4 / 16, atol=1e-6)


def test_merged_top_model_step_is_one_step_on_the_concatenated_batch():
    ctx = _ctx()
    cut = ctx.cut_points[1]
    tasks = [ClientTask(0, cut, 0, 4, 1, 0.1), ClientTask(1, cut, 0, 12, 1, 0.1)]
    res = _run(ctx, RoundPlan(tasks, "per_step", "mean", "own", server_lr=0.1))
    assert set(res.server_states) == {0}  # a single top model trained on the merged features
    assert [u.samples for u in res.updates] == [4, 12]


def test_eq17_weights_by_batch_size(tmp_path):
    res = splitfl.run(
        tiny_config(algorithm="mergesfl", rounds=1, **{"options.mergesfl.tau": 2}),
        run_dir=tmp_path / "m",
    )
    row = res.metrics[0]
    assert len(row["plan_batch_sizes"]) == len(row["clients"])
    # budget default = clients_per_round x D x c per iteration (Eq. 10) is never exceeded
    prep = prepare(res.config)
    c = prep.ctx.profile.activation_bytes(prep.ctx.resolve_cut(None, "mergesfl"))
    assert sum(row["plan_batch_sizes"]) * c <= 6 * 16 * c
    assert row["plan_kl_after"] >= 0


def test_ablation_without_batch_regulation_uses_one_batch_size(tmp_path):
    res = splitfl.run(
        tiny_config(algorithm="mergesfl-w/o-BR", rounds=1, **{"options.mergesfl.tau": 2}),
        run_dir=tmp_path / "m",
    )
    assert len(set(res.metrics[0]["plan_batch_sizes"])) == 1


def test_state_estimation_moving_average_after_a_round(tmp_path):
    cfg = as_config(tiny_config(algorithm="mergesfl", rounds=1, **{"options.mergesfl.tau": 2}))
    prep = prepare(cfg)
    alg = prep.algorithm
    mu0, beta0 = alg.state.estimates(0)
    assert np.all(mu0 == 1.0) and np.all(beta0 == 1.0)  # nothing measured yet: all equal


def test_eq17_bottom_models_weighted_by_batch_size():
    from splitfl.algorithms.base import ClientUpdate, RoundResult

    prep = prepare(as_config(tiny_config(algorithm="mergesfl")))
    alg, ctx = prep.algorithm, prep.ctx
    cut = alg.cut
    g = ctx.model.state_dict()
    dev_keys = [k for k in g if int(k.split(".")[1]) < cut]
    top = {k: v for k, v in g.items() if int(k.split(".")[1]) >= cut}

    def update(client, value):
        state = {
            k: torch.full_like(g[k], value) if g[k].is_floating_point() else g[k] for k in dev_keys
        }
        return ClientUpdate(client, cut, 0, 1, 1, state, 0.0)

    plan = RoundPlan([ClientTask(0, cut, 0, 4, 1), ClientTask(5, cut, 0, 12, 1)])
    # data sizes differ from batch sizes: Eq. 17 must use d_i (4 and 12), not |D_i|
    assert ctx.data_sizes[0] * 12 != ctx.data_sizes[5] * 4
    out = alg.aggregate(g, plan, RoundResult([update(0, 1.0), update(5, 2.0)], {0: top}))
    key = next(k for k in dev_keys if g[k].is_floating_point())
    assert torch.allclose(out[key], torch.full_like(g[key], (4 * 1.0 + 12 * 2.0) / 16))

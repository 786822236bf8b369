"""MergeSFL integration: feature merging gradients, Eq. (17) aggregation, state estimation."""

import numpy as np
import pytest
import torch
from test_feature_merging import SEED, hand_concatenated_step

import splitfl
from conftest import tiny_config
from splitfl.algorithms.state_estimation import FEATURE_LINKS
from splitfl.core.plan import ClientTask, ClientUpdate, RoundPlan, RoundResult
from splitfl.core.seeding import rng_for
from splitfl.core.topology import ServerSpec, Star
from splitfl.executors.sequential import SequentialExecutor
from splitfl.executors.vectorized import VectorizedExecutor
from splitfl.experiment.round_step import measure as _measure
from splitfl.experiment.runner import as_config, prepare


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
    merged = _run(ctx, RoundPlan(tasks, topology=_star("own")))
    separate = [ClientTask(0, cut, 0, 4, 1, 0.1), ClientTask(1, cut, 1, 12, 1, 0.3)]
    alone = _run(ctx, RoundPlan(separate, topology=_star("own")))
    for a, b in zip(merged.updates, alone.updates, strict=True):
        for key in a.state:
            assert torch.allclose(a.state[key], b.state[key], atol=1e-6), key
    # while the 'union' reading scales a worker's gradient by d_i / Σd (here 4/16 and 12/16)
    union = _run(ctx, RoundPlan(tasks, topology=_star("union")))
    key = next(k for k in union.updates[0].state if k.endswith("weight"))
    init = ctx.model.state_dict()[key]
    step_union = union.updates[0].state[key] - init
    step_own = merged.updates[0].state[key] - init
    assert torch.allclose(step_union, step_own * 4 / 16, atol=1e-6)


@pytest.mark.parametrize("executor", ["sequential", "vmap", "rows"])
def test_merged_top_model_step_is_one_step_on_the_concatenated_batch(executor):
    """MergeSFL's own plan (default ``merge: concat``), one iteration: the executor's top model
    and every bottom model equal a step built by hand on the concatenated features (BatchNorm
    in the top model, so per-worker forwards would not pass)."""
    prep = prepare(as_config(tiny_config(algorithm="mergesfl", **{"options.mergesfl.cut": 1})))
    ctx, alg = prep.ctx, prep.algorithm
    plan = alg.plan_round(0, alg.select_clients(0, rng_for(3, "s", 0)), rng_for(3, "p", 0))
    for t in plan.tasks:
        t.steps = 1
    assert (
        plan.topology.server.forward == "concat" and len(set(t.batch_size for t in plan.tasks)) > 1
    )
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    devices, servers = hand_concatenated_step(ctx, state, plan)
    ex = {
        "sequential": SequentialExecutor(),
        "vmap": VectorizedExecutor(use_vmap=True),
        "rows": VectorizedExecutor(use_vmap=False),
    }[executor]
    res = ex.run_round(ctx, state, plan, round_seed=SEED)
    assert set(res.server_states) == {0}  # a single top model trained on the merged features
    for key, value in servers[0].items():
        assert torch.allclose(res.server_states[0][key].float(), value.float(), atol=1e-6), key
    assert [u.samples for u in res.updates] == [t.batch_size for t in plan.tasks]
    for u in res.updates:
        for key, value in devices[u.client].items():
            assert torch.allclose(u.state[key].float(), value.float(), atol=1e-6), key


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
    # the logged KL(Φ_h‖Φ_0) is Eq. (11)-(12) of the logged selection and sizes, by hand
    dists = prep.ctx.label_hist / prep.ctx.label_hist.sum(1, keepdims=True)
    d = np.asarray(row["plan_batch_sizes"], dtype=float)
    phi_h = d @ dists[row["clients"]] / d.sum()
    phi_0 = dists.mean(0)
    kl = sum(p * np.log(p / q) for p, q in zip(phi_h, phi_0, strict=True) if p > 0)
    assert row["plan_kl_after"] == pytest.approx(kl, rel=1e-9, abs=1e-12)


def test_ablation_without_batch_regulation_uses_one_batch_size(tmp_path):
    res = splitfl.run(
        tiny_config(algorithm="mergesfl-w/o-BR", rounds=1, **{"options.mergesfl.tau": 2}),
        run_dir=tmp_path / "m",
    )
    assert len(set(res.metrics[0]["plan_batch_sizes"])) == 1


def test_state_estimation_moving_averages_over_rounds():
    """Three rounds through the executor and the simulated clock: after every round each
    participant's μ, β are 0.8·previous + 0.2·measured (Eq. 5–6; measured = the clock's
    per-sample compute and feature-transfer time × the round's jitter; the first value is
    taken as is); workers that sat the round out keep their estimates (no oracle probe)."""
    changes = {"options.mergesfl.tau": 2, "devices.jitter": 0.3, "devices.composition": "5:3:2"}
    cfg = as_config(tiny_config(algorithm="mergesfl", **changes))
    prep = prepare(cfg)
    ctx, alg = prep.ctx, prep.algorithm
    n = ctx.num_clients
    mu0, beta0 = alg.state.estimates(0)
    assert np.all(mu0 == 1.0) and np.all(beta0 == 1.0)  # nothing measured yet: all equal
    mu, beta = [None] * n, [None] * n

    def average(previous, x):
        return x if previous is None else 0.8 * previous + 0.2 * x

    sat_out = 0
    for r in range(3):
        plan = alg.plan_round(r, alg.select_clients(r, rng_for(3, "s", r)), rng_for(3, "p", r))
        res = _run(ctx, plan)
        report, _ = _measure(cfg, alg, plan, res, r)
        alg.observe(r, plan, report)
        for t in plan.tasks:  # measured per-sample times from the clock's report × jitter
            c, cost, jit = t.client, report.costs[t.client], report.jitter[t.client]
            share = sum(getattr(cost.traffic, k) for k in FEATURE_LINKS) / cost.traffic.total
            samples = report.samples[c]
            mu[c] = average(mu[c], cost.device_time * jit / samples)
            beta[c] = average(beta[c], cost.comm_time * jit * share / samples)
        sat_out += n - len(plan.tasks)
        for got, want in ((alg.state.mu, mu), (alg.state.beta, beta)):  # others' do not move
            assert [g is None for g in got] == [w is None for w in want]
            assert [g for g in got if g is not None] == pytest.approx(
                [w for w in want if w is not None], rel=1e-12
            )
    assert sat_out > 0 and any(m is not None for m in mu)
    assert len({round(j, 6) for j in report.jitter.values()}) > 1  # jitter really varied


def test_eq17_bottom_models_weighted_by_batch_size():
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


def _star(device_grad: str) -> Star:
    return Star(server=ServerSpec(device_grad=device_grad, lr=0.1))

"""ParallelSFL integration: roles, Eq. (4)+(18) aggregation, clustered traffic accounting."""

import dataclasses

import numpy as np
import pytest
import torch

import splitfl
from conftest import tiny_config
from splitfl.experiment.runner import as_config, prepare
from splitfl.plan import ClientTask, ClientUpdate, RoundPlan, RoundReport, RoundResult
from splitfl.seeding import rng_for

FAST = {"options.parallelsfl.tau": 3, "devices.preset": "jetson80", "data.num_clients": 20}


def test_top_workers_contribute_no_training_data(tmp_path):
    res = splitfl.run(
        tiny_config(algorithm="parallelsfl", rounds=2, **FAST), run_dir=tmp_path / "p"
    )
    for row in res.metrics:
        assert row["plan_tops"], "at least one cluster"
        assert not set(row["plan_tops"]) & set(row["clients"])  # tops never train
        assert row["bytes_d2d_activations"] > 0 and row["bytes_activations_up"] == 0
        # Eq. (16) cluster waiting logged as planned and as charged by the clock
        assert row["plan_cluster_waiting"] >= 0 and row["plan_cluster_waiting_clock"] >= 0


def test_eq4_eq18_aggregation_by_hand():
    prep = prepare(as_config(tiny_config(algorithm="parallelsfl", **FAST)))
    alg, g = prep.algorithm, prep.ctx.model.state_dict()
    cut = alg.cut
    key_b = next(k for k in g if int(k.split(".")[1]) < cut and g[k].is_floating_point())
    key_t = next(k for k in g if int(k.split(".")[1]) >= cut and g[k].is_floating_point())

    def bottom(client, value):
        return {
            k: torch.full_like(v, value) if v.is_floating_point() else v
            for k, v in g.items()
            if int(k.split(".")[1]) < cut
        }

    def top(value):
        return {
            k: torch.full_like(v, value) if v.is_floating_point() else v
            for k, v in g.items()
            if int(k.split(".")[1]) >= cut
        }

    # cluster 0: workers 1, 2 (tau 4), bottoms 1.0 and 3.0, top 10; cluster 1: worker 3
    # (tau 2), bottom 5.0, top 20
    tasks = [ClientTask(1, cut, 0, 8, 4), ClientTask(2, cut, 0, 8, 4), ClientTask(3, cut, 1, 8, 2)]
    updates = [
        ClientUpdate(t.client, cut, t.group, 8, t.steps, bottom(t.client, v), 0.0)
        for t, v in zip(tasks, (1.0, 3.0, 5.0), strict=True)
    ]
    out = alg.aggregate(g, RoundPlan(tasks), RoundResult(updates, {0: top(10.0), 1: top(20.0)}))
    # Eq. 4: cluster bottoms 2.0 and 5.0; Eq. 18 weights N_c*tau_c = 8 and 2
    assert torch.allclose(out[key_b], torch.full_like(g[key_b], (8 * 2.0 + 2 * 5.0) / 10))
    assert torch.allclose(out[key_t], torch.full_like(g[key_t], (8 * 10.0 + 2 * 20.0) / 10))


def test_ablations_fix_tau(tmp_path):
    for name in ("parallelsfl-WC", "parallelsfl-R"):
        res = splitfl.run(tiny_config(algorithm=name, rounds=1, **FAST), run_dir=tmp_path / name)
        assert set(res.metrics[0]["plan_taus"]) == {3}


#: Static devices with D2D radios, full batches (min_samples = batch x tau), no jitter.
EXACT = {
    "options.parallelsfl.tau": 2,
    "devices.preset": "s2fl_table1",
    "data.num_clients": 20,
    "data.min_samples": 8,
    "train.batch_size": 4,
}


def _planned(alg, round_idx: int = 0) -> RoundPlan:
    clients = list(range(alg.ctx.num_clients))
    return alg.plan_round(round_idx, clients, rng_for(3, "plan", round_idx))


def _clock_costs(alg, plan, r: int = 0) -> dict:
    ctx = alg.ctx
    return {
        t.client: alg.client_cost(t, ctx.round_samples(t.client, t.batch_size, t.steps), r, plan)
        for t in plan.tasks
    }


@pytest.mark.parametrize("contention", [True, False])
def test_planner_predicts_the_time_the_clock_charges(contention):
    cfg = tiny_config(algorithm="parallelsfl", **EXACT, **{"devices.contention": contention})
    alg = prepare(as_config(cfg)).algorithm
    plan = _planned(alg)
    groups = sorted(plan.groups().items())
    clusters = [(alg.tops[g], [t.client for t in tasks]) for g, tasks in groups]
    t_co, beta_c = alg.planned_times(clusters)
    costs = _clock_costs(alg, plan)
    for (_, tasks), t, b in zip(groups, t_co, beta_c, strict=True):
        charged = max(costs[task.client].time for task in tasks)
        assert charged == pytest.approx(tasks[0].steps * t + b, rel=1e-9)
    assert max(c.time for c in costs.values()) == pytest.approx(plan.info["round_time"], rel=1e-9)


def test_every_cluster_member_runs_its_clusters_tau_from_eq17():
    alg = prepare(as_config(tiny_config(algorithm="parallelsfl", **FAST))).algorithm
    plan = _planned(alg)
    groups = sorted(plan.groups().items())
    # one tau per cluster, and they are the plan's taus in cluster order
    assert [{t.steps for t in tasks} for _, tasks in groups] == [{t} for t in plan.info["taus"]]
    # Eq. (17) on the shared cluster model: no cluster exceeds the fastest one at tau, and one
    # more iteration would (unless it already runs tau)
    clusters = [(alg.tops[g], [t.client for t in tasks]) for g, tasks in groups]
    t_co, beta_c = alg.planned_times(clusters)
    taus = np.array(plan.info["taus"])
    target = np.min(3 * t_co + beta_c)
    assert np.all((taus == 1) | (taus * t_co + beta_c <= target * (1 + 1e-9)))
    assert np.all((taus == 3) | ((taus + 1) * t_co + beta_c > target))
    assert len(set(plan.info["taus"])) > 1, "heterogeneous clusters get different taus"


def test_estimates_follow_reported_costs_not_true_profiles():
    prep = prepare(as_config(tiny_config(algorithm="parallelsfl", **EXACT)))
    alg, ctx = prep.algorithm, prep.ctx
    plan = _planned(alg)
    mu_b0, d2d0 = alg.mu_b.copy(), alg.d2d.copy()
    costs = _clock_costs(alg, plan)
    # the clock reports for one worker 3x its nominal compute time and a radio of 1e5 B/s
    task = plan.tasks[0]
    c, top = task.client, alg.tops[task.group]
    costs[c] = dataclasses.replace(
        costs[c], device_time=3 * costs[c].device_time, extra={**costs[c].extra, "d2d_own": 1e5}
    )
    samples = {t.client: ctx.round_samples(t.client, t.batch_size, t.steps) for t in plan.tasks}
    times = {k: v.time for k, v in costs.items()}
    zeros = dict.fromkeys(costs, 0.0)
    alg.observe(0, plan, RoundReport(times, costs, dict.fromkeys(costs, 1.0), samples, zeros, 0))
    # the true profiles change after the round: the planner must not see it
    faster = [dataclasses.replace(d, flops=100 * d.flops, d2d=7e7) for d in ctx.population.devices]
    ctx.population = dataclasses.replace(ctx.population, devices=tuple(faster))
    _planned(alg, 1)
    a = alg.options.ema
    assert alg.mu_b[c] == pytest.approx(a * mu_b0[c] + (1 - a) * 3 * mu_b0[c], rel=1e-9)
    assert alg.d2d[c] == pytest.approx(a * d2d0[c] + (1 - a) * 1e5, rel=1e-12)
    assert alg.mu_b[top] == pytest.approx(mu_b0[top], rel=1e-9)  # measured via its members
    assert alg.mu_p[c] == pytest.approx(alg.mu_b[c] * alg.compute_ratio(), rel=1e-12)
    others = [w for w in range(ctx.num_clients) if w != c]
    assert np.allclose(alg.d2d[others], d2d0[others], rtol=1e-12)


def test_top_worker_compute_energy_counted(tmp_path):
    cfg = tiny_config(algorithm="parallelsfl", rounds=1, **EXACT)
    row = splitfl.run(cfg, run_dir=tmp_path / "e").metrics[0]
    prep = prepare(as_config(cfg))
    alg, pop = prep.algorithm, prep.ctx.population
    plan = _planned(alg)
    costs = _clock_costs(alg, plan)
    bottoms = sum(c.device_time * pop.at(k, 0).power for k, c in costs.items())
    tops = sum(
        costs[t.client].extra["top_compute"] * pop.at(alg.tops[t.group], 0).power
        for t in plan.tasks
    )
    assert tops > 0
    assert row["energy_j"] == pytest.approx(bottoms + tops, rel=1e-9)

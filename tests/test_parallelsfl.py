"""ParallelSFL integration: roles, Eq. (4)+(18) aggregation, clustered traffic accounting."""

import torch

import splitfl
from conftest import tiny_config
from splitfl.algorithms.base import ClientTask, ClientUpdate, RoundPlan, RoundResult
from splitfl.engine.runner import as_config, prepare

FAST = {"options.parallelsfl.tau": 3, "devices.preset": "jetson80", "data.num_clients": 20}


def test_top_workers_contribute_no_training_data(tmp_path):
    res = splitfl.run(
        tiny_config(algorithm="parallelsfl", rounds=2, **FAST), run_dir=tmp_path / "p"
    )
    for row in res.metrics:
        assert row["plan_tops"], "at least one cluster"
        assert not set(row["plan_tops"]) & set(row["clients"])  # tops never train
        assert row["bytes_d2d_activations"] > 0 and row["bytes_activations_up"] == 0
        # every group's members share one tau (Eq. 17 per cluster)
        steps_by_group = {}
        for g, t in zip(row["groups"], row["client_times"], strict=True):
            steps_by_group.setdefault(g, []).append(t)
        assert len(steps_by_group) == len(row["plan_taus"])


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

"""MergeSFL's baselines (AdaSFL, PyramidFL, LocFedMix-SL) and the jetson80 device preset."""

import math

import numpy as np
import pytest
import torch

import splitfl
from conftest import tiny_config
from splitfl.algorithms import ALGORITHMS
from splitfl.algorithms.adasfl import local_frequencies
from splitfl.algorithms.pyramidfl import dropout_ratios, normalise_stats, oort_utility
from splitfl.cli.main import main
from splitfl.core.plan import ClientTask, ClientUpdate, RoundPlan, RoundReport, RoundResult
from splitfl.experiment.runner import as_config, prepare
from splitfl.metrics.report import _cell_id, _label
from splitfl.metrics.summary import comparison_table
from splitfl.models.base import BlockModel, lowest_loss_state
from splitfl.roles.sides import Smashed, mix_pairs
from splitfl.system.cost import ClientCost, Traffic
from splitfl.system.devices import draw_population
from splitfl.system.jetson import MBPS, MODE_PERIOD, MODES
from splitfl.topologies.split import split_task_cost


def test_adasfl_local_frequencies_fill_the_fastest_workers_round():
    # per-sample times 1, 2, 64 (s); batches after Eq. 9 with D=32: 32, 16, 1
    mu, beta = np.array([0.5, 1.0, 32.0]), np.array([0.5, 1.0, 32.0])
    batch = np.array([32, 16, 1])
    taus = local_frequencies(batch, mu, beta, tau=10, tau_min=1, tau_max=40)
    # round = 10 * 32 * 1 = 320 s; worker 2 needs 64 s per iteration -> 5 iterations
    assert taus.tolist() == [10, 10, 5]


def test_oort_utility_by_hand():
    # stat 2.0, last selected in round 1, now round 10: bonus sqrt(0.1 ln 10 / 1)
    bonus = math.sqrt(0.1 * math.log(10))
    assert oort_utility(2.0, 1, 10, time=5.0, preferred=10.0, alpha=2) == pytest.approx(2 + bonus)
    assert oort_utility(2.0, 1, 10, time=20.0, preferred=10.0, alpha=2) == pytest.approx(
        (2 + bonus) * 0.25
    )


def test_oort_normalisation_by_hand():
    # clip at sorted[int(4 * 0.5)] = 3; low = 0.999 · 1; span from the unclipped max (as
    # oort.py get_norm): 100 - 0.999 = 99.001
    got = normalise_stats({0: 1.0, 1: 2.0, 2: 3.0, 3: 100.0}, clip_bound=0.5)
    span = 99.001
    assert got == pytest.approx(
        {0: 0.001 / span, 1: 1.001 / span, 2: 2.001 / span, 3: 2.001 / span}
    )


def test_staleness_bonus_matters_after_normalisation():
    # raw utilities |D_i|·L_i of order 10^2: client 1 (higher utility) was selected in round 9,
    # client 0 in round 1. Raw: the bonus gap (~0.33) cannot beat the utility gap of 20;
    # normalised: it does (the scaled exploration term of Oort/PyramidFL).
    raw = {0: 480.0, 1: 500.0, 2: 100.0}
    last = {0: 1, 1: 9, 2: 9}

    def best(stats):
        score = {c: oort_utility(stats[c], last[c], 10, 1.0, 1.0, 2) for c in stats}
        return max(score, key=score.get)

    assert best(raw) == 1
    assert best(normalise_stats(raw, clip_bound=0.98)) == 0


def test_pyramidfl_dropout_ratios_by_rank():
    # utilities 5, None (never measured), 9, 1 -> ranks 1, 3, 0, 2; K = 4, (0.6 - 0.1)/4 = 0.125
    got = dropout_ratios([5.0, None, 9.0, 1.0], low=0.1, high=0.6)
    assert got == pytest.approx([0.225, 0.475, 0.1, 0.35])


def test_pyramidfl_full_dropout_uploads_buffers_only_and_keeps_parameters(tmp_path):
    cfg = tiny_config(
        algorithm="pyramidfl",
        rounds=1,
        **{"options.pyramidfl.dropout_low": 1.0, "options.pyramidfl.dropout_high": 1.0},
    )
    res = splitfl.run(cfg, run_dir=tmp_path / "p")
    (row,) = res.metrics
    model = prepare(as_config(cfg)).ctx.model
    start = model.state_dict()
    params = {k for k, _ in model.named_parameters()}
    buffers = sum(v.numel() for k, v in start.items() if k not in params)
    assert row["bytes_model_up"] == len(row["clients"]) * buffers * 4
    final = torch.load(res.run_dir / "model.pt", weights_only=True)
    assert all(torch.equal(final[k], start[k]) for k in params)  # nobody uploaded them
    assert any(not torch.equal(final[k], start[k]) for k in start if k.endswith("running_mean"))


def test_pyramidfl_model_transfers_do_not_scale_with_steps():
    # Round 0, 4 steps each: client 0 transfers 10 s + computes 2 s; client 1 transfers 1 s +
    # computes 4 s, jitter 2 -> 2 s + 8 s. Per round m = (10, 2), per step c = (0.5, 2).
    cfg = tiny_config(algorithm="pyramidfl", **{"train.local_steps": 8})
    algo = prepare(as_config(cfg)).algorithm
    plan = RoundPlan([ClientTask(0, 4, steps=4), ClientTask(1, 4, steps=4)])

    def cost(comm: float, compute: float) -> ClientCost:
        return ClientCost(Traffic(), 0.0, 0.0, comm, compute, 0.0)

    costs, jitter = {0: cost(10.0, 2.0), 1: cost(1.0, 4.0)}, {0: 1.0, 1: 2.0}
    times = {c: costs[c].time * jitter[c] for c in costs}
    algo.observe(0, plan, RoundReport(times, costs, jitter, {0: 1, 1: 1}, {0: 1, 1: 1}, 10.0))
    # t_i = m_i + c_i · steps: 10 + 0.5·8 and 2 + 2·8 (not 12/4·8 = 24 and 10/4·8 = 20)
    assert algo.expected_time(0, 8, 1) == pytest.approx(14.0)
    assert algo.expected_time(1, 8, 1) == pytest.approx(18.0)
    # T_h = median(14, 18) = 16: steps (16 − 10)/0.5 = 12 and (16 − 2)/2 = 7
    assert algo.plan_round(1, [0, 1], np.random.default_rng(0)).info["local_steps"] == [12, 7]


def test_pyramidfl_dropped_tensor_is_averaged_over_uploaders(tmp_path):
    algo = prepare(as_config(tiny_config(algorithm="pyramidfl"))).algorithm
    glob = {k: torch.zeros_like(v) for k, v in algo.ctx.model.state_dict().items()}
    key = next(iter(algo.param_bytes))
    n = algo.ctx.num_blocks
    states = [{k: torch.full_like(v, float(c + 1)) for k, v in glob.items()} for c in range(3)]
    updates = [ClientUpdate(c, n, 0, 1, 1, states[c], 0.0) for c in range(3)]
    algo.dropped = {0: {key}, 1: set(), 2: set()}
    new = algo.aggregate(glob, RoundPlan([]), RoundResult(updates, {}))
    d = algo.ctx.data_sizes[:3].astype(float)
    assert torch.allclose(
        new[key], torch.full_like(glob[key], (2 * d[1] + 3 * d[2]) / (d[1] + d[2]))
    )
    other = [k for k in algo.param_bytes if k != key][0]
    everyone = (d[0] + 2 * d[1] + 3 * d[2]) / d.sum()
    assert torch.allclose(new[other], torch.full_like(glob[other], everyone))


def _member(cut: int, label: int, rows: int, value: float) -> Smashed:
    return Smashed(label, cut, torch.full((rows, 2), value), torch.full((rows,), label))


def test_mixup_pairs_are_convex_combinations_of_equal_cut_members():
    # Prepare: 4 members at one cut point; member k has k+3 rows of value k+1 and label k
    sent = [_member(2, k, k + 3, float(k + 1)) for k in range(4)]
    # Execute
    pairs = list(mix_pairs(sent, np.random.default_rng(0), alpha=1.0))
    # Assert: a random perfect matching (2 pairs), each member mixed once
    assert len(pairs) == 2
    members = sorted(int(y[0]) for _, _, y1, y2, _ in pairs for y in (y1, y2))
    assert members == [0, 1, 2, 3]
    for mixed, cut, y1, y2, lam in pairs:
        a, b = int(y1[0]), int(y2[0])
        m = min(a, b) + 3  # rows of the shorter member
        assert cut == 2 and 0 <= lam <= 1
        assert mixed.shape == (m, 2) and len(y1) == len(y2) == m
        expected = lam * (a + 1) + (1 - lam) * (b + 1)
        assert torch.allclose(mixed, torch.full((m, 2), expected))


def test_mixup_never_pairs_members_with_different_cut_points():
    # labels 0, 1 at cut 2; labels 2, 3 at cut 3
    sent = [_member(2, 0, 3, 1.0), _member(2, 1, 3, 2.0)]
    sent += [_member(3, 2, 3, 3.0), _member(3, 3, 3, 4.0)]
    found = 0
    for seed in range(10):
        for _, cut, y1, y2, _ in mix_pairs(sent, np.random.default_rng(seed), alpha=1.0):
            found += 1
            assert {int(y1[0]), int(y2[0])} == ({0, 1} if cut == 2 else {2, 3})
    assert found > 0  # some seeds pair equal-cut members


def test_locfedmix_aggregates_every_k_rounds_and_sends_no_gradients(tmp_path):
    cfg = tiny_config(
        algorithm="locfedmix_sl",
        rounds=2,
        **{"options.locfedmix_sl.tau": 2, "options.locfedmix_sl.aggregate_every": 2},
    )
    res = splitfl.run(cfg, run_dir=tmp_path / "l")
    first, second = res.metrics
    assert first["bytes_gradients_down"] == 0 and second["bytes_gradients_down"] == 0
    assert first["bytes_model_up"] == 0 and second["bytes_model_up"] > 0
    assert first["plan_aggregated"] is False and second["plan_aggregated"] is True
    init = torch.load(res.run_dir / "checkpoints" / "last.pt", weights_only=False)
    assert init["algorithm"]["local"] == {}  # cleared by the aggregation


def test_locfedmix_keeps_global_device_part_between_aggregations(tmp_path):
    cfg = tiny_config(
        algorithm="locfedmix_sl",
        rounds=1,
        **{"options.locfedmix_sl.tau": 2, "options.locfedmix_sl.aggregate_every": 3},
    )
    res = splitfl.run(cfg, run_dir=tmp_path / "l")

    prep = prepare(as_config(cfg))
    start = prep.ctx.model.state_dict()
    final = torch.load(res.run_dir / "model.pt", weights_only=True)
    cut = prep.ctx.cut_points[-1]
    device_keys = [k for k in start if int(k.split(".")[1]) < cut]
    server_keys = [k for k in start if int(k.split(".")[1]) >= cut and k.endswith("weight")]
    assert all(torch.equal(start[k], final[k]) for k in device_keys)
    assert any(not torch.equal(start[k], final[k]) for k in server_keys)


@pytest.mark.parametrize("client, estimated", [(0, 100), (2, 71)])  # |D_0| = 143, |D_2| = 71
def test_ifca_charges_k_downloads_and_k_forwards_on_the_device(client, estimated):
    # IFCA Alg. 1: the server sends all K = 3 models; the client evaluates each on
    # min(|D_i|, estimate_samples = 100) of its samples (a forward pass: 1/3 of fwd+bwd FLOPs)
    options = {"options.ifca.num_clusters": 3, "options.ifca.estimate_samples": 100}
    cfg = tiny_config(algorithm="ifca", **options, **{"devices.exchange_latency_s": 0.01})
    prep = prepare(as_config(cfg))
    algo, ctx = prep.algorithm, prep.ctx
    assert int(ctx.data_sizes[client]) == {0: 143, 2: 71}[client]
    task = ClientTask(client, ctx.num_blocks, batch_size=16, steps=2)
    plan = RoundPlan([task])
    base = ctx.task_cost(task, 32, 0, plan.device_loss)
    task.charge = algo.identity_charge(client)  # what plan_round attaches
    cost = split_task_cost(ctx, task, 32, 0, plan)
    device, prof = ctx.population.at(client, 0), ctx.profile
    forwards = 3 * estimated * prof.total_flops / 3
    assert cost.device_flops - base.device_flops == pytest.approx(forwards)
    assert cost.device_time - base.device_time == pytest.approx(forwards / device.flops)
    assert cost.traffic.model_down == 3 * prof.total_bytes
    downloads = 2 * prof.total_bytes / device.downlink + 2 * 0.01
    assert cost.comm_time - base.comm_time == pytest.approx(downloads)


def test_lowest_loss_state_by_hand():
    # logits = W x: W = I scores the labels, W = −I scores against them
    model = BlockModel([torch.nn.Linear(2, 2, bias=False), torch.nn.Identity()], cut_points=(1,))
    x, y = torch.eye(2), torch.tensor([0, 1])
    good = {"blocks.0.weight": torch.eye(2)}
    bad = {"blocks.0.weight": -torch.eye(2)}
    before = model.blocks[0].weight.clone()
    assert lowest_loss_state(model, [bad, good, bad], x, y) == 1
    assert lowest_loss_state(model, [good, good], x, y) == 0  # ties: the lowest index
    assert torch.equal(model.blocks[0].weight, before)


def test_ifca_identity_uses_only_the_clients_own_samples():
    prep = prepare(as_config(tiny_config(algorithm="ifca")))
    algo, ctx = prep.algorithm, prep.ctx
    x, y = algo.client_samples(3, np.random.default_rng(0))
    own = ctx.bundle.train.x[torch.as_tensor(ctx.client_indices[3])]
    assert len(x) == len(y) == min(int(ctx.data_sizes[3]), algo.options.estimate_samples)
    assert all(any(torch.equal(row, o) for o in own) for row in x)
    want = lowest_loss_state(ctx.model, algo.models, x, y)
    assert algo.estimate_cluster(3, np.random.default_rng(0)) == want


def test_jetson80_population():
    pop = draw_population("jetson80", 80, np.random.default_rng(0))
    kinds = [pop.at(c, 0).kind.split("-")[0] for c in range(80)]
    assert (kinds.count("TX2"), kinds.count("NX"), kinds.count("AGX")) == (30, 40, 10)
    # modes hold within a 20-round period and are redrawn across periods
    same = all(pop.at(c, 0).flops == pop.at(c, MODE_PERIOD - 1).flops for c in range(80))
    changed = sum(pop.at(c, 0).flops != pop.at(c, MODE_PERIOD).flops for c in range(80))
    assert same and changed > 20
    # bandwidth fluctuates per round within 1-30 Mb/s; 100x spread of compute
    rates = [pop.at(c, r).uplink / MBPS for c in range(80) for r in range(5)]
    assert 1 <= min(rates) and max(rates) <= 30
    assert pop.at(3, 0).uplink != pop.at(3, 1).uplink
    assert max(MODES["AGX"]) / min(MODES["TX2"]) == pytest.approx(100)


def test_jetson80_runs_end_to_end_with_time_varying_clock(tmp_path):
    res = splitfl.run(
        tiny_config(algorithm="fedavg", rounds=2, **{"devices.preset": "jetson80"}),
        run_dir=tmp_path / "j",
    )
    assert res.metrics[1]["sim_time"] > res.metrics[0]["sim_time"] > 0


def test_splitfl_list_marks_proxy_baselines_with_a_reason(capsys):
    assert main(["list"]) == 0
    lines = {ln.split()[0]: ln for ln in capsys.readouterr().out.splitlines() if ln.strip()}
    for name in ("adasfl", "locfedmix_sl", "adasampling", "ifca"):
        assert "[proxy: " in lines[name] and "follow" in lines[name]
    for name in ("pyramidfl", "mergesfl", "parallelsfl", "ringsfl", "s2fl", "fedavg"):
        assert "proxy" not in lines[name]


def test_comparison_and_report_tables_mark_proxies():
    summary = {
        "target_accuracy": 0.5,
        "final_acc": 0.9,
        "best_acc": 0.9,
        "to_target": {"sim_time": 1.0, "traffic_bytes": 1.0},
        "sim_time": 2.0,
        "avg_waiting": 0.1,
        "status": "ok",
    }
    table = comparison_table({"ifca": summary, "parallelsfl": summary})
    assert "| ifca (proxy) |" in table and "| parallelsfl |" in table
    assert _cell_id("algorithm", "adasfl") == "adasfl (proxy)"
    assert _cell_id("data.p", "adasfl") == "adasfl"
    assert _label({"algorithm": "locfedmix_sl", "data.p": 10}, "") == "locfedmix_sl (proxy), p=10"


def test_listed_baselines_are_those_the_papers_compare_against():
    """MergeSFL §V compares PyramidFL, LocFedMix-SL and FedAvg; ParallelSFL §5 AdaSFL,
    AdaSampling, LocFedMix-SL and IFCA (issue 32 item 8: the listing called AdaSFL a MergeSFL
    baseline and FedAvg a ParallelSFL one)."""
    assert "ParallelSFL" in ALGORITHMS["adasfl"].paper
    assert "baseline in MergeSFL" not in ALGORITHMS["adasfl"].paper
    assert "MergeSFL/ParallelSFL" not in ALGORITHMS["adasfl"].paper
    assert "ParallelSFL" not in ALGORITHMS["fedavg"].paper
    assert "MergeSFL" in ALGORITHMS["fedavg"].paper


def test_ifca_aggregates_a_round_that_lost_a_client():
    """A networked round that dropped a client hands ``aggregate`` the plan restricted to the
    clients that completed (``round_step``); IFCA's cluster choice is keyed by client, so the
    others' models are averaged into their clusters (the choice used to be a list aligned with
    the full plan's tasks: a length mismatch)."""
    import dataclasses

    from splitfl.core.plan import RoundResult

    prep = prepare(as_config(tiny_config(algorithm="ifca", **{"options.ifca.num_clusters": 2})))
    algo, ctx = prep.algorithm, prep.ctx
    rng = np.random.default_rng(0)
    plan = algo.plan_round(0, algo.select_clients(0, rng), rng)
    state = ctx.model.state_dict()
    done = dataclasses.replace(plan, tasks=plan.tasks[1:])
    moved = {k: v + 1.0 if v.is_floating_point() else v for k, v in state.items()}
    updates = [ClientUpdate(t.client, t.cut, t.group, 16, 1, moved, 0.0) for t in done.tasks]
    out = algo.aggregate(state, done, RoundResult(updates, {}))
    assert set(out) == set(state)
    assert sum(algo.chosen_count) == len(done.tasks)

"""RingSFL: propagation lengths, ring composition, FedAvg equivalence (Eq. 6), v1 vs v2 (Eq. 7
rates on every executor); its baselines vanilla SL and SplitFed as the authors ran it."""

import copy

import numpy as np
import pytest
import torch
from torch import nn

import splitfl
from conftest import tiny_config
from splitfl.algorithms.ringsfl import largest_remainder, parse_ratios, propagation_lengths
from splitfl.algorithms.vanilla_sl import shared_steps
from splitfl.core.plan import RING_MEMBER_FAILED
from splitfl.core.seeding import derive_seed
from splitfl.core.topology import RingSpec
from splitfl.executors import SequentialExecutor
from splitfl.executors.vectorized import VectorizedExecutor
from splitfl.experiment.runner import as_config, prepare
from splitfl.models import ModelPart, block_index, build_model
from splitfl.models.base import BlockModel
from splitfl.roles.common import client_batches
from splitfl.testing import config_for
from splitfl.topologies.ring.member import block_rates, ring_batch_update, ring_update

RING = {
    "model": "mlp",
    "data.num_clients": 4,
    "train.clients_per_round": 4,
    "devices.preset": "ringsfl_testbed",
    "train.local_steps": 1,
}


def test_propagation_lengths_by_hand():
    # Eq. 3 with C = 4:2:1:1 over 16 blocks -> 8, 4, 2, 2 exactly
    assert propagation_lengths([4, 2, 1, 1], 16) == [8, 4, 2, 2]
    # shares 0.5, 0.3, 0.2 of 10 blocks with remainders: 5, 3, 2
    assert largest_remainder([5, 3, 2], 10) == [5, 3, 2]
    # every client gets >= 1 block even when its share rounds to 0; the sum stays W
    lengths = propagation_lengths([100, 1, 1, 1, 1], 10)
    assert lengths == [6, 1, 1, 1, 1] and sum(lengths) == 10
    assert parse_ratios("6:1:1:1:1", 5, 10) == [6, 1, 1, 1, 1]
    assert parse_ratios("13:1:1:1:1", 5, 17) == [13, 1, 1, 1, 1]
    with pytest.raises(ValueError):
        propagation_lengths([1, 1, 1], 2)


def test_segments_and_overlap_counts():
    order, lengths = [0, 1, 2], {0: 1, 1: 2, 2: 1}
    ring = RingSpec(order, lengths, {})
    assert ring.segments(1) == [(1, 0, 2), (2, 2, 3), (0, 3, 4)]
    counts = ring.overlap_counts(4)
    assert [sum(v) for v in counts.values()] == [3 * lengths[c] for c in order]
    # u_1 runs blocks 1-2 for u_0's batch, 0-1 for its own, 2-3 for u_2's
    assert counts[1] == [1, 2, 2, 1]


def test_ring_forward_composes_to_the_full_model():
    torch.manual_seed(0)
    model = build_model("mlp", (1, 8, 8), 10).eval()
    x = torch.randn(5, 1, 8, 8)
    order, lengths = [0, 1, 2], {0: 2, 1: 1, 2: 1}
    for start in order:
        h = x
        for _client, lo, hi in RingSpec(order, lengths, {}).segments(start):
            h = model(h, lo, hi)
        assert torch.equal(h, model(x))


def test_one_ringsfl_round_equals_a_fedavg_update(tmp_path):
    """§3.4, Eq. (6): with the learning rate × N, one round (one step) is FedAvg's update."""
    ring = splitfl.run(tiny_config(algorithm="ringsfl", rounds=1, **RING), run_dir=tmp_path / "r")
    fed = splitfl.run(tiny_config(algorithm="fedavg", rounds=1, **RING), run_dir=tmp_path / "f")
    a = torch.load(ring.run_dir / "model.pt", weights_only=True)
    b = torch.load(fed.run_dir / "model.pt", weights_only=True)
    for k in a:
        assert torch.allclose(a[k], b[k], atol=1e-6), k


def test_v1_and_v2_differ_only_on_overlapping_blocks():
    torch.manual_seed(1)
    model = build_model("mlp", (1, 8, 8), 10)
    order, lengths = [0, 1, 2], {0: 2, 1: 1, 2: 1}
    batches = {c: (torch.randn(4, 1, 8, 8), torch.randint(0, 10, (4,))) for c in order}
    weights = {c: 1 / 3 for c in order}
    v1 = {c: copy.deepcopy(model) for c in order}
    v2 = {c: copy.deepcopy(model) for c in order}
    ring_batch_update(v1, order, lengths, batches, weights, 0.1, dynamic_lr=False)
    ring_batch_update(v2, order, lengths, batches, weights, 0.1, dynamic_lr=True)
    counts = RingSpec(order, lengths, weights).overlap_counts(4)
    for c in order:
        for k in range(4):
            p1 = [p for p in v1[c].blocks[k].parameters()]
            p2 = [p for p in v2[c].blocks[k].parameters()]
            same = all(torch.allclose(a, b) for a, b in zip(p1, p2, strict=True))
            assert same == (counts[c][k] <= 1), (c, k, counts[c][k])


def test_block_rates_are_eq7_by_hand():
    # ring 0 -> 1, lengths 2:1 over 3 blocks: u_0 runs blocks 0-1 of its own batch and 1-2 of
    # u_1's, so |U_0| = [1, 2, 1]; u_1 runs block 2 of u_0's batch and block 0 of its own
    counts = RingSpec([0, 1], {0: 2, 1: 1}, {}).overlap_counts(3)
    assert counts == {0: [1, 2, 1], 1: [1, 0, 1]}
    assert block_rates(counts[0], 0.25, dynamic_lr=True) == [0.25, 0.5, 0.25]
    assert block_rates(counts[1], 0.25, dynamic_lr=True) == [0.25, 0.0, 0.25]
    assert block_rates(counts[0], 0.25, dynamic_lr=False) == [0.25, 0.25, 0.25]
    assert block_rates(counts[1], 0.25, dynamic_lr=False) == [0.25, 0.0, 0.25]


@pytest.mark.parametrize("executor", ["sequential", "vectorized-rows", "vectorized-vmap"])
def test_v2_moves_each_block_overlap_count_times_as_far_as_v1(executor):
    """Eq. (7) in every executor's ring: from the same model and batches, one step of v2
    moves block k of u_j's model |U_j,(k)| times as far as v1 (same gradients, rate × count).
    Lengths 2:1:1 over the MLP's 4 blocks: u_0 runs blocks 0-1 of its own batch, 2-3 of
    u_1's and 1-2 of u_2's (counts 1, 2, 2, 1); u_1 runs blocks 0, 2, 3 and u_2 0, 1, 3 of
    one batch each (count 0 on the block no batch crosses)."""
    changes = {**RING, "data.num_clients": 3, "train.clients_per_round": 3}
    changes["options.ringsfl.prop_lens"] = "2:1:1"
    moved = {}
    for version in ("ringsfl", "ringsfl-v2"):
        prep = prepare(as_config(tiny_config(algorithm=version, **changes)), dtype=torch.float64)
        ctx, alg = prep.ctx, prep.algorithm
        rng = np.random.default_rng(0)
        plan = alg.plan_round(0, alg.select_clients(0, rng), rng)
        state = ctx.model.state_dict()
        run = (
            SequentialExecutor()
            if executor == "sequential"
            else VectorizedExecutor(use_vmap=executor.endswith("vmap"))
        )
        result = run.run_round(ctx, state, plan, round_seed=5)
        moved[version] = {
            u.client: {k: state[k] - v for k, v in u.state.items()} for u in result.updates
        }
    counts = {0: [1, 2, 2, 1], 1: [1, 0, 1, 1], 2: [1, 1, 0, 1]}
    assert plan.topology.spec.overlap_counts(4) == counts
    for c, per_block in counts.items():
        for k, delta in moved["ringsfl"][c].items():
            count = per_block[block_index(k)]
            assert (delta.abs().max() > 0) == (count > 0), (c, k)
            assert torch.allclose(moved["ringsfl-v2"][c][k], count * delta, rtol=1e-9, atol=1e-14)


def test_vanilla_sl_round_time_is_the_sum(tmp_path):
    res = splitfl.run(tiny_config(algorithm="vanilla_sl", rounds=1), run_dir=tmp_path / "v")
    row = res.metrics[0]
    assert row["round_time"] == pytest.approx(sum(row["client_times"]))


def test_ring_cost_counts_hops_and_energy(tmp_path):
    res = splitfl.run(tiny_config(algorithm="ringsfl", rounds=1, **RING), run_dir=tmp_path / "r")
    row = res.metrics[0]
    assert row["bytes_d2d_activations"] > 0 and row["bytes_d2d_gradients"] > 0
    assert row["bytes_activations_up"] == 0 and row["energy_j"] > 0


def test_shared_round_steps_split_e_b_updates_over_the_chain():
    assert shared_steps(7, [4, 0, 2, 1, 3]) == {4: 2, 0: 2, 2: 1, 1: 1, 3: 1}
    assert shared_steps(40, [0, 1, 2, 3, 4]) == dict.fromkeys(range(5), 8)
    assert shared_steps(3, [0, 1, 2, 3, 4]) == dict.fromkeys(range(5), 1)  # >= 1 each


@pytest.mark.parametrize("round_steps, updates", [("per_client", 5 * 7), ("shared", 7)])
def test_vanilla_sl_round_size(tmp_path, round_steps, updates):
    # Prepare: 5 IID clients (full batches of 16), 7 local steps each
    cfg = tiny_config(
        algorithm="vanilla_sl",
        rounds=1,
        **{
            "data.partition": "iid",
            "data.num_clients": 5,
            "train.clients_per_round": 5,
            "train.local_steps": 7,
            "options.vanilla_sl.round_steps": round_steps,
        },
    )
    # Execute
    (row,) = splitfl.run(cfg, run_dir=tmp_path / "v").metrics
    # Assert: RingSFL §4.1.3 round = E·B updates across the chain, not N·E·B
    assert sum(row["plan_local_steps"]) == updates

    ctx = prepare(as_config(cfg)).ctx
    q = ctx.profile.activation_bytes(ctx.cut_points[-1])
    assert row["bytes_activations_up"] == updates * 16 * q  # samples actually processed


def test_vanilla_sl_rejects_unknown_round_steps():
    with pytest.raises(splitfl.ConfigError, match="round_steps"):
        splitfl.validate(
            tiny_config(algorithm="vanilla_sl", **{"options.vanilla_sl.round_steps": "ring"})
        )


@pytest.mark.parametrize("field", ["momentum", "weight_decay"])
def test_ringsfl_rejects_momentum_and_weight_decay(field):
    with pytest.raises(splitfl.ConfigError, match=f"train.{field}.*plain SGD"):
        splitfl.validate(config_for("ringsfl", **{f"train.{field}": 0.5}))


def _split_round(algorithm: str, **changes):
    """One float64 round of ``algorithm`` (MLP, batch 64, 2 steps) for the two smallest and
    the largest client; (prepared, plan, result, aggregated model)."""
    cfg = tiny_config(
        algorithm=algorithm, **{"model": "mlp", "train.batch_size": 64, "train.local_steps": 2}
    )
    prep = prepare(as_config({**cfg, **changes}), dtype=torch.float64)
    by_size = np.argsort(prep.ctx.data_sizes, kind="stable")
    clients = sorted(int(c) for c in by_size[[0, 1, -1]])
    plan = prep.algorithm.plan_round(0, clients, np.random.default_rng(0))
    state = prep.ctx.model.state_dict()
    result = SequentialExecutor().run_round(prep.ctx, state, plan, round_seed=7)
    return prep, plan, result, prep.algorithm.aggregate(state, plan, result)


def _hand_splitfed_ringsfl(ctx, tasks, cut: int, round_seed: int):
    """RingSFL's SplitFed by hand: each iteration, every client's mean loss through its
    device part and the shared server part; the server steps on (1/N) Σ_i ∇ loss_i, each
    device part on ∇ of its own loss (all gradients at the iteration's starting weights)."""
    model, lr = ctx.model, tasks[0].lr
    devices = {t.client: copy.deepcopy(ModelPart(model, 0, cut)) for t in tasks}
    server = copy.deepcopy(ModelPart(model, cut, model.num_blocks))
    x, y = ctx.bundle.train.x, ctx.bundle.train.y
    batches = {
        t.client: client_batches(
            ctx.client_indices[t.client], t.batch_size, t.steps, derive_seed(round_seed, t.client)
        )
        for t in tasks
    }
    params = list(server.parameters())
    for step in range(tasks[0].steps):
        own, shared = {}, []
        for c, part in devices.items():
            idx = batches[c][step]
            loss = torch.nn.functional.cross_entropy(server(part(x[idx])), y[idx])
            own[c] = torch.autograd.grad(loss, list(part.parameters()), retain_graph=True)
            shared.append(torch.autograd.grad(loss, params))
        with torch.no_grad():
            for c, part in devices.items():
                for p, g in zip(part.parameters(), own[c], strict=True):
                    p -= lr * g
            for k, p in enumerate(params):
                p -= lr * sum(g[k] for g in shared) / len(devices)
    sizes = [[len(batches[t.client][s]) for t in tasks] for s in range(tasks[0].steps)]
    return devices, server, sizes


def test_splitfed_ringsfl_steps_the_shared_server_on_the_mean_of_client_gradients():
    prep, plan, result, _ = _split_round("splitfed_ringsfl")
    assert {t.group for t in plan.tasks} == {0}  # one server model
    devices, server, sizes = _hand_splitfed_ringsfl(prep.ctx, plan.tasks, 2, round_seed=7)
    assert sizes == [[64, 56, 64], [64, 56, 5]]  # unequal: the 1/N mean ≠ the per-sample mean
    for k, v in server.state_dict().items():
        assert torch.allclose(result.server_states[0][k], v, rtol=0, atol=1e-12), k
    assert result.updates  # the loop below runs
    for u in result.updates:
        for k, v in devices[u.client].state_dict().items():
            assert torch.allclose(u.state[k], v, rtol=0, atol=1e-12), (u.client, k)


def test_splitfed_ringsfl_is_not_splitfed_v1_which_is_fedavg():
    *_, ringsfl = _split_round("splitfed_ringsfl")
    *_, v1 = _split_round("splitfed_v1", options={"splitfed_v1": {"cut": 2}})
    *_, fedavg = _split_round("fedavg")
    diff = {k: (ringsfl[k] - v1[k]).abs().max().item() for k in v1}
    assert max(abs(v1[k] - fedavg[k]).max().item() for k in v1) < 1e-12  # V1 ≡ FedAvg
    assert max(diff.values()) > 1e-4


def test_v2_dynamic_rate_is_lr_times_overlap_when_three_or_more_batches_overlap():
    """Eq. (7) by hand where |U| reaches 5 (8:1:1:1:1 over 12 blocks; issue 32 item 7: with
    rings of |U| <= 2 the mutation lr·min(|U|, 2) survived). Client 0 runs blocks 0-7 of its
    own batch, 4-11 of client 1's, 3-10 of 2's, 2-9 of 3's and 1-8 of 4's."""
    ring = RingSpec(
        [0, 1, 2, 3, 4], {0: 8, 1: 1, 2: 1, 3: 1, 4: 1}, dict.fromkeys(range(5), 0.2), True
    )
    counts = ring.overlap_counts(12)
    assert counts[0] == [1, 2, 3, 4, 5, 5, 5, 5, 4, 3, 2, 1]
    assert counts[1] == [1, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1]
    model = BlockModel([nn.Linear(1, 1, bias=False) for _ in range(12)], [4, 8]).double()
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
            p.grad = torch.ones_like(p)
    ring_update(model, counts[0], lr=0.01, dynamic_lr=True)
    after = [float(b.weight.detach()) for b in model.blocks]
    assert after == pytest.approx([1 - 0.01 * c for c in counts[0]], abs=1e-12)


def test_a_member_that_broke_the_ring_sits_out_and_the_ring_is_re_formed():
    """Issue 35, item 3: the member named as failed (``RING_MEMBER_FAILED``) sits out
    ``exclude_rounds`` × 2^(failures − 1) rounds, and every round its device is not connected
    (``ctx.reachable``); the ring over the others is Eq. (3) over their shares, a_i over their
    data and the rate × their number; with every member it is the full ring."""
    cfg = config_for("ringsfl", **{**RING, "options.ringsfl.prop_lens": "4:2:1:1"})
    prep = prepare(as_config(cfg))
    algo, rng = prep.algorithm, np.random.default_rng(0)
    full = algo.plan_round(0, algo.select_clients(0, rng), rng)
    assert full.topology.spec.order == [0, 1, 2, 3] and full.topology.spec.lengths == algo.lengths
    failed = {1: f"{RING_MEMBER_FAILED}, ring round abandoned: device d1 lost: closed"}
    algo.lost(0, full, {**failed, 0: "ring round abandoned: client 1 failed: ..."})
    assert algo.select_clients(1, rng) == [0, 2, 3]  # 1 round out
    assert algo.select_clients(2, rng) == [0, 1, 2, 3]
    plan = algo.plan_round(1, [0, 2, 3], rng)
    assert plan.topology.spec.order == [0, 2, 3]
    lengths = largest_remainder([4, 1, 1], 4)
    assert plan.topology.spec.lengths == dict(zip([0, 2, 3], lengths, strict=True))
    sizes = prep.ctx.data_sizes[[0, 2, 3]] / prep.ctx.data_sizes[[0, 2, 3]].sum()
    assert plan.topology.spec.weights == pytest.approx(dict(zip([0, 2, 3], sizes, strict=True)))
    assert plan.tasks[0].lr == pytest.approx(3 * full.tasks[0].lr / 4)  # lr × N over 3
    algo.lost(2, full, failed)  # a second failure: 2 rounds out
    assert [algo.select_clients(r, rng) for r in (3, 4, 5)] == [[0, 2, 3]] * 2 + [[0, 1, 2, 3]]
    prep.ctx.reachable = lambda: {0, 1, 3}  # client 2's device is not connected
    assert algo.select_clients(5, rng) == [0, 1, 3]
    prep.ctx.reachable = lambda: {3}  # fewer than two left: everyone (the round will fail)
    assert algo.select_clients(5, rng) == [0, 1, 2, 3]
    restored = prepare(as_config(cfg)).algorithm
    restored.load_state_dict(algo.state_dict())
    assert restored.benched == algo.benched and restored.failures == {1: 2}


def test_the_ring_is_wired_in_client_id_order_unless_options_order_says_otherwise():
    """RingSFL's default wiring (issue 50 item 9: a default with no behavioural test): the
    members are chained in client-id order, and ``options.ringsfl.order`` rewires the ring
    while each client keeps its own segment length (Eq. 3) and weight."""
    from splitfl.experiment.runner import as_config, prepare
    from splitfl.testing import config_for

    def ring(**changes):
        prep = prepare(as_config(config_for("ringsfl", **changes)))
        rng = np.random.default_rng(0)
        clients = prep.algorithm.select_clients(0, rng)
        return prep.algorithm.plan_round(0, clients, rng).topology.spec

    default, rewired = ring(), ring(**{"options.ringsfl.order": "3,1,0,2"})
    assert default.order == [0, 1, 2, 3]
    assert rewired.order == [3, 1, 0, 2]
    assert rewired.lengths == default.lengths and rewired.weights == default.weights

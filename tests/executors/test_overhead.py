"""The per-round fast paths change no result: pooled working copies of model parts (the
sequential executor reuses them across clients and rounds), the Dirichlet partition's
size-first rejection of draws and the derived seeds computed without a numpy array."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from splitfl.core.seeding import _key, derive_seed, rng_for, seed_torch
from splitfl.data.grouping import grouped
from splitfl.data.partition import _top_up, dirichlet
from splitfl.executors.sequential import SequentialExecutor
from splitfl.experiment.runner import as_config, prepare
from splitfl.models import BlockModel
from splitfl.roles.common import client_batches
from splitfl.roles.parts import PartPool, load_state
from splitfl.testing import config_for
from splitfl.training import make_optimizer


def _rounds(executor_for_round, algorithm: str, rounds: int = 3, dtype=torch.float64, **changes):
    """Each round's result from ``executor_for_round(r)``, aggregating as the runner does."""
    cfg = as_config(config_for(algorithm, rounds=rounds, **changes))
    prep = prepare(cfg, dtype=dtype)
    ctx, alg = prep.ctx, prep.algorithm
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    results = []
    for r in range(rounds):
        torch.manual_seed(derive_seed(cfg.seed, "torch", r))
        clients = alg.select_clients(r, rng_for(cfg.seed, "select", r))
        plan = alg.plan_round(r, clients, rng_for(cfg.seed, "plan", r))
        result = executor_for_round(r).run_round(ctx, state, plan, derive_seed(cfg.seed, "b", r))
        results.append(result)
        state = alg.aggregate(state, plan, result)
    return results, state


@pytest.mark.parametrize("algorithm", ["s2fl", "splitfed_v1", "fedavg", "locfedmix_sl"])
def test_one_pooled_executor_equals_a_fresh_executor_every_round(algorithm):
    """Reused part copies hold nothing of the clients and rounds before them, and every
    returned state is the client's own (no two updates share storage with a live copy)."""
    shared = SequentialExecutor()
    pooled, pooled_state = _rounds(lambda r: shared, algorithm)
    fresh, fresh_state = _rounds(lambda r: SequentialExecutor(), algorithm)
    for a, b in zip(pooled, fresh, strict=True):
        assert [u.client for u in a.updates] == [u.client for u in b.updates]
        for ua, ub in zip(a.updates, b.updates, strict=True):
            for k in ub.state:
                assert torch.equal(ua.state[k], ub.state[k]), (ua.client, k)
        assert a.server_states.keys() == b.server_states.keys()
        for g, sb in b.server_states.items():
            assert all(torch.equal(a.server_states[g][k], v) for k, v in sb.items())
    for k, v in fresh_state.items():
        assert torch.equal(pooled_state[k], v), k
    storages = [
        v.untyped_storage().data_ptr() for u in pooled[-1].updates for v in u.state.values()
    ]
    assert len(storages) == len(set(storages))


def _dirichlet_reference(labels, num_clients, rng, alpha, min_samples, cap):
    """The partition as first written: every draw builds the clients' arrays."""
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(1000):
        parts = [[] for _ in range(num_clients)]
        held = np.zeros(num_clients)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(num_clients, float(alpha)))
            if cap:
                p = p * (held < len(labels) / num_clients)
                p = p / p.sum() if p.sum() > 0 else np.full(num_clients, 1.0 / num_clients)
            cuts = (np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for client, chunk in enumerate(np.split(idx, cuts)):
                parts[client].append(chunk)
                held[client] += len(chunk)
        if min(sum(len(c) for c in chunks) for chunks in parts) >= min_samples:
            return [np.concatenate(c) for c in parts]
    values, owner = _top_up([np.concatenate(c) for c in parts], min_samples, rng)
    return grouped(values, owner, num_clients)  # the top-up returns samples and owners


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cap", [False, True])
def test_dirichlet_draws_equal_the_array_building_reference(seed, cap):
    gen = np.random.default_rng(100 + seed)
    labels = gen.integers(0, int(gen.integers(2, 11)), size=int(gen.integers(300, 1500)))
    clients, alpha, min_samples = int(gen.integers(5, 60)), [0.1, 0.5, 5.0][seed % 3], 4
    got = dirichlet(
        labels, clients, np.random.default_rng(seed), alpha=alpha, min_samples=min_samples, cap=cap
    )
    ref = _dirichlet_reference(
        labels, clients, np.random.default_rng(seed), alpha, min_samples, cap
    )
    assert len(got) == len(ref)
    for a, b in zip(got, ref, strict=True):
        np.testing.assert_array_equal(a, np.sort(b))  # the partition returns sorted indices


def _derive_seed_reference(seed, *parts):
    """The derived seed as first written: a uint64 vector times a list (a float64 product)."""
    ss = np.random.SeedSequence([int(seed), *(_key(p) for p in parts)])
    return int(ss.generate_state(2, dtype=np.uint32).astype(np.uint64) @ [1 << 31, 1])


def test_derived_seeds_equal_the_array_reference():
    gen = np.random.default_rng(7)
    for _ in range(3000):
        seed = int(gen.integers(0, 2**63)) if gen.random() < 0.5 else int(gen.integers(0, 100))
        parts = [int(gen.integers(0, 2**40)) for _ in range(int(gen.integers(0, 3)))]
        parts += [0, 2**32, 2**64 + 7, 2**32 - 1][: int(gen.integers(0, 3))]  # 0, 1-3 words
        parts += ["b", "unit", "torch"][: int(gen.integers(0, 2))]
        assert derive_seed(seed, *parts) == _derive_seed_reference(seed, *parts), (seed, parts)


def test_seed_torch_draws_what_torch_manual_seed_draws():
    """The round's torch seed without the accelerators' lazy calls: the same CPU stream (the
    draws and dropout masks a round makes) as ``torch.manual_seed``."""
    for seed in (0, 3, 2**62 + 5):
        torch.manual_seed(seed)
        expected = (torch.rand(6), torch.nn.functional.dropout(torch.ones(8), 0.5))
        torch.manual_seed(seed + 1)  # another state in between
        seed_torch(seed)
        got = (torch.rand(6), torch.nn.functional.dropout(torch.ones(8), 0.5))
        assert all(torch.equal(a, b) for a, b in zip(expected, got, strict=True))


def _plain_fedavg(model: torch.nn.Module, prep, rounds: int) -> dict[str, torch.Tensor]:
    """FedAvg as a lean loop writes it (one working copy reloaded per client, a fresh SGD,
    ``F.cross_entropy``, the |D_i|-weighted average accumulated in float64, integer buffers
    rounded), on splitfl's clients, steps and mini-batches (the plan's tasks,
    :func:`client_batches` from the derived seeds)."""
    cfg, ctx, alg = prep.config, prep.ctx, prep.algorithm
    x, y = ctx.bundle.train.x, ctx.bundle.train.y
    state = {k: v.clone() for k, v in model.state_dict().items()}
    for r in range(rounds):
        clients = alg.select_clients(r, rng_for(cfg.seed, "select", r))
        tasks = alg.plan_round(r, clients, rng_for(cfg.seed, "plan", r)).tasks
        total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
        for t in tasks:
            model.load_state_dict(state)
            model.train()
            opt = make_optimizer(model.parameters(), t.lr, cfg.train)  # a new one per client
            seed = derive_seed(derive_seed(cfg.seed, "b", r), t.client)
            for batch in client_batches(ctx.client_indices[t.client], t.batch_size, t.steps, seed):
                opt.zero_grad()
                torch.nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
                opt.step()
            for k, v in model.state_dict().items():
                total[k] += float(ctx.data_sizes[t.client]) * v.to(torch.float64)
        weight = sum(float(ctx.data_sizes[t.client]) for t in tasks)
        state = {k: _as(total[k] / weight, v.dtype) for k, v in state.items()}
    return state


def _as(mean: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return (mean if dtype.is_floating_point else torch.round(mean)).to(dtype)


@pytest.mark.parametrize(
    "train",
    [
        {},
        {"train.momentum": 0.9, "train.weight_decay": 1e-3, "train.lr_decay": 0.5},
        {"train.optimizer": "adam", "train.lr": 0.01},
    ],
    ids=["sgd", "momentum", "adam"],
)
def test_fedavg_equals_the_lean_loop_bit_for_bit(train):
    """splitfl's FedAvg (pooled parts loaded and read through their ``StateView``, a pooled
    part's optimiser emptied for each client, the mini-batches drawn before training, the
    fused cross-entropy, the layer-wise aggregation) trains exactly what the lean loop of
    ``benchmarks/plain_loop.py`` trains with a new optimiser per client: the same float32
    model, bit for bit (with momentum and Adam too: no state leaks from client to client)."""
    prep = prepare(as_config(config_for("fedavg", rounds=3, **train)))
    shared = SequentialExecutor()  # its pool (parts, optimisers) serves every round
    _, state = _rounds(lambda r: shared, "fedavg", dtype=None, **train)
    plain = _plain_fedavg(copy.deepcopy(prep.ctx.model), prep, 3)
    assert plain and plain.keys() == state.keys()
    for k, v in plain.items():
        assert v.dtype == state[k].dtype and torch.equal(state[k], v), k


class _DoublingLinear(torch.nn.Linear):
    """A module with its own loader (the loaded weight doubled): ``state_dict``/
    ``load_state_dict`` semantics that a copy of the tensors would miss."""

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        with torch.no_grad():
            self.weight.mul_(2)


def test_pooled_parts_load_and_read_states_as_torch_does():
    """A pooled part's :class:`StateView` copies a state in and out as ``load_state_dict`` and
    ``state_dict`` would: the values, every buffer, torch's error for a wrong shape, no
    aliasing of what it hands out; a module with its own loader or a load hook goes through
    torch's functions (its loader doubles the weight, its hook runs)."""
    plain = BlockModel([torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)], [1])
    pool, state = (
        PartPool(),
        {k: torch.randn_like(v.float()).to(v.dtype) for k, v in plain.state_dict().items()},
    )
    part = pool.take(plain, 0, 2, state)
    assert all(torch.equal(part.state_dict()[k], v) for k, v in state.items())
    out = pool.read(part)
    assert all(torch.equal(out[k], v) for k, v in state.items())
    assert all(out[k].data_ptr() != t.data_ptr() for k, t in part.state_dict().items())
    with pytest.raises(RuntimeError, match="size mismatch"):
        pool.take(plain, 0, 2, {**state, "blocks.0.weight": torch.zeros(4, 4)})

    custom = BlockModel([_DoublingLinear(3, 4), torch.nn.ReLU()], [1])
    hooked: list[int] = []
    custom.blocks[1].register_load_state_dict_post_hook(lambda m, keys: hooked.append(1))
    state = {k: torch.ones_like(v) for k, v in custom.state_dict().items()}
    part = pool.take(custom, 0, 2, state)
    assert torch.equal(part.state_dict()["blocks.0.weight"], torch.full((4, 3), 2.0))
    assert hooked == [1]


def test_a_frozen_parameter_equal_to_the_rounds_global_tensor_is_read_as_that_tensor():
    """Issue 48 item 6 (split LoRA at ≤ 1.2× plain peft): a frozen parameter that still
    equals the pool's ``reference`` (the round's global model) is read as the reference's
    tensor, no copy; a trainable one, a buffer, or a frozen one that changed are copies, and
    every value read is what ``state_dict`` holds."""
    model = BlockModel([torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)], [1])
    model.blocks[0].weight.requires_grad_(False)
    state = {k: torch.randn_like(v.float()).to(v.dtype) for k, v in model.state_dict().items()}
    pool = PartPool()
    pool.reference = state
    part = pool.take(model, 0, 2, state)
    out = pool.read(part)
    assert out["blocks.0.weight"] is state["blocks.0.weight"]  # frozen, unchanged
    others = [k for k in state if k != "blocks.0.weight"]
    assert all(out[k] is not state[k] and torch.equal(out[k], state[k]) for k in others)
    with torch.no_grad():
        part.blocks["0"].weight.add_(1.0)  # a frozen parameter the model itself changed
    moved = pool.read(part)
    assert moved["blocks.0.weight"] is not state["blocks.0.weight"]
    assert torch.equal(moved["blocks.0.weight"], state["blocks.0.weight"] + 1)
    pool.reference = None
    assert all(v is not state[k] for k, v in pool.read(part).items())


def test_load_state_follows_a_module_whose_tensors_were_replaced():
    """``load_state`` keeps a view per module; a module whose buffers or parameters were
    replaced since (``.to(dtype)``, an assignment) is loaded into its new tensors, as
    ``load_state_dict`` would."""
    model = BlockModel([torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4)], [1])
    first = {k: torch.full_like(v, 1) for k, v in model.state_dict().items()}
    load_state(model, first)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in first.items())
    model.blocks[1].running_mean = torch.zeros(4)  # a new buffer object
    model.to(torch.float64)  # new parameter data, new buffers
    second = {k: torch.full_like(v, 2) for k, v in model.state_dict().items()}
    load_state(model, second)
    assert all(torch.equal(model.state_dict()[k], v) for k, v in second.items())

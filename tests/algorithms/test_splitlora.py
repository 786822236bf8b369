"""SplitLoRA as the authors' code runs it (FDU-INC/Split_LoRA, gpt2_ft_sfl.py): the clients
take turns, one mini-batch each, against one shared server model; the device parts are then
averaged with equal weights. Checked against a hand-written two-client loop."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

import splitfl
from splitfl.config import ConfigError
from splitfl.core.seeding import derive_seed, rng_for
from splitfl.executors.sequential import SequentialExecutor
from splitfl.experiment.runner import as_config, prepare
from splitfl.models.base import split
from splitfl.roles.common import client_batches
from splitfl.testing import config_for

ROUND_SEED = 11


def _hand_round(ctx, clients: list[int], cut: int, turns: int, lr: float):
    """Two clients in turn, one batch each, one server model (plain SGD)."""
    device_parts = {c: copy.deepcopy(split(ctx.model, cut)[0]) for c in clients}
    server = copy.deepcopy(split(ctx.model, cut)[1])
    x_all, y_all = ctx.bundle.train.x, ctx.bundle.train.y
    b = ctx.config.train.batch_size
    batches = {
        c: client_batches(ctx.client_indices[c], b, turns, derive_seed(ROUND_SEED, c))
        for c in clients
    }
    for step in range(turns):
        for c in clients:
            rows = batches[c][step]
            h = device_parts[c](x_all[rows].float())
            sent = h.detach().requires_grad_(True)
            loss = F.cross_entropy(server(sent), y_all[rows])
            loss.backward()
            with torch.no_grad():
                for p in server.parameters():
                    p -= lr * p.grad
                    p.grad = None
            h.backward(sent.grad)
            with torch.no_grad():
                for p in device_parts[c].parameters():
                    p -= lr * p.grad
                    p.grad = None
    return device_parts, server


def test_splitlora_round_equals_a_hand_written_two_client_loop():
    cfg = config_for(
        "splitlora",
        model="mlp",
        **{
            "options.splitlora.aggregate_step": 6,
            "options.splitlora.cut": 2,
            "train.clients_per_round": 2,
            "train.lr": 0.05,
        },
    )
    prep = prepare(as_config(cfg))
    ctx, alg = prep.ctx, prep.algorithm
    clients = alg.select_clients(0, rng_for(3, "s", 0))
    plan = alg.plan_round(0, clients, rng_for(3, "p", 0))
    assert plan.topology.mode == "round_robin" and [t.steps for t in plan.tasks] == [3, 3]
    assert list(plan.topology.order) == sorted(clients)
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    result = SequentialExecutor().run_round(ctx, state, plan, round_seed=ROUND_SEED)
    devices, server = _hand_round(ctx, list(plan.topology.order), 2, 3, 0.05)
    assert len(result.updates) == 2  # the loop below runs
    for u in result.updates:
        for k, v in devices[u.client].state_dict().items():
            assert torch.allclose(u.state[k], v, atol=1e-6), k
    for k, v in server.state_dict().items():
        assert torch.allclose(result.server_states[0][k], v, atol=1e-6), k
    # turns matter: the first client's second batch met the server the second client updated
    merged = alg.aggregate(state, plan, result)
    for k, v in devices[list(plan.topology.order)[0]].state_dict().items():
        mean = (v + devices[list(plan.topology.order)[1]].state_dict()[k]) / 2
        assert torch.allclose(merged[k], mean, atol=1e-6), k


def test_aggregate_step_is_checked():
    with pytest.raises(ConfigError, match=r"^options.splitlora.aggregate_step: must be >= 1"):
        splitfl.validate(config_for("splitlora", **{"options.splitlora.aggregate_step": 0}))

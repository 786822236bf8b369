"""Feature merging: a group's server step is one forward/backward on the concatenated smashed
data of its members (MergeSFL Eq. 16; S²FL's merged batches), checked against a step built by
hand on a server part with BatchNorm, for both executors."""

import copy

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import splitfl
from conftest import tiny_config
from splitfl.config import ConfigError
from splitfl.core.plan import ClientTask, RoundPlan
from splitfl.core.seeding import derive_seed
from splitfl.core.topology import ServerSpec, Star
from splitfl.executors.sequential import SequentialExecutor
from splitfl.executors.vectorized import VectorizedExecutor
from splitfl.experiment.runner import as_config, prepare
from splitfl.models import ModelPart
from splitfl.roles.common import client_batches

SEED = 5
SERVER_LR = 0.1

#: (client, cut, group, batch size, lr): one group of equal cuts and unequal batches; one group
#: with mixed cuts (two merged batches); two groups whose merged batches have equal lengths
CASES = {
    "one_cut": [(0, 1, 0, 4, 0.1), (1, 1, 0, 12, 0.3)],
    "mixed_cuts": [(0, 1, 0, 4, 0.1), (1, 2, 0, 8, 0.2), (2, 1, 0, 12, 0.3)],
    "two_groups": [(0, 1, 0, 4, 0.1), (1, 1, 0, 12, 0.3), (2, 1, 1, 8, 0.2), (3, 1, 1, 8, 0.1)],
}


def _ctx():
    return prepare(as_config(tiny_config(algorithm="mergesfl"))).ctx


def _plan(case: str, group_forward: str) -> RoundPlan:
    tasks = [ClientTask(c, cut, g, d, 1, lr) for c, cut, g, d, lr in CASES[case]]
    server = ServerSpec(device_grad="own", lr=SERVER_LR, forward=group_forward)
    return RoundPlan(tasks, topology=Star(server=server))


def hand_concatenated_step(ctx, state, plan: RoundPlan):
    """One iteration built by hand: torch.cat of a group's smashed data per cut point, one
    forward/backward through the server part (mean loss over the group's samples), one SGD
    step, the input gradient sliced per member and rescaled to its own mean loss."""
    model = copy.deepcopy(ctx.model)
    model.load_state_dict(state)
    model.train()
    n = model.num_blocks
    devices, servers = {}, {}
    for group, tasks in plan.groups().items():
        server = copy.deepcopy(ModelPart(model, min(t.cut for t in tasks), n))
        sent = []
        for t in tasks:
            part = copy.deepcopy(ModelPart(model, 0, t.cut))
            seed = derive_seed(SEED, t.client)
            idx = client_batches(ctx.client_indices[t.client], t.batch_size, 1, seed)[0]
            fx = part(ctx.bundle.train.x[idx])
            sent.append((t, part, fx, fx.detach().requires_grad_(), ctx.bundle.train.y[idx]))
        total = sum(len(y) for *_, y in sent)
        loss = torch.zeros(())
        for cut in dict.fromkeys(t.cut for t, *_ in sent):  # first-appearance order
            members = [s for s in sent if s[0].cut == cut]
            out = server(torch.cat([fs for *_, fs, _ in members]), start=cut)
            y = torch.cat([y for *_, y in members])
            loss = loss + F.cross_entropy(out, y, reduction="sum") / total
        loss.backward()
        with torch.no_grad():
            for p in server.parameters():
                if p.grad is not None:
                    p -= plan.topology.server.lr * p.grad
        servers[group] = server.state_dict()
        for t, part, fx, fs, y in sent:
            fx.backward(fs.grad * (total / len(y)))
            with torch.no_grad():
                for p in part.parameters():
                    p -= t.lr * p.grad
            devices[t.client] = part.state_dict()
    return devices, servers


def _executors():
    return {
        "sequential": SequentialExecutor(),
        "vmap": VectorizedExecutor(use_vmap=True),
        "rows": VectorizedExecutor(use_vmap=False),
    }


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("executor", ["sequential", "vmap", "rows"])
def test_concat_step_equals_hand_built_concatenated_step(case, executor):
    ctx = _ctx()
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    plan = _plan(case, "concat")
    devices, servers = hand_concatenated_step(ctx, state, plan)
    ex = _executors()[executor]
    res = ex.run_round(ctx, state, plan, round_seed=SEED)
    assert getattr(ex, "fallbacks", 0) == 0
    assert res.server_states.keys() == servers.keys()
    for g, server in servers.items():
        assert _max_diff(res.server_states[g], server) < 1e-6, g
    for u in res.updates:
        assert _max_diff(u.state, devices[u.client]) < 1e-6, u.client


@pytest.mark.parametrize("case", ["one_cut", "mixed_cuts"])
def test_separate_forwards_differ_from_the_merged_batch_under_batchnorm(case):
    """The check above can fail: per-member forwards normalise each member's batch alone, so
    with BatchNorm in the server part they give another step (server and devices) — except
    for a member alone at its cut point, whose merged batch is its own."""
    ctx = _ctx()
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    plan = _plan(case, "concat")
    devices, servers = hand_concatenated_step(ctx, state, plan)
    res = SequentialExecutor().run_round(ctx, state, _plan(case, "separate"), round_seed=SEED)
    assert _max_diff(res.server_states[0], servers[0]) > 1e-4
    cuts = [t.cut for t in plan.tasks]
    for u in res.updates:
        diff = _max_diff(u.state, devices[u.client])
        assert diff > 1e-5 if cuts.count(u.cut) > 1 else diff < 1e-6, u.client


def test_without_batchnorm_concat_and_separate_agree():
    """Only sample-coupling layers tell the two apart: on the MLP they give the same step."""
    ctx = prepare(as_config(tiny_config(algorithm="mergesfl", model="mlp"))).ctx
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    a, b = (
        SequentialExecutor().run_round(ctx, state, _plan("mixed_cuts", mode), round_seed=SEED)
        for mode in ("concat", "separate")
    )
    assert _max_diff(a.server_states[0], b.server_states[0]) < 1e-6
    for u, v in zip(a.updates, b.updates, strict=True):
        assert u.loss_sum == pytest.approx(v.loss_sum, rel=1e-6)
        assert _max_diff(u.state, v.state) < 1e-6


def test_unknown_group_forward_is_refused_when_the_plan_is_made():
    with pytest.raises(ValueError, match="ServerSpec.forward must be one of separate, concat"):
        _plan("one_cut", "stack")


@pytest.mark.parametrize(
    ("algorithm", "option", "default"),
    [("mergesfl", "merge", "concat"), ("s2fl", "group_forward", "concat")],
)
def test_algorithm_options_set_the_plan(algorithm, option, default):
    for value in (None, "separate"):
        changes = {} if value is None else {f"options.{algorithm}.{option}": value}
        prep = prepare(as_config(tiny_config(algorithm=algorithm, **changes)))
        alg = prep.algorithm
        clients = alg.select_clients(0, np.random.default_rng(0))
        plan = alg.plan_round(0, clients, np.random.default_rng(1))
        assert plan.topology.server.forward == (value or default)


@pytest.mark.parametrize("key", ["options.mergesfl.merge", "options.s2fl.group_forward"])
def test_bad_merge_option_is_rejected(key):
    algorithm = key.split(".")[1]
    with pytest.raises(ConfigError) as err:
        splitfl.validate(tiny_config(algorithm=algorithm, **{key: "stack"}))
    assert str(err.value).startswith(key)

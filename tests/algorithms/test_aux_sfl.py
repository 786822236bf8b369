"""Auxiliary-model split learning (issue 36): one auxiliary step and one alignment step by
hand (and with two tensors crossing the cut), CSE-FSL against a hand-written loop, FSL-SAGE
with a perfect auxiliary model against SplitFed V1, every executor against the sequential
one, the communication budget stop (networked runs: tests/net/test_networked_aux.py)."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import splitfl
from conftest import tiny_config
from splitfl.algorithms import ALGORITHMS
from splitfl.config import TrainConfig
from splitfl.core.plan import ClientTask
from splitfl.core.seeding import derive_seed
from splitfl.core.topology import AlignSpec, ServerSpec
from splitfl.executors import SequentialExecutor
from splitfl.executors.parallel import ParallelExecutor
from splitfl.executors.vectorized import VectorizedExecutor
from splitfl.experiment.runner import as_config, prepare
from splitfl.models import BlockModel, ModelPart
from splitfl.roles.aux_numerics import align_aux, estimate_gradient, remember, true_gradients
from splitfl.roles.common import client_batches
from splitfl.roles.sides import DeviceRole, Runtime
from splitfl.testing import config_for
from splitfl.topologies.split import split_task_cost

RT = Runtime(torch.device("cpu"))
SGD = TrainConfig(lr=0.5)


def _t(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _linear(weight, bias) -> nn.Linear:
    layer = nn.Linear(len(weight[0]), len(weight)).double()
    with torch.no_grad():
        layer.weight.copy_(torch.tensor(weight, dtype=torch.float64))
        layer.bias.copy_(torch.tensor(bias, dtype=torch.float64))
    return layer


def _role(aux: nn.Module) -> tuple[DeviceRole, torch.Tensor, torch.Tensor]:
    """A device with part fx = W x + b on two samples (one batch), and its data."""
    part = BlockModel([_linear([[1.0, -1.0], [0.5, 2.0]], [0.1, -0.2]), nn.Identity()], (1,))
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5]], dtype=torch.float64)
    y = torch.tensor([0, 1])
    task = ClientTask(0, 1, batch_size=2, steps=1, lr=0.5)
    role = DeviceRole(task, ModelPart(part, 0, 1), aux, SGD, (x, y, np.arange(2)), 1, RT)
    return role, x, y


def _softmax_grad(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """∂ mean CE / ∂ logits = (softmax − onehot) / B."""
    p = torch.exp(logits) / torch.exp(logits).sum(1, keepdim=True)
    return (p - torch.nn.functional.one_hot(y, p.shape[1]).double()) / len(y)


def test_local_auxiliary_step_by_hand():
    """CSE-FSL/LocFedMix-SL: one SGD step of the part and the auxiliary model on the auxiliary
    cross-entropy (ECSE-FL: aux step, then splitting_output.backward(local_smashed_data.grad))."""
    aux = nn.Sequential(nn.Flatten(), _linear([[1.0, 0.0], [-1.0, 1.0]], [0.0, 0.3]))
    role, x, y = _role(aux)
    w, b = _t([[1.0, -1.0], [0.5, 2.0]]), _t([0.1, -0.2])
    a, c = _t([[1.0, 0.0], [-1.0, 1.0]]), _t([0.0, 0.3])
    fx = x @ w.T + b
    d = _softmax_grad(fx @ a.T + c, y)  # ∂ℓ/∂logits
    dfx = d @ a
    expect = {"w": w - 0.5 * dfx.T @ x, "b": b - 0.5 * dfx.sum(0)}
    expect |= {"a": a - 0.5 * d.T @ fx, "c": c - 0.5 * d.sum(0)}
    role.forward(0)
    role.head_update()
    part, aux_state = role.states()
    assert torch.allclose(part["blocks.0.weight"], expect["w"], atol=1e-12)
    assert torch.allclose(part["blocks.0.bias"], expect["b"], atol=1e-12)
    assert torch.allclose(aux_state["1.weight"], expect["a"], atol=1e-12)
    assert torch.allclose(aux_state["1.bias"], expect["c"], atol=1e-12)


def test_gradient_estimate_step_by_hand():
    """FSL-SAGE: the part steps with ĝ = ∂ℓ(aux(fx), y)/∂fx = (softmax − onehot)/B · A; the
    auxiliary model is untouched."""
    aux = nn.Sequential(nn.Flatten(), _linear([[1.0, 0.0], [-1.0, 1.0]], [0.0, 0.3]))
    role, x, y = _role(aux)
    w, b = _t([[1.0, -1.0], [0.5, 2.0]]), _t([0.1, -0.2])
    a, c = _t([[1.0, 0.0], [-1.0, 1.0]]), _t([0.0, 0.3])
    fx = x @ w.T + b
    g = _softmax_grad(fx @ a.T + c, y) @ a
    role.forward(0)
    role.estimate_update()
    part, aux_state = role.states()
    assert torch.allclose(part["blocks.0.weight"], w - 0.5 * g.T @ x, atol=1e-12)
    assert torch.allclose(part["blocks.0.bias"], b - 0.5 * g.sum(0), atol=1e-12)
    assert torch.equal(aux_state["1.weight"], a) and torch.equal(aux_state["1.bias"], c)


def _align_objective(a: torch.Tensor, c: torch.Tensor, x, y, g) -> float:
    """Σ (∂ℓ(A x + c)/∂x − g)² with ℓ the mean cross-entropy, in closed form."""
    est = _softmax_grad(x @ a.T + c, y) @ a
    return float(((est - g) ** 2).sum())


def test_alignment_step_by_hand():
    """FSL-SAGE: true cut-layer gradients of the server's mean loss over the memory (closed
    form for a linear server), then one Adam step on the summed squared error: Adam's first
    step is −lr · G / (|G| + eps) with G the objective's gradient (central differences of the
    closed-form objective here, no autograd)."""
    s, d = _t([[0.3, -0.7], [1.1, 0.4]]), _t([0.2, -0.1])
    server = _linear(s.tolist(), d.tolist())
    x = torch.tensor([[0.5, -1.0], [1.5, 0.2], [-0.3, 0.8]], dtype=torch.float64)
    y = torch.tensor([1, 0, 1])
    g = true_gradients(server, x, y, "cross_entropy")
    assert torch.allclose(g, _softmax_grad(x @ s.T + d, y) @ s, atol=1e-12)
    a0, c0 = _t([[1.0, 0.2], [-0.4, 0.6]]), _t([0.1, 0.0])
    aux = nn.Sequential(nn.Flatten(), _linear(a0.tolist(), c0.tolist()))
    align_aux(aux, (x, y), g, AlignSpec(epochs=1, batch_size=3, lr=0.01), "cross_entropy", 0)
    h = 1e-6
    for name, base in (("1.weight", a0), ("1.bias", c0)):
        grad = torch.zeros_like(base)
        for idx in np.ndindex(*base.shape):
            up, down = base.clone(), base.clone()
            up[idx] += h
            down[idx] -= h
            pair = [(up, c0), (down, c0)] if name == "1.weight" else [(a0, up), (a0, down)]
            grad[idx] = _align_objective(*pair[0], x, y, g) - _align_objective(*pair[1], x, y, g)
            grad[idx] /= 2 * h
        expect = base - 0.01 * grad / (grad.abs() + 1e-8)
        assert torch.allclose(aux.state_dict()[name], expect, atol=1e-6), name


def test_two_tensors_crossing_the_cut_by_hand():
    """A cut carrying (activation u, skip v, an integer mask): the auxiliary model reads
    [u | v] (flattened, concatenated), so ĝ_u, ĝ_v are the two column blocks of
    (softmax − onehot)/B · A and the mask has none; the server's true gradients are per tensor;
    alignment sums the squared errors of both blocks (= the fit on [u | v] with [g_u | g_v]);
    the memory keeps every tensor's last samples."""
    u = torch.tensor([[0.5, -1.0], [1.5, 0.2], [-0.3, 0.8]], dtype=torch.float64)
    v = torch.tensor([[0.1], [-0.4], [0.9]], dtype=torch.float64)
    mask = torch.tensor([[1], [0], [1]])
    y = torch.tensor([1, 0, 1])
    a, c = _t([[1.0, 0.2, -0.5], [-0.4, 0.6, 0.3]]), _t([0.1, 0.0])
    aux = nn.Sequential(nn.Flatten(), _linear(a.tolist(), c.tolist()))
    g_est = estimate_gradient(aux, (u, v, mask), y, "cross_entropy", lambda m, x: m(x))
    full = _softmax_grad(torch.cat([u, v], 1) @ a.T + c, y) @ a
    assert torch.allclose(g_est[0], full[:, :2], atol=1e-12)
    assert torch.allclose(g_est[1], full[:, 2:], atol=1e-12)
    assert g_est[2] is None
    s = _t([[0.3, -0.7], [1.1, 0.4]])
    g = true_gradients(lambda x: (x[0] + x[1] * x[2]) @ s.T, (u, v, mask), y, "cross_entropy")
    d = _softmax_grad((u + v * mask) @ s.T, y) @ s
    assert torch.allclose(g[0], d, atol=1e-12)
    assert torch.allclose(g[1], (d * mask).sum(1, keepdim=True), atol=1e-12)
    assert g[2] is None
    spec = AlignSpec(epochs=2, batch_size=2, lr=0.01)
    two = nn.Sequential(nn.Flatten(), _linear(a.tolist(), c.tolist()))
    align_aux(two, ((u, v, mask), y), g, spec, "cross_entropy", 5)
    one = nn.Sequential(nn.Flatten(), _linear(a.tolist(), c.tolist()))
    align_aux(one, (torch.cat([u, v], 1), y), torch.cat(g[:2], 1), spec, "cross_entropy", 5)
    for k, t in one.state_dict().items():
        assert torch.allclose(two.state_dict()[k], t, atol=1e-12), k
    assert not torch.equal(two.state_dict()["1.weight"], a)
    kept = remember(remember(None, (u, v, mask), y, 4), (u[:2], v[:2], mask[:2]), y[:2], 4)
    for t, whole in zip(kept[0], (u, v, mask), strict=True):
        assert torch.equal(t, torch.cat([whole, whole[:2]])[-4:])
    assert kept[1].tolist() == [0, 1, 1, 0]


def _plan(config: dict, dtype=torch.float64):
    prep = prepare(as_config(config), dtype=dtype)
    alg = prep.algorithm
    clients = alg.select_clients(0, np.random.default_rng(0))
    return prep, alg.plan_round(0, clients, np.random.default_rng(1))


CSE = {
    "algorithm": "cse_fsl",
    "model": "mlp",
    "data.num_clients": 4,
    "train.clients_per_round": 3,
    "train.local_steps": 3,
    "options.cse_fsl.upload_every": 1,
}


def test_cse_fsl_with_h_1_equals_a_hand_written_loop():
    """ECSE-FL's loop with h = 1 (``-batch_round 1``): clients take turns of one batch; each
    batch is a local aux step of the client, then one step of the single server model on its
    smashed data; no gradient goes back."""
    prep, plan = _plan(tiny_config(**CSE))
    ctx = prep.ctx
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    got = SequentialExecutor().run_round(ctx, state, plan, round_seed=5)
    model = ctx.model
    cut, n = plan.tasks[0].cut, model.num_blocks
    lr = plan.tasks[0].lr
    parts = {t.client: ModelPart(_copy(model), 0, cut) for t in plan.tasks}
    auxes = {t.client: _aux_holding(plan.aux, t.aux_state) for t in plan.tasks}
    server = ModelPart(_copy(model), cut, n)
    x_all, y_all = ctx.bundle.train.x, ctx.bundle.train.y
    batches = {
        t.client: client_batches(ctx.client_indices[t.client], t.batch_size, t.steps,
                                 derive_seed(5, t.client))
        for t in plan.tasks
    }  # fmt: skip
    ce = nn.functional.cross_entropy
    for step in range(plan.tasks[0].steps):
        for c in sorted(parts):
            xb, yb = x_all[batches[c][step]], y_all[batches[c][step]]
            fx = parts[c](xb)
            loss = ce(auxes[c](fx), yb)
            params = [*parts[c].parameters(), *auxes[c].parameters()]
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, gr in zip(params, grads, strict=True):
                    p -= lr * gr
            s_loss = ce(server(fx.detach(), start=cut), yb)
            grads = torch.autograd.grad(s_loss, list(server.parameters()))
            with torch.no_grad():
                for p, gr in zip(server.parameters(), grads, strict=True):
                    p -= lr * gr
    for u in got.updates:
        for k, v in parts[u.client].state_dict().items():
            assert torch.allclose(u.state[k], v, atol=1e-12), k
        for k, v in auxes[u.client].state_dict().items():
            assert torch.allclose(u.aux_state[k], v, atol=1e-12), k
        assert u.uploaded == u.samples  # h = 1: every batch reaches the server
    for k, v in server.state_dict().items():
        assert torch.allclose(got.server_states[0][k], v, atol=1e-12), k


def _copy(model):
    import copy

    return copy.deepcopy(model)


def _aux_holding(spec, state):
    from splitfl.roles.aux_numerics import aux_module

    return aux_module(spec, state, next(iter(state.values())))


def test_upload_period_sends_every_hth_batch_and_no_gradients(tmp_path):
    """CSE-FSL h = 2, interleaved: uploads at batches 1, 3 (ECSE-FL: the last of each turn);
    the cost model charges activations of those only, the auxiliary model down and up."""
    changes = {**CSE, "options.cse_fsl.upload_every": 2, "train.local_steps": 4}
    prep, plan = _plan(tiny_config(**changes))
    assert [s for s in range(4) if plan.uploads(s)] == [1, 3]
    res = SequentialExecutor().run_round(prep.ctx, prep.ctx.model.state_dict(), plan, 7)
    alg, ctx = prep.algorithm, prep.ctx
    for u in res.updates:
        assert u.uploaded == sum(len(b) for b in _batches(ctx, u, 7)[1::2])
        task = next(t for t in plan.tasks if t.client == u.client)
        cost = split_task_cost(ctx, task, u.samples, 0, plan)
        assert cost.traffic.gradients_down == 0
        assert cost.traffic.activations_up == u.uploaded * ctx.profile.activation_bytes(task.cut)
        aux_bytes = alg.aux_model.bytes
        assert cost.traffic.model_down == ctx.profile.device_bytes(task.cut) + aux_bytes
        per_sample = ctx.profile.device_flops(task.cut) + alg.aux_model.flops
        assert cost.device_flops == pytest.approx(u.samples * per_sample)


def _batches(ctx, u, seed):
    return client_batches(ctx.client_indices[u.client], 16, u.steps, derive_seed(seed, u.client))


SAGE = {
    "algorithm": "fsl_sage",
    "model": "mlp",
    "data.num_clients": 4,
    "train.clients_per_round": 3,
    "train.local_steps": 3,
    "options.fsl_sage.upload_every": 2,
    "options.fsl_sage.align_every": 1,
    "options.fsl_sage.align_epochs": 2,
    "options.fsl_sage.align_batch_size": 8,
    "options.fsl_sage.align_memory": 20,
}
LOCFEDMIX = {"algorithm": "locfedmix_sl", "model": "mlp", "options.locfedmix_sl.tau": 2}


@pytest.mark.parametrize("changes", [CSE, SAGE, LOCFEDMIX], ids=["cse", "sage", "locfedmix"])
@pytest.mark.parametrize("executor", ["vectorized", "parallel"])
def test_every_executor_equals_sequential(changes, executor):
    prep, plan = _plan(tiny_config(**changes))
    ctx = prep.ctx
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    ref = SequentialExecutor().run_round(ctx, state, plan, round_seed=3)
    # parallel: auxiliary plans are one coupled unit (``parallel.coupled``), run in the driver
    other = VectorizedExecutor() if executor == "vectorized" else ParallelExecutor()
    got = other.run_round(ctx, state, plan, round_seed=3)
    assert ref.updates and ref.server_states  # the loops below are not vacuous
    for u, v in zip(ref.updates, got.updates, strict=True):
        assert (u.client, u.samples, u.uploaded) == (v.client, v.samples, v.uploaded)
        for k in u.state:
            assert torch.allclose(u.state[k], v.state[k], atol=1e-9), k
        for k in u.aux_state:
            assert torch.allclose(u.aux_state[k], v.aux_state[k], atol=1e-9), k
    for k, t in ref.server_states[0].items():
        assert torch.allclose(t, got.server_states[0][k], atol=1e-9), k


def test_fsl_sage_aligns_on_the_servers_memory_and_keeps_it():
    """Alignment round with h = 2, 3 steps: uploads at steps 0 and 2 go to the memory (the
    server's), the aligned auxiliary model differs from the initial one, the next round's
    tasks carry the memory, and the cost charges the aligned model's download."""
    prep, plan = _plan(tiny_config(**SAGE))
    alg, ctx = prep.algorithm, prep.ctx
    res = SequentialExecutor().run_round(ctx, ctx.model.state_dict(), plan, 3)
    for u in res.updates:
        x, y = u.aux_memory
        assert u.uploaded == sum(len(b) for b in _batches(ctx, u, 3)[0::2]) == 32
        assert len(y) == len(x) == 20  # align_memory: the last 20 uploaded samples
        assert any(not torch.equal(u.aux_state[k], alg.aux_model.initial[k]) for k in u.aux_state)
        task = next(t for t in plan.tasks if t.client == u.client)
        cost = split_task_cost(ctx, task, u.samples, 0, plan)
        assert cost.traffic.model_down == ctx.profile.device_bytes(task.cut) + alg.aux_model.bytes
    alg.aggregate(ctx.model.state_dict(), plan, res)
    nxt = alg.plan_round(1, [u.client for u in res.updates], np.random.default_rng(2))
    assert all(t.aux_memory is not None and t.align for t in nxt.tasks)


def linear_pair(input_shape, num_classes) -> nn.Sequential:
    """A linear model in two blocks (device: flatten + linear; server: linear), for
    :func:`test_fsl_sage_with_a_perfect_auxiliary_model_equals_splitfed_v1`."""
    width = int(np.prod(input_shape))
    return nn.Sequential(
        nn.Sequential(nn.Flatten(), nn.Linear(width, 8)), nn.Linear(8, num_classes)
    )


def test_fsl_sage_with_a_perfect_auxiliary_model_equals_splitfed_v1():
    """On a linear model, an auxiliary model equal to the server part (a perfect fit: its ĝ is
    the server's true cut-layer gradient for every input) makes FSL-SAGE's device updates
    SplitFed V1's, bit for bit up to float64 rounding — while the server does not move
    (server lr 0). With a training server they differ, which is why FSL-SAGE cannot equal
    SplitFed V1 in general: the auxiliary model is fixed between alignments while the server
    steps at every upload, an alignment fits the server *after* that iteration's step, and
    SplitFed V1 steps per-client server copies (averaged) where FSL-SAGE steps one model."""
    here = str(Path(__file__).parents[1])
    common = {"model": "test_aux_sfl:linear_pair", "import_dirs": [here], "train.local_steps": 3}
    common |= {"data.num_clients": 4, "train.clients_per_round": 2}
    sage = {"options.fsl_sage.upload_every": 1, "options.fsl_sage.aux_model": "linear"}
    prep_v1, plan_v1 = _plan(tiny_config(algorithm="splitfed_v1", **common))
    prep_sage, plan_sage = _plan(tiny_config(algorithm="fsl_sage", **common, **sage))
    state = {k: v.clone() for k, v in prep_v1.ctx.model.state_dict().items()}
    server = {"1.weight": state["blocks.1.weight"], "1.bias": state["blocks.1.bias"]}
    for t in plan_sage.tasks:
        t.aux_state, t.align = server, False
    assert [t.client for t in plan_v1.tasks] == [t.client for t in plan_sage.tasks]

    def parts(plan, prep, server_lr):
        topology = dataclasses.replace(plan.topology, server=ServerSpec(lr=server_lr))
        plan = dataclasses.replace(plan, topology=topology)
        res = SequentialExecutor().run_round(prep.ctx, state, plan, round_seed=5)
        return {u.client: u.state for u in res.updates}

    for lr, equal in [(0.0, True), (0.05, False)]:
        v1, fsl = parts(plan_v1, prep_v1, lr), parts(plan_sage, prep_sage, lr)
        close = all(
            torch.allclose(v1[c][k], fsl[c][k], rtol=0, atol=1e-12) for c in v1 for k in v1[c]
        )
        assert close == equal, lr
        assert any(not torch.equal(v1[c][k], state[k]) for c in v1 for k in v1[c])


def _traffic_mib(rows, r):
    return rows[r - 1]["traffic_total_cum"] / 2**20


@pytest.mark.parametrize("algorithm", ["splitfed_v1", "cse_fsl"])
def test_comm_budget_ends_the_run_at_the_budget(tmp_path, algorithm):
    base = tiny_config(algorithm=algorithm, rounds=4, **{"options.cse_fsl.upload_every": 2})
    full = splitfl.run(base, run_dir=tmp_path / "full")
    budget = _traffic_mib(full.metrics, 2)  # reached exactly after round 2
    cut = splitfl.run({**base, "train": {**base["train"], "comm_budget_mb": budget}},
                      run_dir=tmp_path / "cut")  # fmt: skip
    summary = json.loads((cut.run_dir / "summary.json").read_text())
    assert summary["rounds"] == 2 and len(cut.metrics) == 2
    assert summary["status"].startswith("comm budget reached")
    assert f"train.comm_budget_mb = {budget}" in summary["status"]
    assert (cut.run_dir / "model.pt").is_file()
    just_above = {**base["train"], "comm_budget_mb": budget * (1 + 1e-9)}
    more = splitfl.run({**base, "train": just_above}, run_dir=tmp_path / "more")
    assert len(more.metrics) == 3


def test_networked_accepts_every_auxiliary_algorithm():
    """The auxiliary model lives on the device process (tests/net/test_networked_aux.py)."""
    for algorithm, aux in [("cse_fsl", "linear"), ("fsl_sage", None), ("locfedmix_sl", "linear")]:
        options = {f"options.{algorithm}.aux_model": aux or "resnet_stage"}
        splitfl.validate(config_for(algorithm, executor="networked", **options))


def test_registered_with_papers():
    assert "ECSE-FL" in ALGORITHMS["cse_fsl"].paper
    assert "FSL-SAGE" in ALGORITHMS["fsl_sage"].paper

"""LocFedMix-SL's ``device_update: local+server`` (issue 50 item 2): the PS sends each batch's
activation gradient back (MergeSFL §II-B) and the device steps on its local loss plus it; the
clock charges the gradients' download; every executor computes the same step."""

from __future__ import annotations

import pytest
import torch
from test_aux_sfl import LOCFEDMIX, _linear, _plan, _role, _softmax_grad, _t

from conftest import tiny_config
from splitfl.config import ConfigError
from splitfl.executors import SequentialExecutor
from splitfl.executors.parallel import ParallelExecutor
from splitfl.executors.vectorized import VectorizedExecutor
from splitfl.experiment.runner import as_config
from splitfl.topologies.split import split_task_cost

BOTH = {**LOCFEDMIX, "options.locfedmix_sl.device_update": "local+server"}


def test_local_plus_server_step_by_hand():
    """One SGD step of fx = W x + b on ∂ℓ_aux/∂fx + g (g: the server's gradient), and of the
    auxiliary model on its own loss: the two gradients add on the part."""
    aux = torch.nn.Sequential(torch.nn.Flatten(), _linear([[1.0, 0.0], [-1.0, 1.0]], [0.0, 0.3]))
    role, x, y = _role(aux)
    w, b = _t([[1.0, -1.0], [0.5, 2.0]]), _t([0.1, -0.2])
    a, c = _t([[1.0, 0.0], [-1.0, 1.0]]), _t([0.0, 0.3])
    fx = x @ w.T + b
    d = _softmax_grad(fx @ a.T + c, y)
    g = _t([[0.25, -0.5], [1.0, 0.75]])  # what the server sent back
    dfx = d @ a + g
    role.forward(0)
    role.local_server_update(g)
    part, aux_state = role.states()
    assert torch.allclose(part["blocks.0.weight"], w - 0.5 * dfx.T @ x, atol=1e-12)
    assert torch.allclose(part["blocks.0.bias"], b - 0.5 * dfx.sum(0), atol=1e-12)
    assert torch.allclose(aux_state["1.weight"], a - 0.5 * d.T @ fx, atol=1e-12)
    assert torch.allclose(aux_state["1.bias"], c - 0.5 * d.sum(0), atol=1e-12)


def test_the_option_sets_the_plan_and_the_clock_charges_the_gradients():
    """``local``: no gradient comes down; ``local+server``: every uploaded sample's gradient,
    the rest of the cost unchanged."""
    costs = {}
    for mode in ("local", "local+server"):
        changes = {**LOCFEDMIX, "options.locfedmix_sl.device_update": mode}
        prep, plan = _plan(tiny_config(**changes))
        assert plan.device_loss == mode
        ctx, task = prep.ctx, plan.tasks[0]
        samples = task.steps * task.batch_size
        costs[mode] = (split_task_cost(ctx, task, samples, 0, plan), ctx, task, samples)
    local, (both, ctx, task, samples) = costs["local"][0], costs["local+server"]
    assert local.traffic.gradients_down == 0
    assert both.traffic.gradients_down == samples * ctx.profile.gradient_bytes(task.cut) > 0
    assert both.traffic.activations_up == local.traffic.activations_up
    assert both.comm_time > local.comm_time


def test_local_plus_server_differs_from_local_and_every_executor_agrees():
    prep, plan = _plan(tiny_config(**BOTH))
    ctx = prep.ctx
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    ref = SequentialExecutor().run_round(ctx, state, plan, round_seed=3)
    prep_local, plan_local = _plan(tiny_config(**LOCFEDMIX))
    local = SequentialExecutor().run_round(prep_local.ctx, state, plan_local, round_seed=3)
    both, alone = ref.updates[0].state, local.updates[0].state
    assert any(not torch.allclose(both[k], alone[k]) for k in both if "weight" in k)
    for other in (VectorizedExecutor(), ParallelExecutor()):
        got = other.run_round(ctx, state, plan, round_seed=3)
        for u, v in zip(ref.updates, got.updates, strict=True):
            for k in u.state:
                assert torch.allclose(u.state[k], v.state[k], atol=1e-9), k


def test_an_unknown_device_update_is_refused():
    with pytest.raises(ConfigError, match="options.locfedmix_sl.device_update"):
        _plan(tiny_config(**{**LOCFEDMIX, "options.locfedmix_sl.device_update": "server"}))
    assert as_config(tiny_config(**BOTH)).options["locfedmix_sl"]["device_update"]

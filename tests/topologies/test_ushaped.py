"""U-shaped split learning (issue 47 item 5), added through the topology door: the family's
round is the whole model's SGD, its clock charges both hops each way, every runtime that
claims it runs it, and bad cuts are one line."""

import dataclasses
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import splitfl
from splitfl.config import ConfigError
from splitfl.core.plan import ClientTask, RoundPlan
from splitfl.core.seeding import derive_seed, rng_for
from splitfl.core.topology import Star, UShaped
from splitfl.executors import SequentialExecutor, TimingExecutor
from splitfl.experiment.runner import as_config, prepare
from splitfl.models import block_index
from splitfl.testing import config_for
from splitfl.topologies import family_of
from splitfl.topologies.ushaped import UShapedFamily
from splitfl.topologies.ushaped.price import ushaped_client_cost
from splitfl.topologies.ushaped.schedule import check_cuts

#: Different code paths (the loss at the head on the device vs at the server's end; one
#: autograd graph split at two points instead of one), float64: the same sums in another
#: order (ARCHITECTURE.md, "Testing numbers: exact or close").
F64_ATOL = 1e-12


def _round(prep, plan_of=lambda plan: plan, seed: int = 11):
    ctx, alg = prep.ctx, prep.algorithm
    clients = alg.select_clients(0, rng_for(3, "select", 0))
    plan = plan_of(alg.plan_round(0, clients, rng_for(3, "plan", 0)))
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    torch.manual_seed(derive_seed(3, "torch", 0))
    return plan, SequentialExecutor().run_round(ctx, state, plan, derive_seed(3, "b", seed))


def test_a_ushaped_round_is_splitfed_v1s_round_at_the_same_cut():
    """Front + middle + head trained by back-propagation through both cuts compute what the
    device part + server part compute with one cut: the whole model's SGD on each client's
    batches. Same plan, Star instead of UShaped: every tensor and loss agrees."""
    prep = prepare(as_config(config_for("ushaped_sl")), dtype=torch.float64)
    plan, ushaped = _round(prep)
    _, star = _round(prep, lambda p: dataclasses.replace(p, topology=Star()))
    tail = prep.algorithm.tail
    assert {t.cut for t in plan.tasks} == {1} and tail == 3 and len(plan.tasks) == 6
    assert len(ushaped.updates) == 6  # the loop below compares every client
    for u, s in zip(ushaped.updates, star.updates, strict=True):
        assert (u.client, u.samples) == (s.client, s.samples) and u.samples > 0
        assert {block_index(k) for k in u.state} == {0, 3, 4}  # front and head
        server = star.server_states[s.group]
        for k, v in u.state.items():
            assert_close(v, s.state[k] if block_index(k) < 1 else server[k], rtol=0, atol=F64_ATOL)
        middle = ushaped.server_states[u.group]
        assert {block_index(k) for k in middle} == {1, 2}
        for k, v in middle.items():
            assert_close(v, server[k], rtol=0, atol=F64_ATOL)
        assert u.loss_sum == pytest.approx(s.loss_sum, rel=1e-12)


def test_a_shared_middle_trains_one_copy_on_the_mean_loss_of_all_members():
    prep = prepare(
        as_config(config_for("ushaped_sl", **{"options.ushaped_sl.server_middle": "shared"})),
        dtype=torch.float64,
    )
    plan, got = _round(prep)
    assert {t.group for t in plan.tasks} == {0} and list(got.server_states) == [0]
    assert family_of(plan).dealable(plan) == "one group (one shared middle)"
    # one member alone: the same as a per-client middle of its own
    alone = dataclasses.replace(plan, tasks=plan.tasks[:1])
    _, single = _round(prep, lambda p: alone)
    per_client = prepare(as_config(config_for("ushaped_sl")), dtype=torch.float64)
    _, theirs = _round(per_client, lambda p: alone)
    assert single.server_states[0]  # the loop below compares the middle's tensors
    for k, v in single.server_states[0].items():
        assert torch.equal(v, theirs.server_states[0][k])


class _Profile:
    """Per-block numbers chosen so that every term of the cost is distinguishable."""

    num_blocks = 4
    params, flops, out, grad = [10, 20, 30, 40], [1, 2, 3, 4], [5, 6, 7, 0], [8, 9, 11, 0]

    def part_bytes(self, lo, hi):
        return sum(self.params[lo:hi])

    def part_flops(self, lo, hi):
        return float(sum(self.flops[lo:hi]))

    def activation_bytes(self, cut):
        return self.out[cut - 1]

    def gradient_bytes(self, cut):
        return self.grad[cut - 1]


def test_the_clock_charges_both_hops_each_way_by_hand():
    """cut 1, tail 3, 2 samples: up = model 50 + 2 × (q_1 5 + g_3 11); down = model 50 +
    2 × (q_3 7 + g_1 8); device 2 × (1 + 4) FLOPs, server 2 × (2 + 3); no label travels."""
    device = SimpleNamespace(uplink=100.0, downlink=50.0, flops=10.0)
    server = SimpleNamespace(flops=20.0)
    cost = ushaped_client_cost(_Profile(), 1, 3, 2, device, server)
    t = cost.traffic
    assert (t.model_down, t.model_up, t.activations_up, t.gradients_down) == (50, 50, 32, 30)
    assert t.labels_up == 0
    assert cost.comm_time == pytest.approx((50 + 32) / 100 + (50 + 30) / 50)
    assert (cost.device_flops, cost.server_flops) == (10.0, 10.0)
    assert (cost.device_time, cost.server_time) == (1.0, 0.5)


def test_timing_rows_are_the_trained_rows_on_the_clock(tmp_path):
    cfg = config_for("ushaped_sl", rounds=2)
    trained = splitfl.run(cfg, run_dir=tmp_path / "s")
    timed = splitfl.run({**cfg, "executor": "timing"}, run_dir=tmp_path / "t")
    assert len(trained.metrics) == 2
    for a, b in zip(trained.metrics, timed.metrics, strict=True):
        keys = ["round_time", "client_times", "bytes_model_down", "bytes_model_up"]
        keys += ["bytes_activations_up", "bytes_gradients_down", "bytes_labels_up"]
        for key in keys:
            assert a[key] == b[key], key
        assert a["bytes_labels_up"] == 0 and a["bytes_activations_up"] > 0
    assert trained.metrics[-1]["test_acc"] > 0.3  # it learns: 3 of 10 digits after 2 rounds


def test_the_untrained_round_has_the_trained_rounds_shape():
    prep = prepare(as_config(config_for("ushaped_sl")))
    plan, ref = _round(prep)
    got = TimingExecutor().run_round(prep.ctx, prep.ctx.model.state_dict(), plan, 0)
    assert [(u.client, u.cut, u.group, u.samples, set(u.state)) for u in got.updates] == [
        (u.client, u.cut, u.group, u.samples, set(u.state)) for u in ref.updates
    ]
    assert {g: set(s) for g, s in got.server_states.items()} == {
        g: set(s) for g, s in ref.server_states.items()
    }


@pytest.mark.parametrize(
    "options,message",
    [
        ({"cut": 3, "tail": 2}, "options.ushaped_sl.tail: must be above cut 3"),
        ({"tail": 5}, r"options.ushaped_sl.tail: must be in \[1, 4\]"),
        ({"server_middle": "one"}, "options.ushaped_sl.server_middle: allowed"),
    ],
)
def test_bad_cuts_are_one_line_naming_the_option(options, message):
    cfg = config_for("ushaped_sl", **{f"options.ushaped_sl.{k}": v for k, v in options.items()})
    with pytest.raises(ConfigError, match=message) as err:
        splitfl.validate(cfg)
    assert "\n" not in str(err.value)


def test_the_payload_and_the_family_refuse_plans_no_runtime_can_run():
    with pytest.raises(ValueError, match="UShaped.tails"):
        UShaped(tails={0: 0})
    tasks = [ClientTask(0, 1, 0), ClientTask(1, 2, 0)]
    with pytest.raises(ValueError, match="members of a U-shaped group share cut and tail"):
        check_cuts(RoundPlan(tasks, topology=UShaped(tails={0: 3, 1: 3})), 5)
    with pytest.raises(ValueError, match="1 <= cut < tail < 5"):
        check_cuts(RoundPlan(tasks[:1], topology=UShaped(tails={0: 5})), 5)
    with pytest.raises(ValueError, match="names no tail for client 0"):
        check_cuts(RoundPlan(tasks[:1], topology=UShaped(tails={})), 5)
    assert isinstance(family_of(RoundPlan([], topology=UShaped(tails={}))), UShapedFamily)
    assert np.isclose(UShaped(tails={}, lr=0.0).lr, 0.0)

"""``executor: timing``: the clock on sample counts, no training (issue 21 item 11)."""

import json

import numpy as np
import pytest
import torch

import splitfl
from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.aggregation.mean import weighted_average
from splitfl.algorithms.adasampling import AdaSampling, sampling_probabilities
from splitfl.config import ConfigError
from splitfl.core.plan import ClientUpdate
from splitfl.core.seeding import derive_seed, rng_for
from splitfl.data import DATASETS, load_dataset
from splitfl.executors import SequentialExecutor, TimingExecutor
from splitfl.experiment.runner import as_config, prepare
from splitfl.listing import catalog
from splitfl.testing import config_for

# Every algorithm's timing rows against its sequential rows: tests/conformance/.


def strict_json(text: str) -> None:
    """Every line parses as JSON without NaN/Infinity."""

    def refuse(name):
        raise ValueError(name)

    for line in text.splitlines():
        json.loads(line, parse_constant=refuse)


def test_timing_update_counts_what_sequential_trains():
    """Per client: cut, group, samples, steps and state keys as the reference executor, the
    state being the global tensors themselves (nothing copied, nothing trained)."""
    prep = prepare(as_config(config_for("mergesfl")))
    algo, ctx = prep.algorithm, prep.ctx
    clients = algo.select_clients(0, rng_for(3, "select", 0))
    plan = algo.plan_round(0, clients, rng_for(3, "plan", 0))
    assert len({t.batch_size for t in plan.tasks}) > 1  # regulated, unequal batches
    state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    seed = derive_seed(3, "b", 0)
    ref = SequentialExecutor().run_round(ctx, state, plan, seed)
    got = TimingExecutor().run_round(ctx, state, plan, seed)

    def shape(u: ClientUpdate):
        return u.client, u.cut, u.group, u.samples, u.steps, sorted(u.state)

    assert [shape(u) for u in got.updates] == [shape(u) for u in ref.updates]
    assert {g: sorted(s) for g, s in got.server_states.items()} == {
        g: sorted(s) for g, s in ref.server_states.items()
    }
    for u in got.updates:
        assert all(u.state[k] is state[k] for k in u.state)
        assert u.loss_sum == u.samples  # the stand-in loss, 1.0 per sample


def test_aggregating_untouched_copies_gives_the_global_model():
    state = {"blocks.0.w": torch.tensor([1.5, -2.0]), "blocks.1.n": torch.tensor(7)}
    ups = [ClientUpdate(c, 1, 0, 5, 1, state, 0.0) for c in range(3)]
    out = layerwise_aggregate(state, ups, {0: state}, {0: 1.0, 1: 2.0, 2: 4.0})
    # nothing changed: the global model's own tensors, no copies (nothing writes them in place)
    assert all(out[k] is state[k] for k in state)
    avg = weighted_average([state, state], [1.0, 3.0])
    assert all(torch.equal(avg[k], state[k]) for k in state)


def test_adasampling_with_no_gradient_information_samples_by_size_and_time():
    """Every G_i = 0 (nothing moved): q_i ∝ p_i/√t_i, not 0/0."""
    p, t = np.array([0.5, 0.25, 0.25]), np.array([1.0, 4.0, 1.0])
    q = sampling_probabilities(p, np.zeros(3), t, 0.0)
    assert q == pytest.approx(np.array([0.5, 0.125, 0.25]) / 0.875)


@pytest.mark.parametrize("algorithm", ["pyramidfl", "adasampling"])
def test_stand_in_algorithms_run_without_training(algorithm, tmp_path):
    res = splitfl.run(config_for(algorithm, executor="timing"), run_dir=tmp_path / "r")
    assert all(r["round_time"] > 0 and r["traffic_total"] > 0 for r in res.metrics)
    strict_json((res.run_dir / "metrics.jsonl").read_text())


def test_timing_refuses_control_without_a_stand_in(monkeypatch):
    monkeypatch.setattr(AdaSampling, "timing_stand_in", "")
    with pytest.raises(ConfigError, match=r"^executor: timing: adasampling samples clients by"):
        as_config(config_for("adasampling", executor="timing"))
    as_config(config_for("adasampling"))  # other executors train: no stand-in needed


def test_signals_are_listed():
    algorithms = catalog()["algorithms"]
    assert "[executor timing: " in algorithms["pyramidfl"]
    assert "executor timing" not in algorithms["s2fl"]
    assert "timing" in catalog()["executors"]


def test_train_samples_partitions_labels_without_files(tmp_path):
    """A class-balanced label vector of the requested size; the dataset's folder is never
    read (it does not exist here)."""
    cfg = config_for(
        "splitfed_v1",
        executor="timing",
        model="lenet5",
        **{
            "data.dataset": "cifar10",
            "data.root": str(tmp_path / "absent"),
            "data.train_samples": 1000,
            "data.partition": "iid",
            "data.num_clients": 10,
        },
    )
    ctx = prepare(as_config(cfg)).ctx
    assert int(ctx.data_sizes.sum()) == 1000
    assert ctx.label_hist.sum(0).tolist() == [100] * 10
    assert ctx.bundle.input_shape == (3, 32, 32) and ctx.bundle.num_classes == 10
    assert ctx.bundle.train.x.untyped_storage().nbytes() == 3 * 32 * 32 * 4  # one zero sample
    res = splitfl.run(cfg, run_dir=tmp_path / "r")
    assert res.metrics[0]["traffic_total"] > 0


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"data.train_samples": 100}, "data.train_samples"),  # sequential trains: refused
        ({"executor": "timing", "data.train_samples": 0}, "data.train_samples"),
        (
            {"executor": "timing", "data.train_samples": 100, "data.dataset": "qnli"},
            "data.train_samples",
        ),
    ],
)
def test_train_samples_is_checked(changes, field):
    with pytest.raises(ConfigError) as err:
        prepare(as_config(config_for("fedavg", **changes)))
    assert err.value.field_path == field
    assert "\n" not in str(err.value)


def test_compare_tolerates_runs_without_accuracy(tmp_path):
    out = splitfl.compare(
        config_for("fedavg", executor="timing"), ["fedavg", "splitfed_v1"], out_dir=tmp_path
    )
    assert out.target is None
    assert all(s["final_acc"] is None for s in out.summaries.values())
    assert "| fedavg | - | - |" in out.table
    assert (tmp_path / "accuracy.png").exists() and (tmp_path / "waiting.png").exists()


@pytest.mark.parametrize("name", ["digits", "synthetic_cifar"])
def test_registered_shapes_match_the_loaders(name):
    """Embedded datasets: the shape registered for ``data.train_samples`` is what loads."""
    bundle = load_dataset(name)
    shape = DATASETS[name].shape
    assert (bundle.input_shape, bundle.num_classes) == (shape.input_shape, shape.num_classes)

"""Client-side (federated) evaluation (issue 34 item 8, ``eval.on: server | clients | both``):
each client scores the global model on its own held-out split, aggregated by sample count."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import yaml

import splitfl
import splitfl.experiment.runner as runner
from splitfl.cli.main import main
from splitfl.data.base import ArrayDataset
from splitfl.data.clients import holdout_split
from splitfl.experiment.client_eval import weighted_mean
from splitfl.experiment.context import build_context
from splitfl.experiment.runner import as_config
from splitfl.testing import config_for, tiny_config

BOTH = {"eval.on": "both", "eval.client_holdout": 0.25}


def test_weighted_mean_by_hand():
    # (1·0.5 + 3·1.0) / 4 = 0.875; (1·2 + 3·0) / 4 = 0.5; a None (non-finite) stays None
    values = [{"accuracy": 0.5, "loss": 2.0, "f": None}, {"accuracy": 1.0, "loss": 0.0, "f": 1.0}]
    assert weighted_mean(values, [1, 3]) == {"accuracy": 0.875, "loss": 0.5, "f": None}


def test_holdout_split_is_seeded_disjoint_and_keeps_order():
    parts = [np.array([9, 3, 7, 1, 5, 8, 2, 6]), np.array([4, 0]), np.array([11])]
    train, held = holdout_split(parts, 0.25, seed=5)
    assert [len(h) for h in held] == [2, 1, 0]  # ceil(0.25 n), at most n − 1
    for p, t, h in zip(parts, train, held, strict=True):
        assert sorted([*t, *h]) == sorted(p) and not set(t) & set(h)
        assert list(t) == [i for i in p if i in set(t)]  # the partition's order
    again = holdout_split(parts, 0.25, seed=5)
    assert all(np.array_equal(a, b) for a, b in zip(held, again[1], strict=True))
    others = [holdout_split(parts, 0.25, seed=s)[1][0].tolist() for s in range(6)]
    assert len({tuple(o) for o in others}) > 1  # the seed decides


def _row(result, key: str) -> list:
    return [r.get(key) for r in result.metrics]


def test_clients_metrics_equal_the_global_model_on_the_union_of_held_out_samples(tmp_path):
    """``eval.on: both``: clients_acc/clients_loss of the final round equal an independent
    evaluation of ``model.pt`` on the union of every client's held-out samples (accuracy and
    the mean loss are sample means, so the sample-weighted client mean is the union's)."""
    cfg = tiny_config(rounds=2, algorithm="fedavg", **BOTH)
    run = splitfl.run(cfg, run_dir=tmp_path / "run")
    ctx = build_context(as_config(cfg))
    held = np.concatenate(ctx.holdout_indices)
    assert len(held) == sum(
        int(np.ceil(0.25 * (len(t) + len(h))))
        for t, h in zip(ctx.client_indices, ctx.holdout_indices, strict=True)
    )
    model = ctx.model.eval()
    model.load_state_dict(torch.load(run.run_dir / "model.pt", weights_only=True))
    idx = torch.as_tensor(held)
    with torch.no_grad():
        out = model(ctx.bundle.train.x[idx])
    y = ctx.bundle.train.y[idx]
    last = run.metrics[-1]
    assert last["clients_acc"] == pytest.approx(float((out.argmax(1) == y).double().mean()))
    loss = float(torch.nn.functional.cross_entropy(out.double(), y))
    assert last["clients_loss"] == pytest.approx(loss, rel=1e-5)
    assert last["test_acc"] is not None and last["clients_acc"] != last["test_acc"]
    summary = json.loads((run.run_dir / "summary.json").read_text())
    assert summary["final_clients_acc"] == last["clients_acc"]
    assert summary["final_clients_loss"] == last["clients_loss"]


def test_held_out_samples_are_never_trained_on(tmp_path, monkeypatch):
    """The held-out inputs are replaced by NaN: a single one in a training batch would make
    the loss NaN and stop the run (exit 3); the run finishes, every training loss finite,
    and the clients' metrics (computed on the NaN inputs) are null."""
    real = runner.build_context

    def poisoned(config):
        ctx = real(config)
        held = torch.as_tensor(np.concatenate(ctx.holdout_indices))
        x = ctx.bundle.train.x.clone()
        x[held] = float("nan")
        train = ArrayDataset(x, ctx.bundle.train.y, ctx.bundle.train.writers)
        ctx.bundle = dataclasses.replace(ctx.bundle, train=train)
        return ctx

    monkeypatch.setattr(runner, "build_context", poisoned)
    cfg = tiny_config(rounds=2, **{"eval.on": "clients", "eval.client_holdout": 0.3})
    run = splitfl.run(cfg, run_dir=tmp_path / "run")
    assert run.summary["status"] == "ok"
    assert all(np.isfinite(v) for v in _row(run, "train_loss"))
    assert _row(run, "clients_loss") == [None, None]
    assert _row(run, "test_acc") == [None, None]  # eval.on: clients: no server test set


def test_clients_metrics_are_deterministic_across_reruns(tmp_path):
    cfg = tiny_config(rounds=2, **BOTH, **{"eval.metrics": ["accuracy", "top3"]})
    a = splitfl.run(cfg, run_dir=tmp_path / "a")
    b = splitfl.run(cfg, run_dir=tmp_path / "b")
    for key in ("clients_acc", "clients_loss", "clients_top3"):
        assert _row(a, key) == _row(b, key) and None not in _row(a, key)


def test_server_default_rows_hold_no_clients_metrics(sequential_run):
    run = sequential_run(tiny_config(rounds=2, algorithm="fedavg"))
    assert not any(k.startswith("clients_") for r in run.metrics for k in r)


@pytest.mark.parametrize("algorithm", ["s2fl", "fedavg"])
def test_sequential_and_vectorized_give_the_same_clients_metrics(algorithm, tmp_path):
    runs = {
        ex: splitfl.run(config_for(algorithm, rounds=1, executor=ex, **BOTH), run_dir=tmp_path / ex)
        for ex in ("sequential", "vectorized")
    }
    (ra,), (rb,) = (r.metrics for r in runs.values())
    assert None not in (ra["clients_loss"], ra["clients_acc"])
    assert ra["clients_loss"] == pytest.approx(rb["clients_loss"], rel=1e-4)
    assert ra["clients_acc"] == pytest.approx(rb["clients_acc"], abs=2e-3)
    assert ra["samples"] == rb["samples"]  # both train on the same (held-out-free) samples


@pytest.mark.parametrize(
    "changes,message",
    [
        ({"eval.on": "devices"}, "eval.on: "),
        ({"eval.client_holdout": 1.0}, "eval.client_holdout: must be < 1"),
        ({"eval.on": "both", "executor": "networked"}, "eval.on: both needs the clients'"),
        (
            {"eval.on": "clients", "eval.target_accuracy": 0.5},
            "eval.target_accuracy: is the server's test accuracy",
        ),
    ],
)
def test_bad_eval_on_is_one_line(changes, message, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(tiny_config(**changes)))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err, err

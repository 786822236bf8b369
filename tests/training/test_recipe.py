"""The training recipe: ``train.loss``, ``train.optimizer`` and ``eval.metrics``."""

import ast
import copy
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import splitfl
from conftest import tiny_config
from splitfl.config import ConfigError
from splitfl.core.seeding import derive_seed, rng_for
from splitfl.data.base import ArrayDataset, DatasetBundle, register_dataset
from splitfl.executors import SequentialExecutor
from splitfl.executors.vectorized import VectorizedExecutor
from splitfl.experiment.checkpoint import identity_mismatch, run_identity
from splitfl.experiment.runner import as_config, prepare
from splitfl.experiment.validation import check_config
from splitfl.models.base import lowest_loss_state
from splitfl.net.server.testbed import Testbed
from splitfl.roles.common import client_batches, evaluate
from splitfl.testing import config_for
from splitfl.training import loss_fn, score

LN2, LN3 = math.log(2.0), math.log(3.0)


def _synthetic(targets: str) -> DatasetBundle:
    """Tiny 8×8 inputs with a regression target (their mean × 3: ``[N]``) or 4 multi-hot
    labels (each quarter of the image brighter than 0: ``[N, 4]``)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 1, 8, 8, generator=gen)
    if targets == "regression":
        y, outputs = 3 * x.mean((1, 2, 3)), 1
    else:
        quarters = x.reshape(300, 4, 16).mean(2)
        y, outputs = (quarters > 0).float(), 4
    train, test = ArrayDataset(x[:240], y[:240]), ArrayDataset(x[240:], y[240:])
    return DatasetBundle(f"tiny_{targets}", train, test, outputs, (1, 8, 8))


register_dataset("tiny_regression", "test only", needs_root=False)(
    lambda root: _synthetic("regression")
)
register_dataset("tiny_multilabel", "test only", needs_root=False)(
    lambda root: _synthetic("multilabel")
)

REGRESSION = {
    "model": "mlp",
    "data.dataset": "tiny_regression",
    "data.partition": "iid",
    "data.num_clients": 6,
    "train.clients_per_round": 3,
    "train.loss": "mse",
    "eval.metrics": ["mse"],
}
MULTILABEL = {
    **REGRESSION,
    "data.dataset": "tiny_multilabel",
    "train.loss": "bce_logits",
    "eval.metrics": ["macro_f1", "loss"],
}


# -- losses and metrics on hand-made values -------------------------------------------------
def test_cross_entropy_by_hand():
    out = torch.tensor([[0.0, 0.0], [LN3, 0.0]], dtype=torch.float64)
    y = torch.tensor([1, 0])
    ce = loss_fn("cross_entropy")
    per = [LN2, -math.log(3 / 4)]
    assert ce(out, y, reduction="none").tolist() == pytest.approx(per)
    assert ce(out, y, reduction="sum").item() == pytest.approx(sum(per))
    assert ce(out, y).item() == pytest.approx(sum(per) / 2)


def test_mse_by_hand_one_output_and_several():
    mse = loss_fn("mse")
    out = torch.tensor([[1.0], [3.0]])
    y = torch.tensor([0.0, 1.0])  # [N] targets for a one-output model
    assert mse(out, y, reduction="none").tolist() == [1.0, 4.0]
    assert mse(out, y, reduction="sum").item() == 5.0
    assert mse(out, y).item() == 2.5
    out2, y2 = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.tensor([[0.0, 0.0], [1.0, 1.0]])
    assert mse(out2, y2, reduction="none").tolist() == [2.5, 1.0]
    assert mse(out2, y2).item() == pytest.approx(F.mse_loss(out2, y2).item())


def test_bce_logits_by_hand():
    bce = loss_fn("bce_logits")
    out = torch.tensor([[0.0, LN3], [0.0, 0.0]], dtype=torch.float64)
    y = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    # log(1 + e^-0) = ln 2 for a positive at logit 0; log(1 + e^ln3) = ln 4 for a negative
    assert bce(out, y, reduction="none").tolist() == pytest.approx([1.5 * LN2, LN2])
    assert bce(out, y).item() == pytest.approx(
        F.binary_cross_entropy_with_logits(out, y.double()).item()
    )


def test_top_k_and_accuracy_by_hand():
    out = torch.tensor([[0.1, 0.5, 0.3, 0.0], [0.9, 0.1, 0.0, 0.2], [0.0, 0.1, 0.2, 0.3]])
    y = torch.tensor([2, 0, 0])
    assert score("accuracy", out, y) == pytest.approx(1 / 3)  # only sample 1
    assert score("top2", out, y) == pytest.approx(2 / 3)  # 0 (rank 2) and 1
    assert score("top3", out, y) == pytest.approx(2 / 3)  # sample 2's label ranks 4th
    assert score("top9", out, y) == 1.0  # k above the classes: every label is hit


def test_macro_f1_single_label_by_hand():
    # predictions 0, 1, 1, 1 for labels 0, 0, 1, 2; class 3 in neither: left out
    out = torch.eye(4)[[0, 1, 1, 1]]
    y = torch.tensor([0, 0, 1, 2])
    f1 = [2 / 3, 2 / 4, 0.0]  # class 0: TP 1 FN 1; class 1: TP 1 FP 2; class 2: FN 1
    assert score("macro_f1", out, y) == pytest.approx(sum(f1) / 3)


def test_macro_f1_multi_label_by_hand():
    out = torch.tensor([[1.0, -1.0, 1.0], [-1.0, -1.0, 1.0]])  # predicted: logit > 0
    y = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 1.0]])
    # class 0: TP 1 FN 1 → 2/3; class 1: never true nor predicted (left out); class 2: TP 1
    # FP 1 → 2/3
    assert score("macro_f1", out, y) == pytest.approx(2 / 3)


def test_targets_of_the_wrong_size_are_refused_not_broadcast():
    with pytest.raises(ValueError, match="targets of shape"):
        loss_fn("mse")(torch.zeros(2, 3), torch.zeros(2))


def test_mse_metric_by_hand():
    assert score("mse", torch.tensor([[1.0], [3.0]]), torch.tensor([0.0, 1.0])) == 2.5


def test_lowest_loss_state_uses_the_run_loss():
    """IFCA's cluster choice under ``mse``: the state whose outputs are nearest the targets
    (under cross-entropy with these float targets the call would fail)."""
    model = torch.nn.Linear(1, 1, bias=False)
    x, y = torch.tensor([[1.0], [2.0]]), torch.tensor([2.0, 4.0])
    states = [{"weight": torch.tensor([[w]])} for w in (0.0, 2.0, 5.0)]
    assert lowest_loss_state(model, states, x, y, "mse") == 1


# -- optimisers ------------------------------------------------------------------------------
def _first_round(cfg):
    """(context, algorithm, start state, plan, round seed) of round 0, in float64."""
    prep = prepare(cfg, dtype=torch.float64)
    ctx, alg = prep.ctx, prep.algorithm
    start = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    plan = alg.plan_round(0, alg.select_clients(0, rng_for(cfg.seed, "select", 0)), rng_for(0, "p"))
    return ctx, alg, start, plan, derive_seed(cfg.seed, "b", 0)


def _one_client_round(algorithm: str, optimizer: str, **changes):
    """One round of ``algorithm`` with one client in float64; the updated state and what a
    plain torch loop (the whole model, one optimiser) gives from the same start."""
    recipe = {
        "model": "mlp",
        "data.partition": "iid",
        "data.num_clients": 4,
        "train.local_steps": 5,
        "train.lr": 0.01,
        "train.optimizer": optimizer,
        "train.weight_decay": 0.01,
        "train.beta1": 0.8,
        "train.beta2": 0.99,
    }
    changes = {**recipe, **changes, "train.clients_per_round": 1}
    cfg = as_config(tiny_config(algorithm=algorithm, **changes))
    ctx, alg, start, plan, seed = _first_round(cfg)
    result = SequentialExecutor().run_round(ctx, start, plan, seed)
    got = alg.aggregate(start, plan, result)

    (task,) = plan.tasks
    model = copy.deepcopy(ctx.model)
    model.load_state_dict(start)
    opt_cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW, "sgd": torch.optim.SGD}
    kwargs = {"betas": (0.8, 0.99)} if optimizer != "sgd" else {}
    opt = opt_cls[optimizer](model.parameters(), lr=0.01, weight_decay=0.01, **kwargs)
    x, y = ctx.bundle.train.x, ctx.bundle.train.y
    idx = ctx.client_indices[task.client]
    for batch in client_batches(idx, task.batch_size, task.steps, derive_seed(seed, task.client)):
        opt.zero_grad()
        loss_fn(cfg.train.loss)(model(x[batch]), y[batch]).backward()
        opt.step()
    return got, model.state_dict()


@pytest.mark.parametrize("optimizer", ["adam", "adamw"])
@pytest.mark.parametrize("algorithm", ["fedavg", "splitfed_v1"])
def test_adam_and_adamw_equal_a_plain_torch_loop(algorithm, optimizer):
    """A client's local round under Adam/AdamW equals ``torch.optim`` on the whole model —
    split too (the device and server parts' optimisers keep per-parameter state)."""
    got, want = _one_client_round(algorithm, optimizer)
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-12), k
    moved = _one_client_round(algorithm, "sgd")[0]
    assert not all(torch.allclose(got[k], moved[k]) for k in want)  # Adam is not SGD here


def test_regression_round_equals_a_plain_torch_loop():
    """``mse`` with Adam on the regression task: the same plain-loop equality."""
    got, want = _one_client_round("splitfed_v1", "adam", **REGRESSION)
    for k in want:
        assert torch.allclose(got[k], want[k], atol=1e-12), k


# -- executors agree -------------------------------------------------------------------------
@pytest.mark.parametrize("use_vmap", [True, False], ids=["vmap", "rows"])
@pytest.mark.parametrize(
    ("algorithm", "task"),
    [
        ("fedavg", {**REGRESSION, "train.optimizer": "adam", "train.weight_decay": 0.01}),
        ("splitfed_v1", {**REGRESSION, "train.optimizer": "adamw", "train.weight_decay": 0.1}),
        ("s2fl", {"train.optimizer": "adam", "train.weight_decay": 0.01}),
        ("mergesfl", {"train.optimizer": "adamw", "train.weight_decay": 0.1}),
        ("fedavg", {**REGRESSION, "train.momentum": 0.9}),
        ("splitfed_v1", {**REGRESSION, "train.momentum": 0.9}),
        ("splitfed_v1", {**MULTILABEL, "train.momentum": 0.9}),
        ("ringsfl", {**REGRESSION, "data.num_clients": 4, "train.clients_per_round": 4}),
    ],
)
def test_vectorized_equals_sequential_for_each_recipe(algorithm, task, use_vmap, monkeypatch):
    """The batched rows (split step, batched ring) compute the sequential executor's losses
    and updates under ``mse`` and ``bce_logits`` (float targets ``[rows, batch, ...]``) and
    with Adam/AdamW per row (:func:`~splitfl.executors.rowstack.adam_rows`), mixed cuts and
    several steps included (S²FL, MergeSFL)."""
    ctx, _, state, plan, seed = _first_round(as_config(config_for(algorithm, **task)))
    ref = SequentialExecutor().run_round(ctx, state, plan, seed)
    vectorized = VectorizedExecutor(use_vmap=use_vmap)
    got = vectorized.run_round(ctx, state, plan, seed)
    assert vectorized.fallbacks == 0  # the rows ran, not the reference loop
    for u, v in zip(ref.updates, got.updates, strict=True):
        assert u.loss_sum == pytest.approx(v.loss_sum, rel=1e-9)
        for k in u.state:
            assert torch.allclose(u.state[k], v.state[k], atol=1e-9), k


def test_non_finite_metrics_are_recorded_as_null():
    """A diverged model's loss and metrics are null, not NaN (metrics rows are strict JSON)."""

    class Diverged(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def forward(self, x):
            return torch.full((len(x), 3), math.nan) + self.w

    x, y = torch.zeros(4, 2), torch.tensor([0, 1, 2, 0])
    values = evaluate(Diverged(), x, y, 2, "cross_entropy", ["accuracy", "macro_f1"])
    assert values["loss"] is None and set(values) == {"loss", "accuracy", "macro_f1"}
    assert all(v is None or math.isfinite(v) for v in values.values())
    out = evaluate(Diverged(), x, torch.zeros(4, 3), 2, "mse", ["mse"])
    assert out == {"loss": None, "mse": None}


def test_the_recipe_imports_nothing_of_splitfl_but_itself():
    """``splitfl.training`` sits at the bottom: executors, algorithms, models and device
    processes all import it."""
    root = Path(splitfl.__file__).parent / "training"
    for path in root.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                assert not node.module.startswith("splitfl.") or node.module.startswith(
                    "splitfl.training"
                ), (path.name, node.module)


# -- whole runs ------------------------------------------------------------------------------
def _strict_rows(run_dir) -> list[dict]:
    def refuse(token):
        raise ValueError(f"non-strict JSON constant {token}")

    text = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line, parse_constant=refuse) for line in text]


@pytest.mark.parametrize("algorithm", ["fedavg", "splitfed_v1"])
@pytest.mark.parametrize(
    ("task", "metric"), [(REGRESSION, "mse"), (MULTILABEL, "macro_f1")], ids=["mse", "multi"]
)
def test_regression_and_multi_label_runs_end_to_end(algorithm, task, metric, tmp_path):
    changes = {**task, "train.optimizer": "adam", "output.plots": True}
    cfg = tiny_config(algorithm=algorithm, rounds=2, **changes)
    res = splitfl.run(cfg, run_dir=tmp_path / "r")
    rows = _strict_rows(res.run_dir)
    assert len(rows) == 2
    for row in rows:
        assert row["test_acc"] is None
        assert math.isfinite(row["test_loss"]) and math.isfinite(row[f"test_{metric}"])
    assert res.summary[f"final_{metric}"] == rows[-1][f"test_{metric}"]
    assert res.summary["final_loss"] == rows[-1]["test_loss"]
    assert res.wait_plots() and (res.run_dir / f"{metric}.png").is_file()
    if metric == "mse":  # the mse metric of a one-output regression is its mse loss
        assert rows[-1]["test_mse"] == pytest.approx(rows[-1]["test_loss"])


def test_networked_devices_train_with_the_recipe(tmp_path):
    """Device processes (threads here) train with the run's loss and optimiser: a networked
    regression run with Adam gives the sequential run's model."""
    devices = {"d0": [0, 3], "d1": [1, 4], "d2": [2, 5]}
    bed = Testbed.create(tmp_path / "bed", list(devices))
    threads = [bed.device(name, clients, retry_s=20.0) for name, clients in devices.items()]
    task = {**REGRESSION, "train.optimizer": "adam", "rounds": 2}
    net = splitfl.run(
        config_for("splitfed_v1", **task, **bed.server_overrides(min_devices=3)),
        run_dir=tmp_path / "net",
    )
    for t in threads:
        t.join(30)
    assert all(row["dropped_clients"] == [] for row in _strict_rows(net.run_dir))
    seq = splitfl.run(config_for("splitfed_v1", **task), run_dir=tmp_path / "seq")
    sgd = {**task, "train.optimizer": "sgd"}
    other = splitfl.run(config_for("splitfed_v1", **sgd), run_dir=tmp_path / "sgd")

    def gap(x, y) -> float:
        a, b = (torch.load(r.run_dir / "model.pt", weights_only=True) for r in (x, y))
        return max((a[k].double() - b[k].double()).abs().max().item() for k in a)

    # Adam's normalised steps turn fp32 rounding of tiny gradients into ~1e-5 differences
    # (SGD runs agree to 1e-8); another optimiser moves the model by far more
    assert gap(net, seq) <= 1e-3 < 1e-2 <= gap(seq, other)
    assert _strict_rows(net.run_dir)[-1]["test_mse"] == pytest.approx(
        _strict_rows(seq.run_dir)[-1]["test_mse"], rel=1e-3
    )


def test_classification_records_top_k_and_macro_f1(tmp_path):
    cfg = tiny_config(algorithm="fedavg", rounds=1, **{"eval.metrics": ["accuracy", "top3"]})
    cfg["eval"]["metrics"].append("macro_f1")
    row = _strict_rows(splitfl.run(cfg, run_dir=tmp_path / "c").run_dir)[0]
    assert 0 <= row["test_acc"] <= row["test_top3"] <= 1
    assert 0 <= row["test_macro_f1"] <= 1


# -- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("changes", "line"),
    [
        (
            {"algorithm": "s2fl", "data.partition": "iid", "train.loss": "mse"},
            "train.loss: s2fl's data-balance grouping (Eq. 2) needs class labels; "
            "use cross_entropy",
        ),
        (
            {"algorithm": "mergesfl", "data.partition": "iid", "train.loss": "bce_logits"},
            "train.loss: mergesfl's KL divergence of label distributions needs class labels; "
            "use cross_entropy",
        ),
        (
            {"algorithm": "parallelsfl", "data.partition": "iid", "train.loss": "mse"},
            "train.loss: parallelsfl's clustering by label distributions (KL) needs class "
            "labels; use cross_entropy",
        ),
        (
            {"algorithm": "fedavg", "train.loss": "mse", "eval.metrics": ["mse"]},
            "data.partition: dirichlet deals samples by class label and train.loss: mse has "
            "none; use iid",
        ),
        (
            {"algorithm": "fedavg", "data.partition": "iid", "train.loss": "mse"},
            "eval.metrics: accuracy needs train.loss: cross_entropy (got mse); use loss or mse",
        ),
        (
            {"eval.metrics": ["loss"], "eval.target_accuracy": 0.5},
            "eval.target_accuracy: needs accuracy in eval.metrics; use null",
        ),
        ({"train.loss": "hinge"}, "train.loss: unknown 'hinge'; allowed: cross_entropy, mse"),
        ({"train.optimizer": "rmsprop"}, "train.optimizer: unknown 'rmsprop'; allowed: sgd"),
        ({"eval.metrics": ["top0"]}, "eval.metrics: unknown 'top0'; allowed: accuracy"),
        ({"train.beta2": 1.0}, "train.beta2: must be < 1"),
        ({"eval.metrics": []}, "eval.metrics: a non-empty list without repeats"),
    ],
)
def test_recipe_refusals_are_one_line(changes, line):
    with pytest.raises(ConfigError) as err:
        check_config(as_config(tiny_config(**changes)))
    assert str(err.value).startswith(line)
    assert "\n" not in str(err.value)


def test_ringsfl_refuses_adam(tmp_path):
    cfg = config_for("ringsfl", **{"train.optimizer": "adam"})
    with pytest.raises(ConfigError, match=r"^train.optimizer: RingSFL trains with plain SGD"):
        splitfl.run(cfg, run_dir=tmp_path / "r")


def test_targets_that_do_not_fit_the_loss_are_one_line(tmp_path):
    """Class labels under ``mse`` (the partition is fine, the targets are not)."""
    cfg = tiny_config(
        algorithm="fedavg",
        **{"data.partition": "iid", "train.loss": "mse", "eval.metrics": ["mse"]},
    )
    with pytest.raises(ConfigError, match=r"^train.loss: mse needs float targets"):
        splitfl.run(cfg, run_dir=tmp_path / "x")


def test_checkpoints_from_before_the_recipe_fields_resume():
    """A checkpoint written before ``train.loss``/``optimizer``/``eval.metrics`` existed
    lacks them in its identity; at their defaults the run is the same run (a resume was
    refused: "the config differs in eval.metrics ("<unset>" vs ["accuracy"]) ...")."""
    config = as_config(tiny_config())
    recipe = ("train.loss", "train.optimizer", "train.beta1", "train.beta2", "train.eps")
    old = {k: v for k, v in run_identity(config).items() if k not in (*recipe, "eval.metrics")}
    stored = {"config": json.dumps(old, sort_keys=True), "sha256": "from an older version"}
    assert identity_mismatch(stored, config) is None
    changed = as_config(tiny_config(**{"train.optimizer": "adam"}))
    assert "train.optimizer" in identity_mismatch(stored, changed)

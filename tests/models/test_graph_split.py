"""Ordinary ``nn.Module`` models split by their graph (``splitfl.models.graph``): the device
part then the server part compute what the user's model computes — forward and gradients, in
train and eval mode, at several batch sizes — whatever crosses the cut; bad cuts are one line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from test_models import input_shape
from torch import fx

import graph_models as gm
import splitfl
from splitfl.algorithms import algorithm_names
from splitfl.core.activations import as_server_input, backward, input_grad, leaves
from splitfl.experiment.runner import as_config, prepare
from splitfl.models import build_model, model_names
from splitfl.models import graph as graph_mod
from splitfl.models.base import split, user_state_dict
from splitfl.models.graph import GraphSplitError, graph_block_model
from splitfl.models.registry import Split, make_model
from splitfl.models.tracing import ModeGraphModule
from splitfl.privacy.attack import dlg_attack
from splitfl.privacy.observe import observe_ringsfl
from splitfl.testing import config_for

HERE = str(Path(__file__).parents[1])

IMAGE = (1, 8, 8)
CASES = {
    # name: (builder, input shape, cut points (None: the default), cuts whose value is a tuple)
    "small_resnet": (gm.small_resnet, IMAGE, None),
    "resnet18": (gm.resnet18, (3, 16, 16), ["maxpool", "layer1", "layer2", "layer3", "layer4"]),
    "resnet18_default": (gm.resnet18, (3, 16, 16), None),
    "mobilenet": (gm.mobilenet, IMAGE, ["features.0", "features.2", "before:classifier"]),
    "unet": (gm.unet, IMAGE, None),
    "text": (gm.text_classifier, (12,), None),
    # forwards fx cannot trace as a whole (issue 48, item 7): int() on sizes in submodules
    # (run whole), self.training read outside module calls (one graph per mode), control flow
    # on a tensor in a submodule (run whole)
    "shufflenet": (gm.shufflenet, (3, 32, 32), None),
    "efficientnet": (gm.efficientnet, (3, 8, 8), None),
    "mode_flag": (gm.mode_flag, IMAGE, None),
    "gated": (gm.gated, IMAGE, None),
}


def _inputs(shape, batch, seed):
    g = torch.Generator().manual_seed(seed)
    if shape == (12,):  # token ids, some of them padding (0)
        ids = torch.randint(1, 50, (batch, 12), generator=g)
        ids[:, 9:] = 0
        return ids
    return torch.randn(batch, *shape, generator=g, dtype=torch.float64)


def _split_step(model, cut, x):
    """As split learning runs it: the device forward, the server's forward and backward
    from a detached copy, the activation gradient back through the device part."""
    device, server = split(model, cut)
    sent = device(x)
    received = as_server_input(sent)
    out = server(received, start=cut)
    out.sum().backward()
    backward(sent, input_grad(received))
    return out


def _grads(module, names=lambda state: state):
    got = {k: p.grad for k, p in module.named_parameters()}
    return names(got)


@pytest.mark.parametrize("case", sorted(CASES))
def test_device_then_server_equals_the_model(case):
    builder, shape, cut_points = CASES[case]
    torch.manual_seed(0)
    user = builder(shape, 3).double()
    reference = copy.deepcopy(user)
    model = copy.deepcopy(graph_block_model(user, shape, case, cut_points))  # as executors do
    user = None  # the copy holds its own modules
    assert model.num_blocks >= (2 if case == "mode_flag" else 3) and model.origin == "graph"
    assert model.input_dtype == (torch.int64 if case == "text" else torch.float64)
    for mode in (True, False):
        model.train(mode)
        reference.train(mode)
        for batch in (2, 3, 5):  # MergeSFL's regulated batches differ per worker
            x = _inputs(shape, batch, seed=batch)
            for cut in model.cut_points:
                model.zero_grad(set_to_none=True)
                reference.zero_grad(set_to_none=True)
                torch.manual_seed(cut)  # dropout draws the same stream in both
                want = reference(x)
                want.sum().backward()
                torch.manual_seed(cut)
                got = _split_step(model, cut, x)
                assert torch.equal(got, want), (case, mode, batch, cut)
                ours = _grads(model, lambda g: user_state_dict(model, g))
                theirs = _grads(reference)
                assert ours.keys() == theirs.keys()
                for k in theirs:
                    if theirs[k] is None:
                        assert ours[k] is None, k
                    else:
                        torch.testing.assert_close(ours[k], theirs[k], rtol=0, atol=1e-12)
                # BatchNorm's running statistics and step counts, after a step in each mode
                ours, theirs = user_state_dict(model, model.state_dict()), reference.state_dict()
                assert ours.keys() == theirs.keys()
                assert all(torch.equal(ours[k], theirs[k]) for k in theirs), (case, mode, cut)
    # the trained weights load back into the user's own class
    fresh = builder(shape, 3).double()
    fresh.load_state_dict(user_state_dict(model, model.state_dict()), strict=True)


def test_a_skip_crossing_the_cut_is_a_tuple_of_tensors():
    model = graph_block_model(gm.unet(IMAGE, 10), IMAGE, "unet")
    assert model.cut_names == ("down", "mid", "up")
    device, _ = split(model, 2)  # after mid: mid's output and down's skip cross
    sent = device(torch.randn(4, *IMAGE))
    assert isinstance(sent, tuple) and [t.shape for t in sent] == [(4, 4, 8, 8)] * 2


def test_a_padding_mask_crosses_as_bool_and_gets_no_gradient():
    model = graph_block_model(gm.text_classifier((12,), 2), (12,), "text")
    assert model.cut_names[0] == "embed"
    device, _ = split(model, 1)
    ids = _inputs((12,), 3, 0)
    sent = device(ids)
    assert [t.dtype for t in leaves(sent)] == [torch.bool, torch.float32]
    received = as_server_input(sent)
    assert [t.requires_grad for t in received] == [False, True]


def test_cuts_named_by_module_before_and_after():
    model = graph_block_model(gm.small_resnet(IMAGE, 10), IMAGE, "r", ["layer1", "before:fc"])
    assert model.cut_names == ("layer1", "before:fc") and model.num_blocks == 3
    assert model.default_cut == 2
    model = graph_block_model(gm.small_resnet(IMAGE, 10), IMAGE, "r", None, "layer2")
    assert model.default_cut == model.cut_names.index("layer2") + 1


def test_what_fx_cannot_trace_runs_whole_and_each_mode_has_its_graph():
    """ShuffleNetV2's shuffle and split (``int()`` on a size) are called as modules; the
    EfficientNet pieces hold one graph per mode: train mode draws drop-connect and dropout
    masks (two seeds differ), eval mode does not — also in a deep copy, as executors use."""
    shuffle = graph_block_model(gm.shufflenet((3, 32, 32), 10), (3, 32, 32), "s")
    calls = {n.target for b in shuffle.blocks for n in b.graph.nodes if n.op == "call_module"}
    assert {"layer1.0.shuffle", "layer1.1.split", "layer3.1.shuffle"} <= calls
    assert not any(isinstance(b, ModeGraphModule) for b in shuffle.blocks)
    assert shuffle.cut_names[:3] == ("conv1", "bn1", "layer1")
    torch.manual_seed(0)
    model = copy.deepcopy(graph_block_model(gm.efficientnet((3, 16, 16), 10), (3, 16, 16), "e"))
    assert all(isinstance(b, ModeGraphModule) for b in model.blocks)
    assert model.cut_names == ("conv1", "bn1", "layers")  # after linear nothing runs
    x = torch.randn(4, 3, 16, 16)

    def seeded(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        with torch.no_grad():
            return model(x)

    model.train()
    draws = [seeded(seed) for seed in (0, 1, 0)]
    assert not torch.equal(draws[0], draws[1]) and torch.equal(draws[0], draws[2])
    model.eval()
    assert torch.equal(seeded(0), seeded(1))


def test_cut_inside_a_module_that_runs_whole_says_so():
    with pytest.raises(GraphSplitError, match=r"inside 'inner', which runs whole\)$"):
        graph_block_model(gm.gated(IMAGE, 10), IMAGE, "g", ["inner.fc"])


ERRORS = {
    "tied": (gm.tied, ["first"], r"^t: parameter first\.weight is used on both sides of cut"),
    # the model's own forward: a branch on a tensor's value, int() on a size
    "data_dependent": (
        gm.data_dependent,
        None,
        r"^t cannot be traced by torch\.fx: symbolically traced variables cannot be used as "
        r"inputs to control flow \(in the model's own forward",
    ),
    "counted": (gm.counted, None, r"^t cannot be traced by torch\.fx: int\(\) argument must be"),
    "mode_skip": (
        gm.mode_skip,
        ["a"],
        r"^t: cut 'a' is not a split point: what crosses it differs between train mode "
        r"\(2 values\) and eval mode \(1\)$",
    ),
    "mode_skip_all": (
        gm.mode_skip,
        None,
        r"^t: no top-level child is a split point \(after 'a': what crosses it differs between "
        r"train mode \(2 values\) and eval mode \(1\)\)$",
    ),
    "no_module": (gm.unet, ["nope"], r"^t: cut 'nope': no module 'nope' runs in forward$"),
    "last": (gm.unet, ["head"], r"^t: cut 'head' is not a split point: nothing runs after it$"),
    "syntax": (gm.unet, ["sideways:up"], r"^cut 'sideways:up': write MODULE, after:MODULE"),
    "order": (gm.unet, ["mid", "mid"], r"^t: cut points \['mid', 'mid'\] must name distinct"),
}


@pytest.mark.parametrize("case", sorted(ERRORS))
def test_what_cannot_be_split_is_one_line(case):
    builder, cut_points, message = ERRORS[case]
    with pytest.raises(GraphSplitError, match=message) as err:
        graph_block_model(builder(IMAGE, 10), IMAGE, "t", cut_points)
    assert "\n" not in str(err.value)


def test_a_value_without_the_batch_dimension_cannot_cross():
    class Counter(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(64, 8)
            self.b = torch.nn.Linear(8, 10)

        def forward(self, x):
            n = x.shape[0]
            h = self.a(x.flatten(1))
            return self.b(h) / n

    with pytest.raises(GraphSplitError, match=r"a value that is not a tensor \(getitem\)"):
        graph_block_model(Counter(), IMAGE, "c", ["a"])


# -- whole runs ------------------------------------------------------------------------------


def test_a_run_gives_back_the_users_weights_and_records_its_inputs(tmp_path):
    config = config_for(
        "s2fl",
        rounds=2,
        model="graph_models:small_resnet",
        import_dirs=[HERE],
        **{"split.cut_points": ["layer1", "layer2", "layer3"], "split.cut": "layer2"},
    )
    run = splitfl.run(config, run_dir=tmp_path / "run")
    state = torch.load(run.run_dir / "model.pt", weights_only=True)
    fresh = gm.small_resnet(IMAGE, 10)
    fresh.load_state_dict(state, strict=True)  # the user's own class, the user's own names
    record = json.loads((run.run_dir / "data.json").read_text())
    assert record["input_shape"] == [1, 8, 8] and record["input_dtype"] == "float32"
    assert record["cut_points"] == ["layer1", "layer2", "layer3"]
    assert record["parameter_names"] == "user"


def test_a_sequential_gives_back_its_own_names(tmp_path):
    """An ``nn.Sequential`` from the user: ``model.pt`` loads into it (no ``blocks.`` prefix)."""
    examples = Path(__file__).parents[2] / "examples" / "own_model_and_data"
    config = config_for(
        "fedavg", rounds=1, model="my_project:small_cnn", import_dirs=[str(examples)]
    )
    run = splitfl.run(config, run_dir=tmp_path / "run")
    import my_project  # importable once the run has put the example's folder on sys.path

    model = my_project.small_cnn((1, 8, 8), 10)
    model.load_state_dict(torch.load(run.run_dir / "model.pt", weights_only=True), strict=True)


def _token_npz(folder: Path, n_train: int = 96, n_test: int = 32) -> Path:
    """Token-id sequences (int32 in the file) whose class is whether token 7 occurs."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for name, n in (("train", n_train), ("test", n_test)):
        x = rng.integers(1, 50, (n, 12)).astype(np.int32)
        x[:, 9:] = 0  # padding
        y = (x == 7).any(1).astype(np.int64)
        np.savez(folder / f"{name}.npz", x=x, y=y)
    return folder


def _image_npz(folder: Path, shape, n_train: int = 48, n_test: int = 16) -> Path:
    """Random images whose class is the sign of their mean."""
    rng = np.random.default_rng(0)
    folder.mkdir(parents=True)
    for name, n in (("train", n_train), ("test", n_test)):
        x = rng.normal(size=(n, *shape)).astype(np.float32)
        np.savez(folder / f"{name}.npz", x=x, y=(x.mean((1, 2, 3)) > 0).astype(np.int64))
    return folder


@pytest.mark.parametrize(
    ("builder", "shape"), [("shufflenet", (3, 32, 32)), ("efficientnet", (3, 16, 16))]
)
def test_published_cifar_patterns_validate_and_train_one_round(tmp_path, builder, shape, capsys):
    """``model: graph_models:shufflenet`` / ``:efficientnet`` as users bring them: validate
    offers the cut points, one round of SplitFed-V1 trains (finite loss) and ``model.pt``
    loads into the user's class with its own names."""
    from splitfl.cli.main import main

    root = _image_npz(tmp_path / "images", shape)
    config = config_for(
        "splitfed_v1",
        rounds=1,
        model=f"graph_models:{builder}",
        import_dirs=[HERE],
        **{"data.dataset": "images", "data.format": "npz", "data.root": str(root)},
        **{"data.num_clients": 4, "train.clients_per_round": 2, "data.min_samples": 4},
    )
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["validate", str(path)]) == 0
    line = capsys.readouterr().out
    assert line.startswith("ok: splitfed_v1") and f"graph_models:{builder} (" in line
    prep = prepare(as_config(config))
    assert len(prep.ctx.model.cut_names) == len(prep.ctx.model.cut_points) >= 3
    model = prep.ctx.model  # validate names each cut point by its module path
    names = dict(zip(model.cut_points, model.cut_names, strict=True))
    assert f"cut points [{', '.join(f'{c} ({names[c]})' for c in model.cut_points)}]" in line
    run = splitfl.run(config, run_dir=tmp_path / "run")
    assert len(run.metrics) == 1 and np.isfinite(run.metrics[0]["train_loss"])
    fresh = getattr(gm, builder)(shape, 2)
    fresh.load_state_dict(torch.load(run.run_dir / "model.pt", weights_only=True), strict=True)
    recorded = json.loads((run.run_dir / "data.json").read_text())["cut_points"]
    assert recorded == list(prep.ctx.model.cut_names)


@pytest.mark.parametrize("algorithm", ["mergesfl", "splitfed_v1"])
def test_token_ids_stay_integers_end_to_end(tmp_path, algorithm):
    """int64 token ids reach an ``nn.Embedding`` on the device; the padding mask crosses the
    cut as bool; sequential and vectorised (rows) runs agree."""
    root = _token_npz(tmp_path / "tokens")
    config = config_for(
        algorithm,
        rounds=2,
        model="graph_models:text_classifier",
        import_dirs=[HERE],
        **{"data.dataset": "tokens", "data.format": "npz", "data.root": str(root)},
        **{"data.num_clients": 6, "train.clients_per_round": 3, "split.cut": "embed"},
    )
    prep = prepare(as_config(config))
    assert prep.ctx.bundle.train.x.dtype == torch.int64
    assert prep.ctx.model.default_cut == 1
    run = splitfl.run(config, run_dir=tmp_path / "run")
    assert json.loads((run.run_dir / "data.json").read_text())["input_dtype"] == "int64"
    assert len(run.metrics) == 2 and all(np.isfinite(r["train_loss"]) for r in run.metrics)
    fresh = gm.text_classifier((12,), 2)
    fresh.load_state_dict(torch.load(run.run_dir / "model.pt", weights_only=True), strict=True)


def test_image_folder_class_names_are_recorded(tmp_path):
    from fixtures_data import image_folder

    image_folder(tmp_path / "images")
    config = config_for(
        "fedavg",
        rounds=1,
        model="graph_models:small_resnet",
        import_dirs=[HERE],
        **{"data.dataset": "pets", "data.format": "image_folder"},
        **{"data.root": str(tmp_path / "images"), "data.num_clients": 2},
        **{"train.clients_per_round": 2, "data.min_samples": 1},
    )
    run = splitfl.run(config, run_dir=tmp_path / "run")
    record = json.loads((run.run_dir / "data.json").read_text())
    assert record["class_names"] == ["cat", "dog"] and record["input_shape"] == [3, 6, 6]


def test_ring_eavesdropper_and_dlg_run_on_a_graph_split_model():
    """RingSFL §4.2.5's attack on a model whose ring boundary carries two tensors: the
    observed pseudo-gradient is what a ring over the graph pieces uploads, and DLG attacks
    the pieces as one model."""
    torch.manual_seed(0)
    model = graph_block_model(gm.unet(IMAGE, 10), IMAGE, "unet", ["down", "mid", "up"])
    xs, ys = torch.rand(2, *IMAGE), torch.tensor([3, 5])
    grads = observe_ringsfl(model, xs, ys, [2, 2], lr=0.1)
    assert set(grads) == {k for k, p in model.named_parameters()}
    assert all(torch.isfinite(g).all() for g in grads.values())
    result = dlg_attack(model, grads, IMAGE, 10, iterations=2, true_x=xs[:1], optimizer="adam")
    assert len(result.cosine_history) == 2 and all(np.isfinite(result.cosine_history))


@pytest.mark.parametrize("name", sorted(set(model_names()) - {"vgg16", "vgg16_image100"}))
def test_zoo_device_then_server_equals_the_model(name):
    """Every zoo model (block lists) through the split-learning step — device forward, the
    server from a detached copy, the activation gradient back — equals the model in float64,
    forward and gradients, train and eval mode, batches of 2 and 3 (models over 2M parameters:
    batch 2 at their middle cut; VGG-16 at 134M / ImageNet-100 sizes: test_models checks
    their forward at one cut)."""
    torch.manual_seed(0)
    shape = input_shape(name)
    model = build_model(name, shape, 10).double()
    reference = copy.deepcopy(model)
    heavy = sum(p.numel() for p in model.parameters()) > 2_000_000  # AlexNet, VGG-16 (CIFAR)
    cuts = model.cut_points[1:2] if heavy else model.cut_points
    assert cuts
    for mode in (True, False):
        model.train(mode)
        reference.train(mode)
        for batch in (2,) if heavy else (2, 3):
            x = _inputs(shape, batch, seed=batch)
            if name == "transformer":  # hashed token ids, given as floats (the zoo model rounds)
                x = torch.randint(0, 100, (batch, *shape)).double()
            for cut in cuts:
                model.zero_grad(set_to_none=True)
                reference.zero_grad(set_to_none=True)
                torch.manual_seed(cut)
                want = reference(x)
                want.sum().backward()
                torch.manual_seed(cut)
                got = _split_step(model, cut, x)
                torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
                for (k, p), (_, q) in zip(
                    model.named_parameters(), reference.named_parameters(), strict=True
                ):
                    if q.grad is None:
                        assert p.grad is None, k
                    else:
                        torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=1e-12)


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_every_algorithm_trains_a_graph_split_model(algorithm, tmp_path):
    """One round of each algorithm on the U-Net at the cut where two tensors cross (RingSFL:
    its segments are the pieces between the three candidates): finite losses, and the run's
    model loads back into the user's class."""
    cuts = ["down", "mid", "up"] if algorithm.startswith("ringsfl") else ["mid", "up"]
    config = config_for(
        algorithm,
        rounds=1,
        model="graph_models:unet",
        import_dirs=[HERE],
        **{"split.cut_points": cuts, "split.cut": "mid"},
    )
    run = splitfl.run(config, run_dir=tmp_path / "run")
    losses = [r["train_loss"] for r in run.metrics if r["train_loss"] is not None]
    assert losses and all(np.isfinite(losses))
    fresh = gm.unet(IMAGE, 10)
    fresh.load_state_dict(torch.load(run.run_dir / "model.pt", weights_only=True), strict=True)


def test_dropout_in_a_graph_split_model_reruns_bit_identically(tmp_path):
    """The pieces' nn.Dropout draws from the run's seeded streams: a rerun is identical."""
    config = config_for(
        "splitfed_v1",
        rounds=2,
        model="graph_models:small_resnet",
        import_dirs=[HERE],
        **{"split.cut": "layer2"},
    )
    a, b = (splitfl.run(config, run_dir=tmp_path / name) for name in ("a", "b"))
    sa, sb = (torch.load(r.run_dir / "model.pt", weights_only=True) for r in (a, b))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert len(a.metrics) == 2
    assert [r["train_loss"] for r in a.metrics] == [r["train_loss"] for r in b.metrics]


def test_a_builder_is_traced_once_per_process_and_each_build_draws_its_own_weights(monkeypatch):
    """symbolic_trace patches torch.nn.Module.__call__ process-wide while it runs (a forward
    in another thread would be recorded): a process traces each builder once, and devices in
    threads of the server's process reuse that trace. Weights still come from each build."""
    calls = []
    real = fx.Tracer.trace
    monkeypatch.setattr(fx.Tracer, "trace", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(graph_mod, "_TRACES", {})

    def builder(input_shape, num_classes):
        return gm.UNet(num_classes, input_shape[0])

    split_at = Split(("mid", "up"), "mid")
    torch.manual_seed(0)
    a = make_model(builder, "u", IMAGE, 10, split_at)
    torch.manual_seed(1)
    b = make_model(builder, "u", IMAGE, 10, split_at)
    assert len(calls) == 2  # one builder: traced once, in train and in eval mode
    assert a.cut_names == b.cut_names == ("mid", "up") and a.default_cut == b.default_cut == 1
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and not torch.equal(
        sa["blocks.0.down.0.weight"], sb["blocks.0.down.0.weight"]
    )
    x = torch.randn(3, *IMAGE)
    b.load_state_dict(sa)
    assert torch.equal(a.eval()(x), b.eval()(x))

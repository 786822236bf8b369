"""Issue 52 item 4: ``splitfl validate`` lists, per cut point, every tensor that crosses (name,
shape, dtype) for block and graph models, and warns in one line when the model's raw input (or
a slice of it: computed without any parameter) crosses a cut to the server."""

from __future__ import annotations

import warnings

import pytest
import torch

from splitfl.cli.main import main
from splitfl.experiment import validate
from splitfl.extensions import build_model
from splitfl.models.crossing import RawInputWarning, input_name, what_crosses
from splitfl.testing import tiny_config

CONFIG = {"rounds": 2, "algorithm": "splitfed_v1", "imports": ["graph_models"]}


def _lines(model: str, **changes):
    """validate's crossing lines and the warnings it raised."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = validate(tiny_config(**CONFIG, model=model, **changes))
    lines = [line for line in out.splitlines() if line.startswith("cut ")]
    return lines, [str(w.message) for w in seen if w.category is RawInputWarning]


def test_a_slice_of_the_input_used_after_the_cut_is_named_in_a_warning():
    lines, said = _lines("graph_models:corner_after")
    # digits: 1x8x8 images, batch 16; the corner x[:, 0, :2, :2].flatten(1) is [16, 4]
    assert lines == [
        "cut 1 (conv) sends flatten [16, 4] float32, conv [16, 4, 8, 8] float32",
        "cut 2 (pool) sends flatten [16, 4] float32, pool [16, 4, 2, 2] float32",
    ]
    assert said == [
        f"cut {c}: the model's input x crosses to the server as flatten [16, 4] float32 "
        "(computed from the input without any parameter): the server sees raw input data"
        for c in ("1 (conv)", "2 (pool)")
    ]


def test_the_input_itself_crossing_is_named():
    lines, said = _lines("graph_models:input_after", **{"train.batch_size": 8})
    assert lines[0] == "cut 1 (conv) sends x [8, 1, 8, 8] float32, conv [8, 4, 8, 8] float32"
    assert len(said) == 2 and all(" as x [8, 1, 8, 8] float32 " in s for s in said)


@pytest.mark.parametrize("model", ["cnn_digits", "graph_models:small_resnet", "mlp"])
def test_a_normal_model_sends_smashed_data_only(model):
    lines, said = _lines(model)
    assert lines and said == []


def test_block_model_listing_has_the_hand_known_shapes():
    lines, _ = _lines("cnn_digits")  # conv 16, 32, 64 channels, halving 8x8 after the first
    assert lines == [
        "cut 1 sends output [16, 16, 8, 8] float32",
        "cut 2 sends output [16, 32, 4, 4] float32",
        "cut 3 sends output [16, 64, 2, 2] float32",
    ]


def test_several_tensors_and_int_inputs():
    # U-Net: the skip d and mid's output cross a cut after mid
    unet = build_model("graph_models:unet", (1, 8, 8), 10, split=_split(["down", "mid"]))
    (down, mid) = what_crosses(unet, torch.rand(3, 1, 8, 8))
    # fx names the values by the module call that made them (down.1: the BatchNorm; mid.2)
    assert [str(t) for t in down.tensors] == ["down_1 [3, 4, 8, 8] float32"]
    assert [str(t) for t in mid.tensors] == [
        "down_1 [3, 4, 8, 8] float32",
        "mid_2 [3, 4, 8, 8] float32",
    ]
    assert not any(t.raw for t in (*down.tensors, *mid.tensors))
    # token ids: the padding mask ids == 0 is computed from the input alone
    text = build_model("graph_models:text_classifier", (12,), 2, split=_split(["embed"]))
    (cut,) = what_crosses(text, torch.randint(0, 50, (2, 12)))
    got = {t.name: (t.shape, t.dtype, t.raw) for t in cut.tensors}
    assert got["eq"] == ((2, 12), torch.bool, True)
    assert got["embed"] == ((2, 12, 16), torch.float32, False)
    assert input_name(text) == "ids"


def test_a_block_that_passes_the_input_on_is_caught_by_value():
    from torch import nn

    from splitfl.models import BlockModel

    class PassOn(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x), x

    class Head(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 2)

        def forward(self, h, x):
            return self.lin(torch.cat([h, x], 1))

    (cut,) = what_crosses(BlockModel([PassOn(), Head()], [1]), torch.rand(5, 4))
    assert [(str(t), t.raw) for t in cut.tensors] == [
        ("output.0 [5, 4] float32", False),
        ("output.1 [5, 4] float32", True),
    ]


def test_the_command_prints_one_warning_line(capsys, tmp_path):
    import json

    config = tiny_config(**CONFIG, model="graph_models:corner_after")
    (tmp_path / "c.json").write_text(json.dumps(config))
    assert main(["validate", str(tmp_path / "c.json")]) == 0
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("warning: cut ") for line in err), err
    assert "cut 1 (conv) sends flatten [16, 4] float32" in captured.out


def _split(points):
    from splitfl.models.registry import Split

    return Split(cut_points=tuple(points), cut=None)

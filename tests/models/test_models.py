"""Model zoo, block splitting and cost profiling."""

from __future__ import annotations

from collections import Counter
from functools import cache

import pytest
import torch
from torch import nn

from splitfl.models.base import BlockModel, ModelPart, block_index, split
from splitfl.models.profile import PROFILE_BATCH, measure_profile, profile_model
from splitfl.models.registry import build_model, model_names

DIGITS = {"mlp", "cnn_digits"}
MNIST = {"lenet5", "alexnet_mnist"}
GIANT = {"vgg16"}  # ~134M parameters: one cut only

NUM_BLOCKS = {
    "resnet8": 5,
    "resnet18": 10,
    "vgg16": 16,
    "vgg16_cifar": 16,
    "mobilenet": 15,
    "lenet5": 12,
    "alexnet": 8,
    "alexnet_mnist": 17,
}

NUM_PARAMS = {  # 10 classes; known totals of the reference architectures
    "resnet18": 11_173_962,
    "vgg16": 134_309_962,  # torchvision vgg16_bn with a 10-way classifier
    "mobilenet": 3_217_226,
    "lenet5": 61_706,
}


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """Batch-2 forwards gain nothing from threads, and stay fast on a loaded 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


SHAPES = {
    "cnn_h": (1, 128, 9),  # MergeSFL
    "cnn_s": (1, 16000),  # MergeSFL
    "vgg16_image100": (3, 64, 64),  # MergeSFL
    "transformer": (64,),  # token ids (QNLI)
}


def input_shape(name: str) -> tuple[int, ...]:
    if name in SHAPES:
        return SHAPES[name]
    if name in DIGITS:
        return (1, 8, 8)
    if name in MNIST:
        return (1, 28, 28)
    return (3, 32, 32)


@cache
def built(name: str) -> BlockModel:
    torch.manual_seed(0)
    return build_model(name, input_shape(name), 10).eval()


def test_zoo_registers_every_model():
    assert set(NUM_BLOCKS) | DIGITS <= set(model_names())


@pytest.mark.parametrize("name", sorted(NUM_BLOCKS))
def test_block_counts(name):
    assert built(name).num_blocks == NUM_BLOCKS[name]


@pytest.mark.parametrize("name", sorted(NUM_PARAMS))
def test_parameter_totals(name):
    assert sum(p.numel() for p in built(name).parameters()) == NUM_PARAMS[name]


@pytest.mark.parametrize("name", model_names())
def test_cut_points_are_three_increasing(name):
    model = built(name)
    cuts = model.cut_points
    assert len(cuts) == 3
    assert list(cuts) == sorted(set(cuts))
    assert 1 <= cuts[0] and cuts[-1] <= model.num_blocks - 1


@pytest.mark.parametrize("name", model_names())
def test_split_composes_to_whole_model(name):
    model = built(name)
    n = model.num_blocks
    torch.manual_seed(1)
    x = torch.randn(2, *input_shape(name))
    with torch.no_grad():
        full = model(x)
        assert full.shape == (2, 10)
        cuts = [model.cut_points[1]] if name in GIANT else sorted({1, *model.cut_points, n - 1})
        for cut in cuts:
            device, server = split(model, cut)
            assert torch.equal(server(device(x)), full), f"cut {cut}"
            assert torch.equal(model(device(x), start=cut), full)
            _check_parameter_partition(model, device, server, cut)


def _check_parameter_partition(model, device, server, cut):
    whole = Counter(name for name, _ in model.named_parameters())
    dev = Counter(name for name, _ in device.named_parameters())
    srv = Counter(name for name, _ in server.named_parameters())
    assert dev + srv == whole
    assert not set(dev) & set(srv)
    assert all(block_index(k) < cut for k in dev)
    assert all(block_index(k) >= cut for k in srv)
    count = sum(p.numel() for p in model.parameters())
    assert (
        sum(p.numel() for p in device.parameters()) + sum(p.numel() for p in server.parameters())
        == count
    )
    # state dicts (buffers included) are keyed by the whole model's names
    assert set(device.state_dict()) | set(server.state_dict()) == set(model.state_dict())
    whole_state = model.state_dict()
    for key, value in device.state_dict().items():
        assert torch.equal(value, whole_state[key])


def test_whole_model_on_device():
    model = built("resnet8")
    device, server = split(model, model.num_blocks)
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(server(device(x)), model(x))
    assert not list(server.parameters())


@pytest.mark.parametrize("name", sorted(set(model_names()) - GIANT))
def test_deterministic_given_seed(name):
    states = []
    for _ in range(2):
        torch.manual_seed(123)
        states.append(build_model(name, input_shape(name), 10).state_dict())
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


@pytest.mark.parametrize(
    "name",
    ["resnet8", "resnet18", "vgg16_cifar", "mobilenet", "alexnet", "lenet5", "alexnet_mnist"],
)
def test_grey_28x28_inputs(name):
    """FEMNIST-like input: 1×28×28, 62 classes."""
    torch.manual_seed(0)
    model = build_model(name, (1, 28, 28), 62).eval()
    with torch.no_grad():
        assert model(torch.randn(2, 1, 28, 28)).shape == (2, 62)


def test_layer_facts():
    # flatten sizes from the input shape
    assert built("lenet5").blocks[7].in_features == 16 * 5 * 5
    assert built("alexnet_mnist").blocks[12].in_features == 256 * 3 * 3 == 2304
    assert built("alexnet").blocks[5][2].in_features == 256 * 4 * 4
    assert built("vgg16").blocks[13][2].in_features == 25088
    assert built("vgg16_cifar").blocks[13][1].in_features == 512
    # one layer per block where the reference has it
    assert all(not isinstance(b, nn.Sequential) for b in built("lenet5").blocks)
    assert all(not isinstance(b, nn.Sequential) for b in built("alexnet_mnist").blocks)
    # MergeSFL splits AlexNet after the 5 convs
    assert 5 in built("alexnet").cut_points
    # the activation sent at the MergeSFL cut is 256×4×4
    with torch.no_grad():
        smashed = built("alexnet")(torch.zeros(1, 3, 32, 32), stop=5)
    assert smashed.shape == (1, 256, 4, 4)
    # MobileNet uses depthwise convolutions
    dw = built("mobilenet").blocks[1][0]
    assert dw.groups == dw.in_channels == 32


def test_ringsfl_init():
    bn = built("resnet18").blocks[0][1]
    assert torch.equal(bn.weight, torch.ones_like(bn.weight))
    assert torch.equal(bn.bias, torch.zeros_like(bn.bias))
    fc = built("vgg16").blocks[15]
    assert torch.equal(fc.bias, torch.zeros_like(fc.bias))
    assert 0.008 < fc.weight.std().item() < 0.012
    conv = built("vgg16").blocks[12][0]  # Kaiming fan_out: std = sqrt(2 / (512 * 9))
    assert abs(conv.weight.std().item() / (2 / (512 * 9)) ** 0.5 - 1) < 0.05


# --- profile ---------------------------------------------------------------------------------


def tiny() -> BlockModel:
    return BlockModel([nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2)], cut_points=(1, 2))


def test_profile_tiny_by_hand():
    b = PROFILE_BATCH
    prof = measure_profile(tiny(), (4,))
    # block 0, Linear(4,3), input needs no grad: forward x@W^T (2·b·4·3) + weight grad (2·3·b·4)
    # block 1, ReLU: no matmul; block 2, Linear(3,2): forward + input grad + weight grad
    expected = [(2 * b * 4 * 3 + 2 * 3 * b * 4) / b, 0.0, 3 * (2 * b * 3 * 2) / b]
    assert [c.flops_per_sample for c in prof.blocks] == expected == [48.0, 0.0, 36.0]
    assert [c.params for c in prof.blocks] == [15, 0, 8]
    assert [c.param_bytes for c in prof.blocks] == [60, 0, 32]
    assert [c.out_elements for c in prof.blocks] == [3, 3, 2]
    assert [c.out_bytes for c in prof.blocks] == [12, 12, 8]
    assert prof.device_bytes(1) == 60 and prof.device_bytes(2) == 60
    assert prof.total_bytes == 92
    assert prof.device_flops(1) == 48.0 and prof.server_flops(1) == 36.0
    assert prof.total_flops == 84.0
    assert prof.activation_bytes(1) == 12 and prof.activation_bytes(2) == 12
    assert prof.activation_bytes(3) == 0


def test_profile_leaves_model_and_rng_untouched():
    model = BlockModel(
        [nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Dropout(), nn.Linear(8, 2)], cut_points=(1, 2)
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(0)
    measure_profile(model, (4,))
    after_profile = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(after_profile, torch.rand(3))
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert model.training


def test_profile_model_matches_structure():
    prof = profile_model("resnet8", (3, 32, 32), 10)
    model = built("resnet8")
    assert prof.num_blocks == model.num_blocks
    assert prof.total_bytes >= 4 * sum(p.numel() for p in model.parameters())
    assert prof.activation_bytes(1) == 16 * 32 * 32 * 4
    # device FLOPs and size grow with the cut
    flops = [prof.device_flops(c) for c in model.cut_points]
    assert flops == sorted(flops) and prof.device_flops(model.num_blocks) == prof.total_flops
    assert profile_model("resnet8", [3, 32, 32], 10) is prof  # cached


# --- base ------------------------------------------------------------------------------------


def test_block_index():
    assert block_index("blocks.0.weight") == 0
    assert block_index("blocks.12.1.running_mean") == 12
    for bad in ("weight", "fc.0.weight", "blocks"):
        with pytest.raises(ValueError):
            block_index(bad)


def test_model_part_rejects_bad_ranges():
    model = tiny()
    for start, stop in [(-1, 2), (2, 1), (0, 4), (4, 4)]:
        with pytest.raises(ValueError):
            ModelPart(model, start, stop)
    part = ModelPart(model, 1, 3)
    with pytest.raises(ValueError):
        part(torch.zeros(1, 3), start=0)
    assert list(part.state_dict()) == ["blocks.2.weight", "blocks.2.bias"]


def test_split_rejects_bad_cuts():
    model = tiny()
    for cut in (0, -1, 4):
        with pytest.raises(ValueError):
            split(model, cut)


def test_block_model_rejects_bad_cut_points():
    blocks = [nn.Linear(2, 2) for _ in range(3)]
    for cuts in [(0, 1), (1, 3), (2, 1), (1, 1)]:
        with pytest.raises(ValueError):
            BlockModel(blocks, cuts)


def test_default_cut_is_the_last_candidate_unless_named():
    blocks = [nn.Linear(2, 2) for _ in range(4)]
    assert BlockModel(blocks, (1, 2, 3)).default_cut == 3
    assert BlockModel(blocks, (1, 2, 3), default_cut=2).default_cut == 2
    with pytest.raises(ValueError, match="default cut"):
        BlockModel(blocks, (1, 3), default_cut=2)

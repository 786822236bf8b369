"""MergeSFL's CNN-H (HAR), CNN-S (Speech Commands) and VGG-16 for IMAGE-100."""

from __future__ import annotations

from collections import Counter
from functools import cache

import numpy as np
import pytest
import torch
from torch import nn

from conftest import tiny_config
from fixtures_data import write_har
from splitfl.experiment.runner import as_config, prepare
from splitfl.models import BlockModel, block_index, build_model, profile_model, split

# name -> (input shape, classes, blocks, cut points, parameters, MergeSFL cut, smashed shape)
SPECS = {
    "cnn_h": ((1, 128, 9), 6, 5, (1, 2, 3), 4_223_582, 2, (32, 32, 2)),
    "cnn_s": ((1, 16000), 35, 5, (1, 2, 3), 26_915, 3, (64, 14)),
    "vgg16_image100": ((3, 64, 64), 100, 16, (7, 10, 13), 40_306_852, 13, (512, 2, 2)),
}


@cache
def built(name: str, shape: tuple[int, ...] | None = None, classes: int | None = None):
    spec = SPECS[name]
    torch.manual_seed(0)
    return build_model(name, shape or spec[0], classes or spec[1]).eval()


@pytest.mark.parametrize("name", sorted(SPECS))
def test_blocks_cut_points_and_parameters(name):
    _, _, blocks, cuts, params, mergesfl_cut, _ = SPECS[name]
    model = built(name)
    assert isinstance(model, BlockModel) and model.name == name
    assert model.num_blocks == blocks and model.cut_points == cuts
    assert mergesfl_cut in model.cut_points
    assert sum(p.numel() for p in model.parameters()) == params


@pytest.mark.parametrize("name", sorted(SPECS))
def test_split_composes_at_every_cut(name):
    shape, classes, *_ = SPECS[name]
    model = built(name)
    torch.manual_seed(1)
    x = torch.randn(1 if name == "vgg16_image100" else 2, *shape)
    whole = Counter(n for n, _ in model.named_parameters())
    with torch.no_grad():
        full = model(x)
        assert full.shape == (x.shape[0], classes)
        for cut in range(1, model.num_blocks + 1):
            device, server = split(model, cut)
            smashed = device(x)
            assert torch.equal(server(smashed), full), f"cut {cut}"
            dev = Counter(n for n, _ in device.named_parameters())
            srv = Counter(n for n, _ in server.named_parameters())
            assert dev + srv == whole and not set(dev) & set(srv)
            assert all(block_index(k) < cut for k in dev)
            assert all(block_index(k) >= cut for k in srv)
            assert set(device.state_dict()) | set(server.state_dict()) == set(model.state_dict())


@pytest.mark.parametrize("name", sorted(SPECS))
def test_smashed_data_at_mergesfl_cut(name):
    shape, *_, mergesfl_cut, smashed = SPECS[name]
    with torch.no_grad():
        out = built(name)(torch.zeros(1, *shape), stop=mergesfl_cut)
    assert tuple(out.shape[1:]) == smashed


@pytest.mark.parametrize("name", sorted(SPECS))
def test_default_cut_is_mergesfl_split(name):
    """§V-A: CNN-H split at the 3rd layer, CNN-S at the 4th, VGG16 at the 13th — the released
    clients' smashed data (32×32×2, 64×14, 512×h×w) is the activation at the default cut."""
    shape, *_, mergesfl_cut, smashed = SPECS[name]
    model = built(name)
    assert model.default_cut == mergesfl_cut
    with torch.no_grad():
        out = model(torch.zeros(1, *shape), stop=model.default_cut)
    assert tuple(out.shape[1:]) == smashed


@pytest.mark.parametrize("algorithm", ["splitfed_v1", "mergesfl"])
def test_cnn_h_run_with_null_cut_splits_where_mergesfl_does(tmp_path, algorithm):
    write_har(tmp_path)
    cfg = tiny_config(
        algorithm=algorithm,
        model="cnn_h",
        **{"data.dataset": "har", "data.root": str(tmp_path), "data.num_clients": 3},
        **{"data.partition": "iid", "data.min_samples": 1, "train.clients_per_round": 2},
    )
    prep = prepare(as_config(cfg))
    plan = prep.algorithm.plan_round(0, [0, 1], np.random.default_rng(0))
    assert {t.cut for t in plan.tasks} == {2}
    with torch.no_grad():
        out = prep.ctx.model(prep.ctx.bundle.train.x[:1], stop=plan.tasks[0].cut)
    assert tuple(out.shape[1:]) == (32, 32, 2)  # the released client's smashed data


def test_flatten_sizes_follow_input_shape():
    assert built("cnn_h").blocks[3][1].in_features == 64 * 32 * 2 == 4096
    assert built("cnn_h", (1, 64, 9), 6).blocks[3][1].in_features == 64 * 16 * 2
    assert built("cnn_s").blocks[4][2].in_features == 64
    assert built("vgg16_image100").blocks[13][1].in_features == 512 * 2 * 2
    assert built("vgg16_image100", (3, 32, 32), 10).blocks[13][1].in_features == 512
    big = built("vgg16_image100", (3, 144, 144), 100)  # the released IMAGE-100 setting
    assert big.blocks[13][1].in_features == 512 * 5 * 5 == 12800
    assert sum(p.numel() for p in big.parameters()) == 84_347_044


def test_layer_facts():
    h = built("cnn_h")
    convs = [h.blocks[i][0] for i in range(3)]
    assert [(c.in_channels, c.out_channels) for c in convs] == [(1, 12), (12, 32), (32, 64)]
    assert all(c.kernel_size == (3, 3) and c.padding == (1, 1) for c in convs)
    assert h.blocks[3][3].p == 0.5
    s = built("cnn_s")
    first = s.blocks[0][0]
    assert isinstance(first, nn.Conv1d) and first.kernel_size == (80,) and first.stride == (16,)
    assert all(isinstance(s.blocks[i][1], nn.BatchNorm1d) for i in range(4))
    assert all(s.blocks[i][3].kernel_size == 4 for i in range(4))
    v = built("vgg16_image100")
    pools = {i: b[3] for i, b in enumerate(v.blocks[:13]) if len(b) == 4}
    assert sorted(pools) == [1, 3, 6, 9, 12]
    assert [p.padding for p in pools.values()] == [0, 0, 0, 1, 0]
    assert all(isinstance(v.blocks[i][1], nn.BatchNorm2d) for i in range(13))


def test_cnn_s_accepts_other_lengths():
    model = built("cnn_s", (1, 8000), 35)
    with torch.no_grad():
        assert model(torch.zeros(2, 1, 8000)).shape == (2, 35)


def test_split_training_step_cnn_s():
    """Device and server parts train with BatchNorm in training mode; grads reach both."""
    torch.manual_seed(0)
    model = build_model("cnn_s", (1, 16000), 35).train()
    device, server = split(model, 3)
    x, y = torch.randn(4, 1, 16000), torch.tensor([0, 3, 7, 34])
    smashed = device(x)
    sent = smashed.detach().requires_grad_()
    loss = nn.functional.cross_entropy(server(sent), y)
    loss.backward()
    smashed.backward(sent.grad)
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("name", sorted(SPECS))
def test_profile(name):
    shape, classes, blocks, *_, mergesfl_cut, smashed = SPECS[name]
    if name == "vgg16_image100":
        shape = (3, 32, 32)  # keep the measured forward+backward cheap
        smashed = (512, 1, 1)
    prof = profile_model(name, shape, classes)
    model = built(name, shape, classes)
    assert prof.num_blocks == blocks
    assert sum(b.params for b in prof.blocks) == sum(p.numel() for p in model.parameters())
    assert all(b.flops_per_sample > 0 for b in prof.blocks)
    flops = [prof.device_flops(c) for c in range(1, blocks + 1)]
    assert flops == sorted(flops) and prof.device_flops(blocks) == prof.total_flops
    size = 1
    for d in smashed:
        size *= d
    assert prof.activation_bytes(mergesfl_cut) == 4 * size
    assert prof.activation_bytes(blocks) == 0

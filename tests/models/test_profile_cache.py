"""FLOP counting without the compiler stack, and the on-disk profile cache (by content)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch
from torch import nn

import splitfl.models.profile as profile_mod
from splitfl.models.base import BlockModel
from splitfl.models.profile import cached_profile, measure_profile
from splitfl.models.profile_cache import cache_dir
from splitfl.models.registry import build_model, model_names

SHAPES = {
    "cnn_h": (1, 128, 9),
    "cnn_s": (1, 16000),
    "transformer": (64,),
    "mlp": (1, 8, 8),
    "cnn_digits": (1, 8, 8),
    "lenet5": (1, 28, 28),
    "alexnet_mnist": (1, 28, 28),
}
SLOW = {"vgg16", "vgg16_image100"}  # the same layers as vgg16_cifar, at 224/64 pixels


def torch_counter(fn) -> int:
    """FLOPs as torch's FlopCounterMode counts them (what profiles used before)."""
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        fn()
    return counter.get_total_flops()


@pytest.mark.parametrize("name", sorted(set(model_names()) - SLOW))
def test_flops_identical_to_torch_flop_counter(name, monkeypatch):
    shape = SHAPES.get(name, (3, 32, 32))
    torch.manual_seed(0)
    model = build_model(name, shape, 10)
    ours = measure_profile(model, shape)
    monkeypatch.setattr(profile_mod, "count_flops", torch_counter)
    reference = measure_profile(model, shape)
    assert ours == reference
    assert ours.total_flops > 0


def test_profiling_does_not_import_the_compiler_stack():
    code = textwrap.dedent(
        """
        import sys
        from torch import nn
        from splitfl.models.base import BlockModel
        from splitfl.models.profile import measure_profile
        model = BlockModel([nn.Conv2d(1, 2, 3), nn.Flatten(), nn.Linear(72, 2)], (1, 2))
        measure_profile(model, (1, 8, 8))
        print(sorted(m for m in ("torch._dynamo", "torch._inductor") if m in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


class Scaled(nn.Module):
    def __init__(self, factor: int):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x.repeat(1, self.factor)


def model(width: int = 3, factor: int = 1) -> BlockModel:
    return BlockModel([nn.Linear(4, width), Scaled(factor), nn.Linear(width * factor, 2)], (1, 2))


def entries() -> list:
    folder = cache_dir()
    return sorted(folder.glob("*.json")) if folder.is_dir() else []


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLITFL_CACHE_DIR", str(tmp_path))
    calls = []
    real = profile_mod.measure_profile

    def counting(m, shape):
        calls.append(shape)
        return real(m, shape)

    monkeypatch.setattr(profile_mod, "measure_profile", counting)
    return calls


def test_cache_hit_gives_the_identical_profile(cache):
    first = cached_profile(model(), (4,))
    assert len(cache) == 1 and len(entries()) == 1
    again = cached_profile(model(), (4,))  # a new instance of the same architecture
    assert len(cache) == 1, "measured again instead of read from the cache"
    assert again == first == measure_profile(model(), (4,))
    stored = json.loads(entries()[0].read_text())
    assert stored[0] == {
        "params": 15,
        "param_bytes": 60,
        "flops_per_sample": 48.0,
        "out_elements": 3,
        "out_bytes": 12,
        "grad_bytes": 12,
    }


@pytest.mark.parametrize(
    "changed",
    [
        lambda: model(width=5),  # a layer's size
        lambda: model(factor=2),  # a plain attribute of a custom module
        lambda: BlockModel([nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2)], (1, 2)),  # a layer
    ],
)
def test_cache_misses_on_another_architecture(cache, changed):
    cached_profile(model(), (4,))
    cached_profile(changed(), (4,))
    assert len(cache) == 2 and len(entries()) == 2


def test_cache_misses_on_another_input_shape_or_changed_code(cache, monkeypatch):
    cached_profile(model(), (4,))
    cached_profile(BlockModel([nn.Flatten(), nn.Linear(4, 2)], (1,)), (2, 2))
    cached_profile(BlockModel([nn.Flatten(), nn.Linear(4, 2)], (1,)), (4,))
    assert len(cache) == 3
    monkeypatch.setattr(Scaled, "forward", lambda self, x: x.repeat(1, self.factor) * 1.0)
    cached_profile(model(), (4,))
    assert len(cache) == 4


def test_damaged_entry_is_measured_again_and_replaced(cache):
    first = cached_profile(model(), (4,))
    path = entries()[0]
    for damage in ("{not json", "[]", json.dumps([{"params": "15"}]), '[{"params": true}]'):
        path.write_text(damage)
        assert cached_profile(model(), (4,)) == first
        assert json.loads(path.read_text())[0]["params"] == 15
    assert len(cache) == 5


def test_empty_cache_dir_turns_the_cache_off(tmp_path, monkeypatch):
    monkeypatch.setenv("SPLITFL_CACHE_DIR", "")
    assert cache_dir() is None
    assert cached_profile(model(), (4,)) == measure_profile(model(), (4,))
    monkeypatch.setenv("SPLITFL_CACHE_DIR", str(tmp_path / "file"))
    (tmp_path / "file").write_text("not a folder")  # cannot be written: skipped, not an error
    assert cached_profile(model(), (4,)) == measure_profile(model(), (4,))

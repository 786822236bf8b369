"""Per-block cost profile of a :class:`BlockModel`: parameters, FLOPs and activation sizes.

FLOPs are *measured* with torch's per-operator formulas (:mod:`splitfl.models.flops`; forward
plus backward of one training step), not written by hand, and divided by the batch size to give
a per-sample figure. Profiles are cached in memory per (model name, input shape, num_classes)
and on disk by content (:mod:`splitfl.models.profile_cache`).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from functools import lru_cache

import torch

from splitfl.core.activations import Activation, as_server_input, first_float, leaves, tree_map
from splitfl.models.base import BlockModel, moving_state, run_block
from splitfl.models.flops import count_flops
from splitfl.models.profile_cache import architecture_key, read_entry, write_entry
from splitfl.models.registry import NO_SPLIT, Split, build_model

BYTES_PER_ELEMENT = 4  # fp32 parameters, activations and gradients on the wire
PROFILE_BATCH = 2  # batch used to measure FLOPs; >1 so BatchNorm runs in training mode


@dataclass(frozen=True)
class BlockCost:
    """Cost facts of one block for one input shape.

    Attributes:
        params: Number of trainable parameters.
        param_bytes: Bytes of the block's state sent over the network (parameters and buffers).
        flops_per_sample: Forward + backward FLOPs for one sample (measured).
        out_elements: Output activation elements per sample (of its first floating tensor,
            where several tensors cross the cut: what an auxiliary head reads).
        out_bytes: Bytes per sample of everything the block sends on (:func:`sample_bytes`).
        grad_bytes: Bytes per sample of the gradient that comes back for it (its floating
            tensors; masks and ids carry none). ``out_bytes`` when one tensor crosses.
    """

    params: int
    param_bytes: int
    flops_per_sample: float
    out_elements: int
    out_bytes: int
    grad_bytes: int


@dataclass(frozen=True)
class ModelProfile:
    """Per-block costs of a model, with the sums that the cost model needs for a cut point."""

    blocks: tuple[BlockCost, ...]

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def part_bytes(self, start: int, stop: int) -> int:
        """|W| in bytes of blocks [start, stop)."""
        return sum(b.param_bytes for b in self.blocks[start:stop])

    def part_flops(self, start: int, stop: int) -> float:
        """Forward+backward FLOPs per sample of blocks [start, stop)."""
        return sum(b.flops_per_sample for b in self.blocks[start:stop])

    def device_bytes(self, cut: int) -> int:
        """|Wc|: bytes of the device part for cut point ``cut``."""
        return self.part_bytes(0, cut)

    def device_flops(self, cut: int) -> float:
        """Per-sample forward+backward FLOPs of the device part."""
        return self.part_flops(0, cut)

    def server_flops(self, cut: int) -> float:
        """Per-sample forward+backward FLOPs of the server part."""
        return self.part_flops(cut, self.num_blocks)

    def activation_bytes(self, cut: int) -> int:
        """q: bytes per sample of the activation sent at cut ``cut`` (0 for the full model)."""
        return 0 if cut >= self.num_blocks else self.blocks[cut - 1].out_bytes

    def gradient_bytes(self, cut: int) -> int:
        """Bytes per sample of the activation gradient sent back at cut ``cut``."""
        return 0 if cut >= self.num_blocks else self.blocks[cut - 1].grad_bytes

    @property
    def total_bytes(self) -> int:
        return self.part_bytes(0, self.num_blocks)

    @property
    def total_flops(self) -> float:
        return self.part_flops(0, self.num_blocks)


def measure_profile(model: BlockModel, input_shape: tuple[int, ...]) -> ModelProfile:
    """Measure each block's cost for per-sample input shape ``input_shape``.

    Each block is run in training mode on a batch of :data:`PROFILE_BATCH` samples; the input
    requires grad for every block but the first (as in split training, where the gradient of the
    activation is sent back), and the backward of the summed output is counted with the forward.
    """
    # Dropout in training mode draws random numbers: fork the RNG so that profiling (cached, so
    # run only on first use) never shifts the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        return _measure(copy.deepcopy(model).train(), input_shape)


def _measure(model: BlockModel, input_shape: tuple[int, ...]) -> ModelProfile:
    x: Activation = torch.zeros(PROFILE_BATCH, *input_shape, dtype=model.input_dtype)
    costs = []
    for i, block in enumerate(model.blocks):
        inp = as_server_input(x) if i > 0 else x

        def step(block=block, inp=inp):
            out = run_block(block, inp)
            grads = [t for t in leaves(out) if t.requires_grad]
            if grads:
                sum(t.float().sum() for t in grads).backward()
            return out

        flops = count_flops(step)
        with torch.no_grad():
            out = run_block(block, x)
        params = sum(p.numel() for p in block.parameters())
        state_elems = sum(t.numel() for t in moving_state(block, model).values())
        costs.append(
            BlockCost(
                params=params,
                param_bytes=state_elems * BYTES_PER_ELEMENT,
                flops_per_sample=flops / PROFILE_BATCH,
                out_elements=int(first_float(out)[0].numel()),
                out_bytes=sample_bytes(out),
                grad_bytes=sample_bytes(tuple(t for t in leaves(out) if t.is_floating_point())),
            )
        )
        x = tree_map(torch.Tensor.detach, out)
    return ModelProfile(tuple(costs))


def sample_bytes(x: Activation) -> int:
    """Bytes per sample of what crosses a cut: floating tensors at :data:`BYTES_PER_ELEMENT`
    (fp32 on the wire), integer and bool tensors (masks, ids) at their own size."""
    return sum(
        int(t[0].numel()) * (BYTES_PER_ELEMENT if t.is_floating_point() else t.element_size())
        for t in leaves(x)
    )


def _from_entry(entry: object) -> ModelProfile | None:
    """The profile stored in a cache entry, or None if it is not a well-formed one."""
    names = {f.name: f.type for f in fields(BlockCost)}
    if not isinstance(entry, list) or not entry:
        return None
    blocks = []
    for row in entry:
        if not isinstance(row, dict) or set(row) != set(names):
            return None
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in row.values()):
            return None
        blocks.append(BlockCost(**row))
    return ModelProfile(tuple(blocks))


def cached_profile(model: BlockModel, input_shape: tuple[int, ...]) -> ModelProfile:
    """:func:`measure_profile`, read from the on-disk cache when this architecture and input
    shape were measured before (:mod:`splitfl.models.profile_cache`), else measured and
    stored there."""
    settings = {"batch": PROFILE_BATCH, "bytes_per_element": BYTES_PER_ELEMENT}
    key = architecture_key(model, input_shape, settings)
    profile = _from_entry(read_entry(key))
    if profile is None or profile.num_blocks != len(model.blocks):
        profile = measure_profile(model, input_shape)
        write_entry(key, [asdict(b) for b in profile.blocks])
    return profile


@lru_cache(maxsize=64)
def _cached_profile(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    build: Callable[..., BlockModel],
    split: Split,
) -> ModelProfile:
    with torch.random.fork_rng(devices=[]):  # building the model draws its random init
        return cached_profile(build(name, input_shape, num_classes, split), input_shape)


def profile_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    build: Callable[..., BlockModel] = build_model,
    split: Split = NO_SPLIT,
) -> ModelProfile:
    """Cached :func:`measure_profile` of model ``name`` as ``build`` makes it (default: the
    registry; :func:`splitfl.extensions.profile_model` also takes import paths), cut where
    ``split`` says: in memory, and on disk by content (:func:`cached_profile`)."""
    return _cached_profile(name, tuple(input_shape), int(num_classes), build, split)

"""Models as ordered lists of blocks, and the split of a model into a device and a server part.

Every model in splitfl is a :class:`BlockModel`: an ``nn.ModuleList`` of blocks run in order.
A *cut point* ``c`` (``1 <= c <= len(blocks)``) means blocks ``[0, c)`` run on the device and
blocks ``[c, n)`` on the server; ``c == n`` is the whole model on the device (FedAvg).

Parameter names are the same in the whole model and in its parts (``blocks.<i>.<name>``), so
aggregation (e.g. S²FL Algorithm 1) works on plain state dicts keyed by the full model's names,
and :func:`block_index` tells which block a parameter belongs to.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence

import numpy as np
import torch
from torch import nn

from splitfl.core.activations import Activation, tree_map
from splitfl.training import loss_fn


class BlockModel(nn.Module):
    """An ordered list of blocks with declared candidate cut points.

    Args:
        blocks: The blocks, run in order.
        cut_points: Candidate cut points, strictly increasing, each in ``[1, len(blocks) - 1]``.
            S²FL uses three of them (``Wc1 < Wc2 < Wc3``).
        name: Registry name of the model.
        default_cut: The cut a fixed-split algorithm uses when its ``cut`` option is null: the
            split of the paper the model comes from (one of ``cut_points``); the last
            candidate when not given.
    """

    #: Where the blocks came from: ``blocks`` (the model is a BlockModel), ``sequential``
    #: (one block per child of an ``nn.Sequential``/list) or ``graph`` (pieces of an
    #: ``nn.Module`` split by :mod:`splitfl.models.graph`); :func:`user_state_dict` reads it.
    origin: str = "blocks"
    #: The module paths the cut points name (``graph`` models), e.g. ``("layer1", "layer2")``.
    cut_names: tuple[str, ...] = ()
    #: The dtype of the inputs the model takes (int64 for token ids).
    input_dtype: torch.dtype = torch.float32

    def __init__(
        self,
        blocks: Sequence[nn.Module],
        cut_points: Sequence[int],
        name: str = "",
        default_cut: int | None = None,
    ):
        super().__init__()
        self.blocks = nn.ModuleList(blocks)
        if isinstance(cut_points, str | bytes) or not all(
            isinstance(c, int | np.integer) and not isinstance(c, bool) for c in cut_points
        ):
            raise ValueError(f"cut points must be block indices (integers), got {cut_points!r}")
        self.cut_points = tuple(int(c) for c in cut_points)
        self.name = name
        n = len(self.blocks)
        if list(self.cut_points) != sorted(set(self.cut_points)) or not all(
            1 <= c < n for c in self.cut_points
        ):
            raise ValueError(f"cut points {self.cut_points} must be increasing within [1, {n - 1}]")
        last = self.cut_points[-1] if self.cut_points else None
        self.default_cut = last if default_cut is None else int(default_cut)
        if self.default_cut not in (*self.cut_points, last):
            raise ValueError(f"default cut {default_cut} is not one of {self.cut_points}")

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def forward(self, x: Activation, start: int = 0, stop: int | None = None) -> Activation:
        # the whole model iterates its ModuleList (slicing one builds a new Module)
        whole = start == 0 and stop is None
        for block in self.blocks if whole else self.blocks[start:stop]:
            x = run_block(block, x)
        return x


def run_block(block: nn.Module, x: Activation) -> Activation:
    """``block`` on ``x``: a tuple is its positional inputs (several tensors cross a cut).
    A graph piece that writes into its inputs in place (an inplace ReLU first; flagged in its
    ``meta`` by :mod:`splitfl.models.graph`) gets copies of them."""
    # an fx piece's ``meta`` is an instance attribute: read from ``__dict__``, since a miss
    # through ``nn.Module.__getattr__`` raises and catches an AttributeError on every call
    meta = block.__dict__.get("meta")
    if isinstance(meta, dict) and meta.get("splitfl_clones_inputs"):
        x = tree_map(torch.clone, x)
    return block(*x) if isinstance(x, tuple) else block(x)


class ModelPart(nn.Module):
    """A contiguous range ``[start, stop)`` of a :class:`BlockModel`'s blocks.

    The blocks are shared with the model it was cut from (no copy); ``copy.deepcopy`` a part to
    train it independently. Its ``state_dict`` keys equal the full model's keys.
    """

    def __init__(self, model: BlockModel, start: int, stop: int):
        super().__init__()
        if not 0 <= start <= stop <= model.num_blocks:
            raise ValueError(f"invalid block range [{start}, {stop}) of {model.num_blocks} blocks")
        self.start, self.stop = start, stop
        self.blocks = nn.ModuleDict({str(i): model.blocks[i] for i in range(start, stop)})

    def forward(self, x: Activation, start: int | None = None) -> Activation:
        """Run blocks from global index ``start`` (default: this part's first block) to the end."""
        first = self.start if start is None else start
        if not self.start <= first <= self.stop:
            raise ValueError(f"start {first} outside part [{self.start}, {self.stop})")
        # from the first block: the ModuleDict's blocks in order, without a lookup per block
        blocks = self.blocks.values() if first == self.start else self._from(first)
        for block in blocks:
            x = run_block(block, x)
        return x

    def _from(self, first: int) -> list[nn.Module]:
        return [self.blocks[str(i)] for i in range(first, self.stop)]


def split(model: BlockModel, cut: int) -> tuple[ModelPart, ModelPart]:
    """Split ``model`` at ``cut`` into (device part = blocks[:cut], server part = blocks[cut:]).

    ``server(device(x))`` equals ``model(x)`` exactly, since both parts share the model's blocks.
    """
    if not 1 <= cut <= model.num_blocks:
        raise ValueError(f"cut {cut} outside [1, {model.num_blocks}]")
    return ModelPart(model, 0, cut), ModelPart(model, cut, model.num_blocks)


def parameter_free_cuts(model: BlockModel) -> dict[int, str]:
    """The model's cut points whose device part (the blocks before) or server part (the
    blocks from it) holds no trainable parameter — nothing to train on that side (a bare
    ``Flatten`` or ``ReLU`` first) — each with the side that is empty."""
    trains = [any(p.requires_grad for p in b.parameters()) for b in model.blocks]
    free = {}
    for c in model.cut_points:
        if not any(trains[:c]) or not any(trains[c:]):
            free[c] = "device part" if not any(trains[:c]) else "server part"
    return free


def block_index(param_name: str) -> int:
    """Block index of a full-model state-dict key ``blocks.<i>.…``."""
    parts = param_name.split(".")
    if len(parts) < 2 or parts[0] != "blocks":
        raise ValueError(f"not a block parameter name: {param_name!r}")
    return int(parts[1])


def moving_state(module: nn.Module, model: BlockModel) -> dict[str, torch.Tensor]:
    """The tensors of ``module`` (the model or a part of it) that a round can change and so
    travel as model traffic: the whole state, or, where the model's base weights stay on every
    device (``model.frozen_base``: LoRA), all but the frozen parameters."""
    state = module.state_dict(keep_vars=True)
    if not getattr(model, "frozen_base", False):
        return state
    return {k: t for k, t in state.items() if not isinstance(t, nn.Parameter) or t.requires_grad}


def user_state_dict(model: BlockModel, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` (keys ``blocks.<i>.<name>``) under the user's own names: ``<name>`` for a
    graph-split model (its pieces hold the user's modules under their paths), ``<i>.<name>``
    for an ``nn.Sequential`` (block ``i`` is its child ``i``), the names recorded in
    ``model.user_names`` where the split made them (:mod:`splitfl.models.hf`). A tied
    parameter appears once per name, as in the user's ``state_dict``."""
    origin = model.origin
    names = getattr(model, "user_names", None)
    if names:  # recorded when the model was split (a Hugging Face model's own names)
        return {names.get(key, key): value for key, value in state.items()}
    if origin == "blocks":  # the model is a BlockModel of its own: these are its names
        return dict(state)
    out = {}
    for key, value in state.items():
        rest = key.partition(".")[2]
        out[rest.partition(".")[2] if origin == "graph" else rest] = value
    return out


def lowest_loss_state(
    model: nn.Module,
    states: Sequence[Mapping[str, torch.Tensor]],
    x: torch.Tensor,
    y: torch.Tensor,
    loss: str = "cross_entropy",
) -> int:
    """Index of the state under which ``model`` has the lowest mean ``loss`` (``train.loss``;
    cross-entropy by default) on ``(x, y)``
    (IFCA's cluster identity estimate, Ghosh et al. 2020 Alg. 1: ``argmin_j F_i(θ_j)`` on
    client i's own samples): one forward pass of the whole model per state, in eval mode, on a
    copy (``model`` is left untouched). Ties go to the lowest index. Needs only what a
    device holds: the downloaded states and its own samples."""
    work = copy.deepcopy(model).eval()
    criterion = loss_fn(loss)
    losses = []
    with torch.no_grad():
        for state in states:
            work.load_state_dict(state)
            losses.append(criterion(work(x), y).item())
    return int(torch.tensor(losses, dtype=torch.float64).argmin())

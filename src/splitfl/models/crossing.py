"""What crosses each cut of a :class:`~splitfl.models.base.BlockModel`, from a probe forward of
one batch (``splitfl validate``): per cut point, every tensor the device sends (name, shape,
dtype), and whether it is the model's raw input or computed from it without any parameter.

Split learning's privacy argument (Vepakomma et al., 2018, "Split learning for health", §1;
S²FL's Section II) rests on the server seeing smashed data — the output of the device's
layers — never the input. A model whose forward reads its input again after the cut (a slice
``x[:, :3]`` fed to the head, the input as a skip) sends it to the server at that cut.

A tensor is *raw* when it is computed from the input alone without reading a parameter or a
buffer: the input itself, a slice or view of it, a parameter-free module (ReLU, pooling) or
function of it. For a model split by its graph (:mod:`splitfl.models.graph`) this is read off
the pieces' graphs, each value named by its node; a value made of raw values and constants is
raw, one that reads a ``get_attr`` or a module with parameters or buffers is not. For other
blocks (zoo models, ``nn.Sequential``, Hugging Face pieces) nothing of the forward is known but
its values: a tensor crossing that equals the input (shape, dtype, values) is raw.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn

from splitfl.core.activations import Activation
from splitfl.models.base import BlockModel, run_block


class RawInputWarning(UserWarning):
    """The model's raw input (or a tensor computed from it without any parameter) crosses a cut
    to the server; ``str(warning)`` is one line naming the cut and the tensor."""


@dataclass(frozen=True)
class Crossed:
    """One tensor crossing a cut: its ``name`` (the graph node's, else ``output``/``output.i``),
    ``shape`` (the probe batch first), ``dtype`` and whether it is ``raw``."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    raw: bool

    def __str__(self) -> str:
        return f"{self.name} {list(self.shape)} {str(self.dtype).removeprefix('torch.')}"


@dataclass(frozen=True)
class CutCrossing:
    """What the device sends at cut point ``cut`` (named ``label``: ``2 (layer2)``)."""

    cut: int
    label: str
    tensors: tuple[Crossed, ...]

    def line(self) -> str:
        """``cut 1 (conv1) sends conv1 [16, 4, 8, 8] float32, getitem [16, 1, 2, 2] float32``"""
        return f"cut {self.label} sends " + ", ".join(map(str, self.tensors))

    def warnings(self, input_name: str) -> list[str]:
        """One line per raw tensor crossing this cut."""
        return [
            f"cut {self.label}: the model's input {input_name} crosses to the server as {t} "
            "(computed from the input without any parameter): the server sees raw input data"
            for t in self.tensors
            if t.raw
        ]


def what_crosses(model: BlockModel, x: torch.Tensor) -> list[CutCrossing]:
    """Every cut point's crossing tensors for the batch ``x``, from an eval-mode forward
    (no gradient, the RNG untouched; the model's mode restored)."""
    names = dict(zip(model.cut_points, model.cut_names, strict=False))
    raws: list[bool] | None = None  # per value of the current activation, for graph pieces
    crossings, h = [], x
    was_training = model.training
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        model.eval()
        try:
            for i, block in enumerate(model.blocks[: max(model.cut_points, default=0)]):
                h = run_block(block, h)
                raws = _raw_outputs(block, h, raws, x)
                cut = i + 1
                if cut in model.cut_points:
                    label = f"{cut} ({names[cut]})" if cut in names else str(cut)
                    crossings.append(CutCrossing(cut, label, _crossed(block, h, raws)))
        finally:
            model.train(was_training)
    return crossings


def input_name(model: BlockModel) -> str:
    """The name of the model's input: its forward's parameter for a graph model, else ``x``."""
    first = model.blocks[0] if len(model.blocks) else None
    graph = _graph_of(first) if first is not None else None
    if graph is not None:
        for n in graph.nodes:
            if n.op == "placeholder":
                return n.name
    return "x"


def _values(h: Activation) -> list[object]:
    return list(h) if isinstance(h, tuple) else [h]


def _crossed(block: nn.Module, h: Activation, raws: Sequence[bool]) -> tuple[Crossed, ...]:
    values, graph = _values(h), _graph_of(block)
    names = _output_names(graph) if graph is not None else None
    if names is None or len(names) != len(values):
        names = ["output"] if len(values) == 1 else [f"output.{i}" for i in range(len(values))]
    return tuple(
        Crossed(name, tuple(v.shape), v.dtype, bool(raw))
        for name, v, raw in zip(names, values, raws, strict=True)
        if isinstance(v, torch.Tensor)
    )


def _graph_of(block: nn.Module) -> fx.Graph | None:
    """The graph a piece runs in eval mode (:class:`~splitfl.models.tracing.ModeGraphModule`
    keeps it apart), or None for a block that is not an fx piece."""
    if not isinstance(block, fx.GraphModule):
        return None
    return block.__dict__.get("eval_graph") or block.graph


def _output_names(graph: fx.Graph) -> list[str] | None:
    out = next(n for n in graph.nodes if n.op == "output").args[0]
    outs = list(out) if isinstance(out, tuple | list) else [out]
    if not all(isinstance(o, fx.Node) for o in outs):
        return None
    return [o.name for o in outs]


def _raw_outputs(
    block: nn.Module, h: Activation, given: Sequence[bool] | None, x: torch.Tensor
) -> list[bool]:
    """Which of ``block``'s outputs (``h``) are raw: through its graph, the inputs' flags
    ``given`` (None: the block's inputs are the model's input); else by value (equal to
    ``x``)."""
    graph = _graph_of(block)
    outs = None if graph is None else _output_names(graph)
    if graph is None or outs is None:
        return [_equals(v, x) for v in _values(h)]
    raw: dict[fx.Node, bool] = {}
    placeholders = iter(given) if given is not None else None
    for n in graph.nodes:
        if n.op == "placeholder":
            raw[n] = True if placeholders is None else next(placeholders, False)
        elif n.op in ("call_function", "call_method", "call_module"):
            args = [a for a in _node_args(n) if isinstance(a, fx.Node)]
            free = n.op != "call_module" or _parameter_free(block.get_submodule(n.target))
            raw[n] = free and bool(args) and all(raw.get(a, False) for a in args)
    by_name = {n.name: raw.get(n, False) for n in graph.nodes}
    return [by_name.get(name, False) for name in outs]


def _node_args(n: fx.Node) -> list[object]:
    found: list[object] = []
    fx.node.map_arg((n.args, n.kwargs), lambda a: found.append(a) or a)
    return found


def _parameter_free(module: nn.Module) -> bool:
    return not any(True for _ in module.parameters()) and not any(True for _ in module.buffers())


def _equals(v: object, x: torch.Tensor) -> bool:
    return (
        isinstance(v, torch.Tensor)
        and v.shape == x.shape
        and v.dtype == x.dtype
        and bool(torch.equal(v, x))
    )

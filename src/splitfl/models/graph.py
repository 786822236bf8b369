"""Any ``nn.Module`` as a :class:`~splitfl.models.base.BlockModel`, split by ``torch.fx``.

``torch.fx.symbolic_trace`` records the module's own ``forward`` (residual additions, a
``torch.flatten`` between children, skips) as a graph whose nodes keep the calls of
``torch.nn`` modules and name the module each node ran in (``nn_module_stack``). A *cut* names
a module by its path (``layer2``: after it, the usual "cut layer" of split learning — the
last layer on the device; ``after:layer2``, ``before:fc``): the graph's nodes, in execution
order, are cut after the last node run inside that module (before the first). The pieces
between consecutive cuts become the model's blocks, each a ``torch.fx.GraphModule`` that
holds the user's own modules (shared, not copied) under their own paths, so the block
``blocks.<i>.layer2.0.conv1.weight`` is the user's ``layer2.0.conv1.weight``
(:func:`~splitfl.models.base.user_state_dict`).

Why ``torch.fx`` and not ``torch.distributed.pipelining`` / ``torch.export``: exported
stages bake in the mode they were traced in (BatchNorm kept batch statistics after
``.eval()``), while fx keeps module calls, so ``train()``/``eval()``, dropout and BatchNorm
behave as in the user's model. ``torch.fx.passes.split_module`` lifts every parameter read by
``get_attr`` into the parent module and passes it to the pieces as an input — a parameter
would then cross the cut — so the pieces are built here with fx's own ``Graph.node_copy``,
each reading its parameters itself.

What crosses a cut is every value made before it and used after it (a skip connection, an
attention mask, the input itself where the model reads it later): one tensor, or a tuple of
tensors (:mod:`splitfl.core.activations`). Each must be a tensor whose first dimension is the
batch (checked by running the graph at two batch sizes); a module whose parameters are used
on both sides (tied weights), a non-tensor value crossing (``x.size(0)``) or a forward that
fx cannot trace is one line naming the reason (:class:`GraphSplitError`).
"""

from __future__ import annotations

import inspect
import operator
import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import fx, nn

from splitfl.models.base import BlockModel

#: symbolic_trace patches torch.nn.Module.__call__ process-wide while it runs, so a forward in
#: another thread would be recorded (or return a Proxy). One graph model is built at a time
#: per process, and a builder's trace is kept (:data:`_TRACES`): a process traces each model
#: once (devices in threads of one process, as the tests run them, reuse the server's trace).
_TRACING = threading.Lock()
#: (builder, input shape, classes) → (traced graph without its module, input dtype, shapes)
_TRACES: dict[object, tuple[fx.Graph, torch.dtype, dict]] = {}
PROBE_BATCHES = (2, 3)  # batch sizes the cut values are checked at (dim 0 must follow them)
CLONES_INPUTS = "splitfl_clones_inputs"  # GraphModule.meta key read by models.base.run_block


class GraphSplitError(ValueError):
    """A model cannot be traced or cut where asked; ``str(err)`` is one line."""


@dataclass(frozen=True)
class Cut:
    """A cut named by module path: ``after`` (default) or ``before`` module ``path``."""

    path: str
    side: str = "after"

    @classmethod
    def parse(cls, spec: str) -> Cut:
        side, sep, path = str(spec).partition(":")
        if not sep:
            return cls(side.strip())
        if side.strip() not in ("after", "before") or not path.strip():
            raise GraphSplitError(f"cut {spec!r}: write MODULE, after:MODULE or before:MODULE")
        return cls(path.strip(), side.strip())

    def __str__(self) -> str:
        return self.path if self.side == "after" else f"{self.side}:{self.path}"


def trace(module: nn.Module, where: str) -> fx.GraphModule:
    """``module``'s forward as an fx graph (arguments after the first with a default are
    fixed to it). A forward whose graph depends on ``self.training`` outside module calls
    (``F.dropout(x, training=self.training)``) is refused: its traced pieces would keep the
    mode they were traced in."""
    params = list(inspect.signature(module.forward).parameters.values())
    fixed = {p.name: p.default for p in params[1:] if p.default is not p.empty}
    was_training = module.training
    codes = []
    try:
        for mode in (True, False):
            module.train(mode)
            graph = fx.symbolic_trace(module, concrete_args=fixed or None)
            codes.append(graph.code)
    except Exception as err:  # fx raises many kinds; each is a reason the model cannot be cut
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise GraphSplitError(f"{where} cannot be traced by torch.fx: {first}") from None
    finally:
        module.train(was_training)
    if codes[0] != codes[1]:
        raise GraphSplitError(
            f"{where}'s forward reads self.training outside module calls (e.g. F.dropout("
            "training=self.training)); use nn.Dropout / nn.BatchNorm modules so the split "
            "parts follow train() and eval()"
        )
    graph.train(was_training)
    return graph


def _owners(node: fx.Node) -> list[str]:
    """The module paths ``node`` ran in, outermost first."""
    stack = list((node.meta.get("nn_module_stack") or {}).keys())
    if node.op in ("call_module", "get_attr") and isinstance(node.target, str):
        stack.append(node.target)
    return stack


def _inside(node: fx.Node, path: str) -> bool:
    return any(p == path or p.startswith(path + ".") for p in _owners(node))


def cut_position(nodes: Sequence[fx.Node], cut: Cut, where: str) -> int:
    """Index of the last node on the device side of ``cut``."""
    hits = [i for i, n in enumerate(nodes) if n.op != "get_attr" and _inside(n, cut.path)]
    if not hits:
        raise GraphSplitError(f"{where}: cut {str(cut)!r}: no module {cut.path!r} runs in forward")
    return hits[-1] if cut.side == "after" else hits[0] - 1


def crossing(nodes: Sequence[fx.Node], position: int) -> list[fx.Node]:
    """Values made at or before ``position`` and used after it, in the order they were made
    (parameters read by ``get_attr`` are read again on the far side, never sent)."""
    index = {n: i for i, n in enumerate(nodes)}
    return [
        n
        for n in nodes[: position + 1]
        if n.op != "get_attr" and any(index.get(u, len(nodes)) > position for u in n.users)
    ]


def top_level_cuts(module: nn.Module, nodes: Sequence[fx.Node]) -> list[Cut]:
    """After each top-level child that runs in forward, in the order they finish."""
    last: dict[str, int] = {}
    for i, n in enumerate(nodes):
        owners = _owners(n)
        if owners and n.op != "get_attr":
            last[owners[0].split(".")[0]] = i
    children = {name for name, _ in module.named_children()}
    return [Cut(name) for name, _ in sorted(last.items(), key=lambda kv: kv[1]) if name in children]


def _probe(graph: fx.GraphModule, input_shape: tuple[int, ...], where: str):
    """Run ``graph`` on zero inputs of :data:`PROBE_BATCHES` sizes (float32, else int64 —
    token ids — when float inputs fail): ``(input dtype, {node: shape per batch or None})``."""
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        names = ", ".join(n.name for n in placeholders)
        raise GraphSplitError(
            f"{where}'s forward takes {len(placeholders)} inputs ({names}); "
            "splitfl feeds it one input tensor"
        )
    floats = [p.dtype for p in graph.parameters() if p.is_floating_point()]
    errors = []
    for dtype in (floats[0] if floats else torch.float32, torch.int64):
        try:
            return dtype, _shapes(graph, input_shape, dtype)
        except Exception as err:  # noqa: BLE001 — the model's own error, reported below
            errors.append((str(err).strip().splitlines() or [type(err).__name__])[0])
    raise GraphSplitError(
        f"{where} fails on a zero input of shape {list(input_shape)}: {errors[0]}"
    )


class _ShapeRecorder(fx.Interpreter):
    """Runs a graph, recording each node's shape (None for a value that is not a tensor)."""

    def __init__(self, graph: fx.GraphModule):
        super().__init__(graph)
        self.shapes: dict[fx.Node, tuple | None] = {}

    def run_node(self, n: fx.Node):
        value = super().run_node(n)
        self.shapes[n] = tuple(value.shape) if isinstance(value, torch.Tensor) else None
        return value


def _shapes(graph: fx.GraphModule, input_shape, dtype) -> dict[fx.Node, list]:
    seen: dict[fx.Node, list] = {}
    was_training = graph.training
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        graph.eval()
        try:
            for batch in PROBE_BATCHES:
                recorder = _ShapeRecorder(graph)
                recorder.run(torch.zeros(batch, *input_shape, dtype=dtype))
                for n, shape in recorder.shapes.items():
                    seen.setdefault(n, []).append(shape)
        finally:
            graph.train(was_training)
    return seen


def _reason(nodes, position: int, shapes) -> str | None:
    """Why a cut after ``nodes[position]`` is not a split point, or None."""
    if position < 0 or nodes[position].op == "placeholder":
        return "nothing runs before it"
    if position >= len(nodes) - 1:
        return "nothing runs after it"
    for n in crossing(nodes, position):
        dims = shapes.get(n, [None])
        if any(d is None for d in dims):
            return f"a value that is not a tensor ({n.name}) would cross it"
        if any(not d or d[0] != b for d, b in zip(dims, PROBE_BATCHES, strict=True)):
            return f"{n.name} would cross it without the batch as its first dimension"
    return None


def _past_unpacking(nodes, position: int) -> int:
    """Move a cut past the ``getitem`` nodes that unpack a tuple made before it."""
    made = set(nodes[: position + 1])
    while (
        position + 1 < len(nodes)
        and nodes[position + 1].op == "call_function"
        and nodes[position + 1].target is operator.getitem
        and nodes[position + 1].args[0] in made
    ):
        position += 1
        made.add(nodes[position])
    return position


def partition(root: nn.Module, graph: fx.Graph, positions: Sequence[int]) -> list[fx.GraphModule]:
    """The pieces of ``graph`` between consecutive cut ``positions`` as GraphModules over
    ``root``'s own modules and parameters (each piece reads the parameters it uses)."""
    nodes = [n for n in graph.nodes if n.op != "output"]
    result = next(n for n in graph.nodes if n.op == "output").args[0]
    bounds = [-1, *positions, len(nodes) - 1]
    pieces = []
    for j in range(len(bounds) - 1):
        start, stop = bounds[j] + 1, bounds[j + 1]
        inputs = (
            [n for n in nodes if n.op == "placeholder"] if j == 0 else crossing(nodes, bounds[j])
        )
        outputs = crossing(nodes, stop) if j < len(bounds) - 2 else None
        pieces.append(_piece(root, nodes[start : stop + 1], inputs, outputs, result))
    return pieces


def _piece(root, span, inputs, outputs, result) -> fx.GraphModule:
    g = fx.Graph()
    env: dict[fx.Node, fx.Node] = {n: g.placeholder(n.name) for n in inputs}

    def lookup(a: fx.Node) -> fx.Node:
        if a not in env and a.op == "get_attr":  # a parameter or buffer: read it here
            env[a] = g.get_attr(a.target)
        return env[a]

    for n in span:
        if n.op not in ("placeholder", "get_attr"):
            env[n] = g.node_copy(n, lookup)
    if outputs is None:
        g.output(fx.node.map_arg(result, lookup))
    else:
        g.output(lookup(outputs[0]) if len(outputs) == 1 else tuple(lookup(o) for o in outputs))
    piece = fx.GraphModule(root, g)
    piece.meta[CLONES_INPUTS] = _mutates_inputs(g, root)  # meta survives copy.deepcopy
    return piece


def _mutates_inputs(g: fx.Graph, root: nn.Module) -> bool:
    """Whether a node of ``g`` writes in place into one of its inputs (an inplace ReLU as the
    first thing the server part runs): such a piece is fed copies (autograd forbids writing
    into the leaf the server's gradient is taken of)."""
    for n in g.nodes:
        if not any(isinstance(a, fx.Node) and a.op == "placeholder" for a in n.args):
            continue
        if n.op == "call_module" and getattr(root.get_submodule(n.target), "inplace", False):
            return True
        name = n.target if isinstance(n.target, str) else getattr(n.target, "__name__", "")
        if n.kwargs.get("inplace") or (name.endswith("_") and not name.startswith("_")):
            return True
    return False


def _tied(pieces: Sequence[fx.GraphModule], names: Sequence[str]) -> str | None:
    """The first parameter used by two pieces (tied weights across a cut), as a reason."""
    owner: dict[int, int] = {}
    for i, piece in enumerate(pieces):
        for pname, p in piece.named_parameters(remove_duplicate=True):
            j = owner.setdefault(id(p), i)
            if j != i:
                return f"parameter {pname} is used on both sides of cut {names[j]!r} (tied weights)"
    return None


def graph_block_model(
    module: nn.Module,
    input_shape: tuple[int, ...],
    where: str,
    cut_points: Sequence[str] | None = None,
    cut: str | None = None,
    key: object = None,
) -> BlockModel:
    """``module`` cut at ``cut_points`` (module paths; default: after every top-level child
    where the graph allows a split) into a :class:`BlockModel` of GraphModule pieces, whose
    default cut is ``cut`` (default: the last candidate). The model records its cut names
    (``cut_names``), the input dtype its forward takes (``input_dtype``) and ``origin``.
    ``key``: what determines ``module``'s structure (its builder and the builder's
    arguments); a key traced before in this process reuses that trace."""
    with _TRACING:
        graph, dtype, shapes = _traced(module, tuple(input_shape), where, key)
        return _cut_model(module, graph, dtype, shapes, where, cut_points, cut)


def _traced(module: nn.Module, input_shape: tuple[int, ...], where: str, key: object):
    """The traced graph of ``module`` (a copy that holds no module), its input dtype and node
    shapes; from :data:`_TRACES` when ``key`` was traced before in this process."""
    if key is not None and key in _TRACES:
        return _TRACES[key]
    traced = trace(module, where)
    dtype, shapes = _probe(traced, input_shape, where)
    graph, copies = fx.Graph(), {}
    graph.output(graph.graph_copy(traced.graph, copies))
    result = graph, dtype, {copies[n]: s for n, s in shapes.items() if n in copies}
    if key is not None:
        _TRACES[key] = result
    return result


def _cut_model(module, graph: fx.Graph, dtype, shapes, where, cut_points, cut) -> BlockModel:
    """:func:`graph_block_model` on a traced ``graph`` of ``module``."""
    nodes = [n for n in graph.nodes if n.op != "output"]

    def position(c: Cut) -> int:
        return _past_unpacking(nodes, cut_position(nodes, c, where))

    if cut_points:
        cuts = [Cut.parse(c) for c in cut_points]
    else:
        cuts = [
            c for c in top_level_cuts(module, nodes) if _reason(nodes, position(c), shapes) is None
        ]
    default = Cut.parse(cut) if cut else None
    if default is not None and default not in cuts:
        if cut_points:
            raise GraphSplitError(
                f"{where}: cut {cut!r} is not one of cut_points {list(cut_points)}"
            )
        cuts.append(default)
    for c in cuts:
        reason = _reason(nodes, position(c), shapes)
        if reason:
            raise GraphSplitError(f"{where}: cut {str(c)!r} is not a split point: {reason}")
    cuts.sort(key=position)
    positions = [position(c) for c in cuts]
    if len(set(positions)) != len(positions) or not positions:
        raise GraphSplitError(
            f"{where}: cut points {[str(c) for c in cuts] or '(none found)'} must name "
            "distinct places in forward (at least one)"
        )
    names = [str(c) for c in cuts]
    pieces = partition(module, graph, positions)
    tied = _tied(pieces, names)
    if tied:
        raise GraphSplitError(f"{where}: {tied}")
    default_index = names.index(str(default)) + 1 if default is not None else None
    model = BlockModel(pieces, range(1, len(pieces)), where, default_cut=default_index)
    model.cut_names, model.input_dtype, model.origin = tuple(names), dtype, "graph"
    model.train(module.training)
    return model

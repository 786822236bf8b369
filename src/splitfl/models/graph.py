"""Any ``nn.Module`` as a :class:`~splitfl.models.base.BlockModel`, split by ``torch.fx``.

``torch.fx`` records the module's own ``forward`` (residual additions, a
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
behave as in the user's model. The forward is traced by :mod:`splitfl.models.tracing`: a
submodule fx cannot trace (shape arithmetic such as ``int(C / g)``) runs whole as one call,
and a forward that reads ``self.training`` outside module calls (drop-connect under ``if
self.training``) gives one graph per mode, cut at the same places, each piece then a
:class:`~splitfl.models.tracing.ModeGraphModule` running the graph of its mode.
``torch.fx.passes.split_module`` lifts every parameter read by ``get_attr`` into the parent
module and passes it to the pieces as an input — a parameter would then cross the cut — so
the pieces are built here with fx's own ``Graph.node_copy``, each reading its parameters
itself.

What crosses a cut is every value made before it and used after it (a skip connection, an
attention mask, the input itself where the model reads it later): one tensor, or a tuple of
tensors (:mod:`splitfl.core.activations`). Each must be a tensor whose first dimension is the
batch (checked by running the graph at two batch sizes) and, for a model with one graph per
mode, the same values in both; a module whose parameters are used on both sides (tied
weights), a non-tensor value crossing (``x.size(0)``), values crossing that differ between the
modes or a forward of the model's own that fx cannot trace (a branch on a tensor's value) is
one line naming the reason (:class:`GraphSplitError`).

One concept over 400 lines: cutting one traced forward into pieces — where a cut falls, what
crosses it, whether it may be a split point (shapes at two batch sizes, in each mode) and the
pieces' graphs and state — each step reading the same node order and the others' results.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from splitfl.models.base import BlockModel
from splitfl.models.tracing import GraphSplitError, ModeGraphModule, trace_modes

#: symbolic_trace patches torch.nn.Module.__call__ process-wide while it runs, so a forward in
#: another thread would be recorded (or return a Proxy). One graph model is built at a time
#: per process, and a builder's trace is kept (:data:`_TRACES`): a process traces each model
#: once (devices in threads of one process, as the tests run them, reuse the server's trace).
_TRACING = threading.Lock()
#: (builder, input shape, classes) → its :class:`_Trace` (graphs that hold no module)
_TRACES: dict[object, _Trace] = {}
PROBE_BATCHES = (2, 3)  # batch sizes the cut values are checked at (dim 0 must follow them)
CLONES_INPUTS = "splitfl_clones_inputs"  # GraphModule.meta key read by models.base.run_block


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
        calls = [n.target for n in nodes if n.op == "call_module"]
        whole = next((t for t in calls if cut.path.startswith(f"{t}.")), None)
        inside = f" (it is inside {whole!r}, which runs whole)" if whole else ""
        raise GraphSplitError(
            f"{where}: cut {str(cut)!r}: no module {cut.path!r} runs in forward{inside}"
        )
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
            f"{where}'s forward takes {len(placeholders)} inputs ({names}); splitfl feeds it "
            "one input tensor per sample (models with several inputs are not supported): let "
            "the dataset concatenate them into one tensor and forward split it again"
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


def partition(graph: fx.Graph, positions: Sequence[int]) -> list[fx.Graph]:
    """The pieces of ``graph`` between consecutive cut ``positions``, as graphs (each piece
    reads the parameters it uses)."""
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
        pieces.append(_piece(nodes[start : stop + 1], inputs, outputs, result))
    return pieces


def _piece(
    span: Sequence[fx.Node],
    inputs: Sequence[fx.Node],
    outputs: Sequence[fx.Node] | None,
    result: Any,
) -> fx.Graph:
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
    return g


def piece_module(root: nn.Module, graphs: Sequence[fx.Graph]) -> fx.GraphModule:
    """A piece over ``root``'s own modules and parameters: a GraphModule of its one graph,
    or a :class:`~splitfl.models.tracing.ModeGraphModule` of its train and eval graphs."""
    piece = fx.GraphModule(root, graphs[0]) if len(graphs) == 1 else ModeGraphModule(root, *graphs)
    piece.meta[CLONES_INPUTS] = any(_mutates_inputs(g, root) for g in graphs)  # survives deepcopy
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


def _keep_unused(root: nn.Module, pieces: Sequence[Sequence[fx.Graph]]) -> None:
    """Give each tensor of ``root``'s ``state_dict`` that no piece reads (a module made in
    ``__init__`` but not called by forward, as EfficientNet's unused expansion conv) to the
    piece that reads the next one in that order (else the previous one): the pieces hold the
    user's whole state, so ``model.pt`` loads into the user's class strictly."""
    state = root.state_dict(keep_vars=True)
    reader: dict[int, int] = {}  # id(tensor) → the first piece that reads it
    for i, graphs in enumerate(pieces):
        for n in (n for g in graphs for n in g.nodes):
            if n.op == "call_module":
                for t in root.get_submodule(n.target).state_dict(keep_vars=True).values():
                    reader.setdefault(id(t), i)
            elif n.op == "get_attr":
                reader.setdefault(id(operator.attrgetter(n.target)(root)), i)
    owners = [reader.get(id(t)) for t in state.values()]
    for j, key in enumerate(state):
        if owners[j] is not None or not _is_attribute(root, key):
            continue  # read by a piece, or a key a module's own state-dict hook makes
        later = [o for o in owners[j + 1 :] if o is not None]
        earlier = [o for o in owners[:j] if o is not None]
        for g in pieces[later[0] if later else earlier[-1] if earlier else 0]:
            with g.inserting_before(next(n for n in g.nodes if n.op == "output")):
                g.get_attr(key)


def _is_attribute(root: nn.Module, path: str) -> bool:
    try:
        operator.attrgetter(path)(root)
    except AttributeError:
        return False
    return True


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
        traced = _traced(module, tuple(input_shape), where, key)
        return _cut_model(module, traced, where, cut_points, cut)


@dataclass(frozen=True)
class _Trace:
    """A traced forward: its graph per mode (train, then eval where it differs; graphs that
    hold no module), the input dtype and, per graph, each node's shape per probe batch."""

    graphs: tuple[fx.Graph, ...]
    dtype: torch.dtype
    shapes: tuple[dict[fx.Node, list], ...]

    def modes(self) -> list[list[fx.Node]]:
        return [[n for n in g.nodes if n.op != "output"] for g in self.graphs]


def _traced(module: nn.Module, input_shape: tuple[int, ...], where: str, key: object) -> _Trace:
    """The trace of ``module``; from :data:`_TRACES` when ``key`` was traced before in this
    process."""
    if key is not None and key in _TRACES:
        return _TRACES[key]
    graphs, dtype, shapes = [], None, []
    for traced in trace_modes(module, where):
        probed_dtype, probed = _probe(traced, input_shape, where)
        dtype = dtype or probed_dtype
        graph, copies = fx.Graph(), {}
        graph.output(graph.graph_copy(traced.graph, copies))
        graphs.append(graph)
        shapes.append({copies[n]: s for n, s in probed.items() if n in copies})
    result = _Trace(tuple(graphs), dtype, tuple(shapes))
    if key is not None:
        _TRACES[key] = result
    return result


def _reason_in_modes(
    modes: Sequence[Sequence[fx.Node]],
    positions: Sequence[int],
    shapes: Sequence[dict[fx.Node, list]],
) -> str | None:
    """Why a cut at ``positions`` (one per mode's nodes) is not a split point, or None: a
    reason in either mode, or values crossing it that differ between the modes."""
    for nodes, position, seen in zip(modes, positions, shapes, strict=True):
        reason = _reason(nodes, position, seen)
        if reason:
            return reason
    if len(modes) == 1:
        return None
    sent = [
        [(_owners(n), seen[n]) for n in crossing(nodes, p)]
        for nodes, p, seen in zip(modes, positions, shapes, strict=True)
    ]
    if sent[0] != sent[1]:
        return (
            f"what crosses it differs between train mode ({len(sent[0])} values) and eval "
            f"mode ({len(sent[1])})"
        )
    return None


def _chosen_cuts(
    module: nn.Module,
    modes: Sequence[Sequence[fx.Node]],
    where: str,
    cut_points: Sequence[str] | None,
    cut: str | None,
    reason: Callable[[Cut], str | None],
) -> tuple[list[Cut], Cut | None]:
    """The cuts asked for (or found: the top-level children a split is allowed after) and the
    default cut; each checked with ``reason``."""
    found = [] if cut_points else [(c, reason(c)) for c in top_level_cuts(module, modes[0])]
    cuts = [Cut.parse(c) for c in cut_points] if cut_points else [c for c, r in found if not r]
    default = Cut.parse(cut) if cut else None
    if default is not None and default not in cuts:
        if cut_points:
            raise GraphSplitError(
                f"{where}: cut {cut!r} is not one of cut_points {list(cut_points)}"
            )
        cuts.append(default)
    if not cuts and found:  # the first child's reason, for a model none of whose children do
        raise GraphSplitError(
            f"{where}: no top-level child is a split point (after {str(found[0][0])!r}: "
            f"{found[0][1]})"
        )
    for c in cuts:
        why = reason(c)
        if why:
            raise GraphSplitError(f"{where}: cut {str(c)!r} is not a split point: {why}")
    return cuts, default


def _cut_model(
    module: nn.Module,
    traced: _Trace,
    where: str,
    cut_points: Sequence[str] | None,
    cut: str | None,
) -> BlockModel:
    """:func:`graph_block_model` on the ``traced`` graphs of ``module``."""
    modes = traced.modes()

    def positions(c: Cut) -> list[int]:  # where ``c`` falls in each mode's nodes
        return [_past_unpacking(nodes, cut_position(nodes, c, where)) for nodes in modes]

    def reason(c: Cut) -> str | None:
        return _reason_in_modes(modes, positions(c), traced.shapes)

    cuts, default = _chosen_cuts(module, modes, where, cut_points, cut, reason)
    cuts.sort(key=positions)
    per_mode = [list(ps) for ps in zip(*map(positions, cuts), strict=True)]
    if not cuts or any(ps != sorted(set(ps)) for ps in per_mode):
        raise GraphSplitError(
            f"{where}: cut points {[str(c) for c in cuts] or '(none found)'} must name "
            "distinct places in forward (at least one)"
        )
    names = [str(c) for c in cuts]
    split = [partition(g, ps) for g, ps in zip(traced.graphs, per_mode, strict=True)]
    per_piece = list(zip(*split, strict=True))
    _keep_unused(module, per_piece)
    pieces = [piece_module(module, graphs) for graphs in per_piece]
    tied = _tied(pieces, names)
    if tied:
        raise GraphSplitError(f"{where}: {tied}")
    default_index = names.index(str(default)) + 1 if default is not None else None
    model = BlockModel(pieces, range(1, len(pieces)), where, default_cut=default_index)
    model.cut_names, model.input_dtype, model.origin = tuple(names), traced.dtype, "graph"
    model.train(module.training)
    return model

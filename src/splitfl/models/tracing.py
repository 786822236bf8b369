"""A user's ``nn.Module`` as ``torch.fx`` graphs: one per train/eval mode where they differ,
with the submodules fx cannot trace recorded as calls, and the GraphModule that runs the
graph of its mode.

Two patterns of research code stop a plain ``fx.symbolic_trace`` (issue 48, item 7):

* **Shape arithmetic** in a submodule's forward — ShuffleNetV2's channel shuffle
  ``x.view(N, g, int(C / g), H, W)``, its ``int(x.size(1) * ratio)`` split: fx hands the
  forward a ``Proxy`` for each size, and ``int(Proxy)`` fails. The tracer here
  (:class:`_Tracer`, fx's own ``Tracer.is_leaf_module`` hook) then records every module of
  that class as one ``call_module`` node and traces again: the module runs as itself, its
  own Python, at whatever batch size — exact, as ``nn.Conv2d`` is to fx. What cannot be run
  whole is the user's own top-level forward: a failure there is still the one-line refusal.
* **Train/eval branches** outside module calls — EfficientNet's drop-connect under
  ``if self.training``, ``F.dropout(training=self.training)``: fx records the branch taken,
  so one graph holds one mode. The forward is traced in each mode; where the two graphs
  differ, each piece is a :class:`ModeGraphModule`, which holds the user's modules once and
  runs the train graph or the eval graph as its ``training`` flag says — ``train()`` and
  ``eval()`` switch it as they switch ``nn.Dropout``.

Both keep what fx gives the rest of :mod:`splitfl.models.graph`: module calls (BatchNorm
updates its own running statistics, in place, in train mode), the ops of the user's forward
in its order (dropout and drop-connect draw from the RNG as the user's model does) and the
user's modules, parameters and buffers themselves under their paths. ``torch.export``
(non-strict, dynamic batch) traces both patterns too, but as ATen ops with the mode baked in
(its module refuses ``.eval()``), the parameters lifted to graph inputs and no module calls
left to name a cut by (ARCHITECTURE.md).
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any, NoReturn

from torch import fx, nn


class GraphSplitError(ValueError):
    """A model cannot be traced or cut where asked; ``str(err)`` is one line."""


class _Untraceable(Exception):
    """fx failed: ``reason`` (one line) in the forward of ``module`` (None: the root's own)."""

    def __init__(self, reason: str, module: nn.Module | None):
        super().__init__(reason)
        self.reason, self.module = reason, module


class _Tracer(fx.Tracer):
    """fx's tracer, recording modules of the classes in ``leaves`` as calls, and the
    innermost module whose forward raised (``failure``)."""

    def __init__(self, leaves: set[type]):
        super().__init__()
        self.leaves = leaves
        self.failure: tuple[BaseException, nn.Module] | None = None

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return type(m) in self.leaves or super().is_leaf_module(m, module_qualified_name)

    def call_module(
        self,
        m: nn.Module,
        forward: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception as err:
            if self.failure is None or self.failure[0] is not err:  # the innermost sees it first
                self.failure = (err, m)
            raise


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def _trace_once(module: nn.Module, leaves: set[type], fixed: dict | None) -> fx.GraphModule:
    """``module``'s forward in its current mode, traced by :class:`_Tracer`; raises
    :class:`_Untraceable` naming the module fx failed in."""
    tracer = _Tracer(leaves)
    try:
        graph = tracer.trace(module, concrete_args=fixed)
    except Exception as err:  # fx raises many kinds; each is a reason the forward cannot trace
        inner = tracer.failure[1] if tracer.failure and tracer.failure[0] is err else None
        if inner is not None and (type(inner) in leaves or tracer.is_leaf_module(inner, "")):
            inner = None  # already recorded as a call: nothing left to run whole
        raise _Untraceable(_first_line(err), inner) from None
    return fx.GraphModule(tracer.root, graph, type(module).__name__)


def trace_modes(module: nn.Module, where: str) -> tuple[fx.GraphModule, ...]:
    """``module``'s forward as fx graphs over ``module`` (arguments after the first with a
    default are fixed to it): the train-mode graph, then the eval-mode graph where its code
    differs. Submodules whose forward fx cannot trace become calls (by class); a forward of
    the model's own that fx cannot trace is a :class:`GraphSplitError`."""
    params = list(inspect.signature(module.forward).parameters.values())
    fixed = {p.name: p.default for p in params[1:] if p.default is not p.empty} or None
    was_training = module.training
    leaves: set[type] = set()
    try:
        while True:
            try:
                graphs = []
                for mode in (True, False):
                    module.train(mode)
                    graphs.append(_trace_once(module, leaves, fixed))
                break
            except _Untraceable as err:
                if err.module is None:
                    raise GraphSplitError(
                        f"{where} cannot be traced by torch.fx: {err.reason} (in the model's "
                        "own forward; only a submodule fx cannot trace can run whole)"
                    ) from None
                leaves.add(type(err.module))  # run whole from now on; trace again
    finally:
        module.train(was_training)
    for graph in graphs:
        graph.train(was_training)
    return (graphs[0],) if graphs[0].code == graphs[1].code else tuple(graphs)


class ModeGraphModule(fx.GraphModule):
    """A GraphModule with one graph per mode over one set of modules: ``graph`` runs in train
    mode, ``eval_graph`` in eval mode, as ``self.training`` says. Both read the same modules,
    parameters and buffers, installed once under their paths as GraphModule installs them, so
    its ``state_dict`` is that of one piece."""

    def __init__(
        self,
        root: nn.Module,
        graph: fx.Graph,
        eval_graph: fx.Graph,
        class_name: str = "GraphModule",
    ):
        reads = fx.Graph()  # what either graph reads, for GraphModule to install
        for g in (graph, eval_graph):
            for n in g.nodes:
                if n.op in ("get_attr", "call_module"):
                    reads.get_attr(n.target)
        reads.output(None)
        super().__init__(root, reads, class_name)
        self.eval_graph = eval_graph
        self.graph = graph  # compiles the forward of each mode (recompile)

    def recompile(self) -> fx.graph.PythonCode:
        """The train graph's code (GraphModule's ``forward``), the eval graph's, and the
        ``forward`` that runs the one of the current mode."""
        code = super().recompile()
        eval_graph = self.__dict__.get("eval_graph")  # None while GraphModule initialises
        if eval_graph is not None:
            cls = type(self)  # fx makes a class per instance; its forward is this one's own
            cls.train_forward = cls.forward
            cls.eval_forward = type(fx.GraphModule(self, eval_graph)).forward
            cls.forward = _forward_of_mode
        return code

    def __deepcopy__(self, memo: dict) -> ModeGraphModule:
        res = super().__deepcopy__(memo)  # every module, parameter and buffer; the train graph
        res.eval_graph = copy.deepcopy(self.eval_graph, memo)
        res.recompile()
        return res

    def __copy__(self) -> ModeGraphModule:
        res = ModeGraphModule(self, self.graph, self.eval_graph, type(self).__name__)
        res.meta = getattr(self, "meta", {})
        return res

    def __reduce__(self) -> NoReturn:
        raise TypeError(
            "a ModeGraphModule (a split piece with one graph per mode) is not pickled; "
            "save its state_dict"
        )


def _forward_of_mode(self: ModeGraphModule, *args: Any, **kwargs: Any) -> Any:
    forward = self.train_forward if self.training else self.eval_forward
    return forward(*args, **kwargs)

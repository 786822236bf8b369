"""Registry of block-list models by short name (``model: resnet8`` in a config), and the
model-builder contract shared by registered builders and ``model: package.module:callable``
import paths (:mod:`splitfl.extensions`).

A builder is called with ``input_shape`` and ``num_classes`` where its signature takes them
(by those names, or as its first two positional parameters), and returns any ``nn.Module``
(split by its graph at the config's ``split`` module paths, :mod:`splitfl.models.graph`), a
:class:`BlockModel`, an ``nn.Sequential`` or a list of modules. A Sequential or a list
becomes one block per top-level child; its candidate cut points are every block boundary,
or the ``cut_points`` attribute set on the returned Sequential (a BlockModel declares its
own, and its ``default_cut``)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from splitfl.config.choices import unknown_choice
from splitfl.models.base import BlockModel, parameter_free_cuts
from splitfl.models.graph import GraphSplitError, graph_block_model

Builder = Callable[..., Any]


@dataclass(frozen=True)
class Split:
    """Where a model with its own forward is cut (``split:`` in a config): module paths."""

    cut_points: tuple[str, ...] | None = None
    cut: str | None = None

    @classmethod
    def of(cls, config: Any) -> Split:
        """From a config's ``split`` section (anything with ``cut_points`` and ``cut``)."""
        points = getattr(config, "cut_points", None)
        return cls(None if points is None else tuple(points), getattr(config, "cut", None))


NO_SPLIT = Split()  # a model's own or default cut points


class ModelContractError(ValueError):
    """A builder broke the contract (returned something else, too few blocks, bad cut
    points); ``str(err)`` is one line naming the builder."""


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: ``builder(input_shape, num_classes) -> BlockModel``."""

    name: str
    builder: Builder
    description: str


MODELS: dict[str, ModelSpec] = {}


def register_model(
    name: str, description: str = "", *, replace: bool = False
) -> Callable[[Builder], Builder]:
    """Decorator adding ``builder`` to :data:`MODELS` under ``name`` (``model: name`` in a
    config). A name already registered (a built-in such as ``cnn_digits`` included) is a
    ``ValueError`` unless ``replace=True``; names hold no ``:`` (that marks an import path)."""
    if not isinstance(name, str) or not name or ":" in name:
        raise ValueError(f"model name must be a non-empty string without ':' (got {name!r})")

    def wrap(builder: Builder) -> Builder:
        old = MODELS.get(name)
        if old is not None and old.builder is not builder and not replace:
            raise ValueError(
                f"model {name!r} is already registered ({_where(old.builder)}); "
                "pick another name or pass replace=True"
            )
        MODELS[name] = ModelSpec(name, builder, description or _first_line(builder))
        return builder

    return wrap


def _where(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)}"


def _first_line(fn: Any) -> str:
    return (inspect.getdoc(fn) or "").strip().split("\n")[0]


def model_names() -> list[str]:
    _load_zoo()
    return sorted(MODELS)


def call_builder(builder: Builder, input_shape: tuple[int, ...], num_classes: int) -> Any:
    """``builder`` called with ``input_shape``/``num_classes`` where it takes them: by those
    names (or ``**kwargs``), else as its first two positional parameters, else not at all."""
    try:
        params = inspect.signature(builder).parameters.values()
    except (TypeError, ValueError):  # no signature to read (a C callable): the old contract
        return builder(input_shape, num_classes)
    facts = {"input_shape": input_shape, "num_classes": num_classes}
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return builder(**facts)
    named = {p.name for p in params if p.kind is not p.POSITIONAL_ONLY} & set(facts)
    if named:
        return builder(**{k: facts[k] for k in named})
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(positional) >= 2:
        return builder(input_shape, num_classes)
    return builder()


def as_block_model(
    obj: Any,
    where: str,
    input_shape: tuple[int, ...] = (),
    split: Split = NO_SPLIT,
    key: object = None,
) -> BlockModel:
    """``obj`` as a :class:`BlockModel`: itself; one block per child of an ``nn.Sequential``
    / list of modules, with the Sequential's ``cut_points`` attribute or every block boundary
    as candidate cut points; any other ``nn.Module`` split by its graph at ``split``'s module
    paths (:func:`~splitfl.models.graph.graph_block_model`). Raises
    :class:`ModelContractError`."""
    block_list = isinstance(obj, BlockModel | nn.Sequential | nn.ModuleList | list | tuple)
    if block_list and (split.cut_points or split.cut):
        raise ModelContractError(
            f"split.cut_points/split.cut name modules of a model with its own forward; {where} "
            "is a block list: give its cut points as indices (options.<algorithm>.cut)"
        )
    if isinstance(obj, BlockModel):
        return trainable_cuts(obj, where, declared=True)
    if isinstance(obj, nn.Module) and not block_list:
        try:
            model = graph_block_model(obj, input_shape, where, split.cut_points, split.cut, key)
        except GraphSplitError as err:
            raise ModelContractError(str(err)) from None
        return trainable_cuts(model, where, declared=split.cut_points is not None, cut=split.cut)
    blocks = list(obj) if block_list else None
    if blocks is None or not all(isinstance(b, nn.Module) for b in blocks):
        raise ModelContractError(
            f"{where} returned {type(obj).__name__}; expected an nn.Module, an nn.Sequential "
            "or a list of nn.Modules (one block each)"
        )
    if len(blocks) < 2:
        raise ModelContractError(f"{where} returned {len(blocks)} block(s); a split needs >= 2")
    cuts = getattr(obj, "cut_points", None)
    try:
        model = BlockModel(blocks, range(1, len(blocks)) if cuts is None else cuts)
    except (TypeError, ValueError) as err:
        raise ModelContractError(f"{where}: {err}") from None
    model.origin = "sequential"
    return trainable_cuts(model, where, declared=cuts is not None)


def trainable_cuts(
    model: BlockModel, where: str, declared: bool, cut: str | None = None
) -> BlockModel:
    """``model`` with cut points that leave trainable parameters on both sides. Found ones
    (every block boundary of a Sequential, every top-level child of a graph) that do not are
    dropped — none may be left: such a model trains whole only, and an algorithm that splits
    it is refused (:func:`~splitfl.experiment.model_check.check_splittable`); a declared one
    (``cut_points``, ``split.cut_points``/``split.cut``), no cut points declared at all and a
    model without trainable parameters are a :class:`ModelContractError`."""
    if not model.cut_points:
        raise ModelContractError(f"{where}: no cut points (a split needs at least one)")
    free = parameter_free_cuts(model)
    named = dict(zip(model.cut_points, model.cut_names, strict=False))
    for c, side in free.items():
        if declared or (cut is not None and c == model.default_cut):
            raise ModelContractError(
                f"{where}: cut {named.get(c, c)!r} leaves its {side} without trainable "
                "parameters (nothing to train there); cut after a layer with parameters"
            )
    keep = [c for c in model.cut_points if c not in free]
    if not any(p.requires_grad for p in model.parameters()):
        raise ModelContractError(f"{where} has no trainable parameters")
    if model.cut_names:
        model.cut_names = tuple(named[c] for c in keep)
    if model.default_cut in free:
        model.default_cut = keep[-1] if keep else None
    model.cut_points = tuple(keep)  # none left: the model trains whole only (FedAvg)
    return model


def make_model(
    builder: Builder,
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    split: Split = NO_SPLIT,
) -> BlockModel:
    """Call ``builder`` under the builder contract; the model is named ``name``."""
    built = call_builder(builder, tuple(input_shape), int(num_classes))
    key = (builder, tuple(input_shape), int(num_classes))  # what the built structure follows
    model = as_block_model(built, name, tuple(input_shape), split, key)
    model.name = name
    return model


def build_model(
    name: str, input_shape: tuple[int, ...], num_classes: int, split: Split = NO_SPLIT
) -> BlockModel:
    """Build registered model ``name`` for per-sample ``input_shape`` and ``num_classes``."""
    _load_zoo()
    if name not in MODELS:
        raise KeyError(f"model: {unknown_choice(name, sorted(MODELS))}")
    return make_model(MODELS[name].builder, name, input_shape, num_classes, split)


def _load_zoo() -> None:
    import splitfl.models.zoo  # noqa: F401  (registers the models)

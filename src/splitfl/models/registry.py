"""Registry of block-list models by short name (``model: resnet8`` in a config)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from splitfl.models.base import BlockModel

Builder = Callable[[tuple[int, ...], int], BlockModel]


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: ``builder(input_shape, num_classes) -> BlockModel``."""

    name: str
    builder: Builder
    description: str


MODELS: dict[str, ModelSpec] = {}


def register_model(name: str, description: str) -> Callable[[Builder], Builder]:
    """Decorator adding a builder to :data:`MODELS` under ``name``."""

    def wrap(builder: Builder) -> Builder:
        MODELS[name] = ModelSpec(name, builder, description)
        return builder

    return wrap


def model_names() -> list[str]:
    _load_zoo()
    return sorted(MODELS)


def build_model(name: str, input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """Build registered model ``name`` for per-sample ``input_shape`` and ``num_classes``."""
    _load_zoo()
    if name not in MODELS:
        raise KeyError(f"unknown model {name!r}; choose one of {', '.join(sorted(MODELS))}")
    model = MODELS[name].builder(tuple(input_shape), int(num_classes))
    model.name = name
    return model


def _load_zoo() -> None:
    import splitfl.models.zoo  # noqa: F401  (registers the models)

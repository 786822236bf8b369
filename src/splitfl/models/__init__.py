"""Block-list models, their split into device/server parts, and per-block cost profiles."""

from splitfl.models.base import BlockModel, ModelPart, block_index, split
from splitfl.models.profile import BlockCost, ModelProfile, profile_model
from splitfl.models.registry import MODELS, build_model, model_names

__all__ = [
    "MODELS",
    "BlockCost",
    "BlockModel",
    "ModelPart",
    "ModelProfile",
    "block_index",
    "build_model",
    "model_names",
    "profile_model",
    "split",
]

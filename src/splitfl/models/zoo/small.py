"""Small models for the embedded digits data (8×8 grey images, 10 classes)."""

from __future__ import annotations

from torch import nn

from splitfl.models.base import BlockModel
from splitfl.models.registry import register_model


@register_model("mlp", "MLP for flat or image inputs: flatten, 3 hidden layers of 128, classifier")
def mlp(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    size = 1
    for d in input_shape:
        size *= d
    blocks = [
        nn.Sequential(nn.Flatten(), nn.Linear(size, 128), nn.ReLU()),
        nn.Sequential(nn.Linear(128, 128), nn.ReLU()),
        nn.Sequential(nn.Linear(128, 128), nn.ReLU()),
        nn.Linear(128, num_classes),
    ]
    return BlockModel(blocks, cut_points=(1, 2, 3))


@register_model("cnn_digits", "small CNN for 8x8 digits: 3 conv blocks (BN) + 2 FC blocks")
def cnn_digits(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    if len(input_shape) != 3:
        raise ValueError(f"needs image inputs [C, H, W], got {list(input_shape)}")
    channels = input_shape[0]
    blocks = [
        nn.Sequential(nn.Conv2d(channels, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()),
        nn.Sequential(
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2)
        ),
        nn.Sequential(
            nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2)
        ),
        nn.Sequential(nn.Flatten(), _fc_in(64, input_shape)),
        nn.Linear(128, num_classes),
    ]
    return BlockModel(blocks, cut_points=(1, 2, 3))


def _fc_in(channels: int, input_shape: tuple[int, ...]) -> nn.Sequential:
    h, w = input_shape[1] // 4, input_shape[2] // 4
    return nn.Sequential(nn.Linear(channels * h * w, 128), nn.ReLU())

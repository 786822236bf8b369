"""MobileNet V1 for 32×32 inputs (the CIFAR MobileNet used as S²FL's reference), 15 blocks."""

from __future__ import annotations

from torch import nn

from splitfl.models.base import BlockModel
from splitfl.models.registry import register_model

# 13 depthwise-separable blocks: out_channels or (out_channels, stride)
_CFG = [64, (128, 2), 128, (256, 2), 256, (512, 2), 512, 512, 512, 512, 512, (1024, 2), 1024]


def _dw_separable(in_channels: int, out_channels: int, stride: int) -> nn.Sequential:
    """Depthwise 3×3 conv + BN + ReLU, then pointwise 1×1 conv + BN + ReLU."""
    return nn.Sequential(
        nn.Conv2d(in_channels, in_channels, 3, stride, 1, groups=in_channels, bias=False),
        nn.BatchNorm2d(in_channels),
        nn.ReLU(),
        nn.Conv2d(in_channels, out_channels, 1, 1, 0, bias=False),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
    )


@register_model(
    "mobilenet",
    "MobileNet V1 for CIFAR: conv 3→32 s1, 13 depthwise-separable blocks to 1024, avgpool+FC; "
    "15 blocks",
)
def mobilenet(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """MobileNet V1 for 32×32 images (the common CIFAR variant), 15 blocks.

    Blocks: 0 stem conv3x3 C→32 stride 1 (no bias) + BN + ReLU; 1–13 depthwise-separable blocks
    with widths/strides ``[64, (128,2), 128, (256,2), 256, (512,2), 512×5, (1024,2), 1024]``;
    14 global average pool + flatten + FC 1024→classes. The global pool is adaptive (the
    reference uses ``avg_pool2d(2)`` on the final 2×2 map of a 32×32 input: identical there; a
    28×28 input also ends at 2×2). Default PyTorch init.

    Cut points ``(4, 8, 12)``: the device holds the stem and the blocks up to the end of the
    128-channel stage (16×16 maps); to the second of the five 512-channel blocks (4×4); or to
    the end of the 512-channel stage (before the 1024-channel blocks). For 3×32×32 that is about
    17%, 45% and 86% of the training FLOPs and 1%, 17% and 50% of the parameters.
    """
    blocks: list[nn.Module] = [
        nn.Sequential(
            nn.Conv2d(input_shape[0], 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU()
        )
    ]
    in_channels = 32
    for item in _CFG:
        out_channels, stride = item if isinstance(item, tuple) else (item, 1)
        blocks.append(_dw_separable(in_channels, out_channels, stride))
        in_channels = out_channels
    blocks.append(
        nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(1024, num_classes))
    )
    return BlockModel(blocks, cut_points=(4, 8, 12))

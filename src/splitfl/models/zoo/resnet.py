"""CIFAR-style ResNets as block lists: ``resnet8`` (S²FL) and ``resnet18`` (RingSFL).

Both use the BasicBlock of ``ShenJinglong/StalRingSFL`` (two 3×3 conv+BN, ReLU after the
residual sum; a 1×1 conv+BN projection shortcut when the stride or width changes) and a global
*adaptive* average pool before the classifier, so that 28×28 inputs work too (for 32×32 inputs it
equals RingSFL's ``AvgPool2d(4)`` on the final 4×4 map). ReLUs are not in-place, so a block never
overwrites the activation it receives from the previous part.
"""

from __future__ import annotations

import torch
from torch import nn

from splitfl.models.base import BlockModel
from splitfl.models.registry import register_model
from splitfl.models.zoo._common import init_ringsfl


class BasicBlock(nn.Module):
    """ResNet basic block: conv3x3-BN-ReLU-conv3x3-BN, plus shortcut, then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.relu = nn.ReLU()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


def _stem(in_channels: int, width: int) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU()
    )


def _head(width: int, num_classes: int) -> nn.Sequential:
    return nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes))


@register_model(
    "resnet8",
    "CIFAR ResNet-8 (He et al. 6n+2, n=1): 16-ch stem, BasicBlocks at 16/32/64, avgpool+FC; "
    "5 blocks",
)
def resnet8(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """ResNet-8 for CIFAR (He et al. 2016, depth 6n+2 with n=1), 5 blocks.

    Blocks: 0 stem conv3x3 C→16 BN ReLU; 1 BasicBlock 16→16; 2 BasicBlock 16→32 (stride 2);
    3 BasicBlock 32→64 (stride 2); 4 global avgpool + flatten + FC 64→classes.

    Shortcuts use a 1×1 conv+BN projection where the shape changes (He et al.'s option B, as in
    the RingSFL ResNet-18) rather than the paper's zero-padding option A. Init: Kaiming fan_out
    convs, BN 1/0 (as RingSFL's ResNet-18), default Linear.

    Cut points ``(1, 2, 3)`` (S²FL's Wc1 < Wc2 < Wc3): device holds the stem; stem + the 16-ch
    stage; stem + the 16- and 32-ch stages. The largest (64-ch) stage and the head always stay
    on the server. For 3×32×32 that is about 2%, 41% and 70% of the training FLOPs.
    """
    blocks = [
        _stem(input_shape[0], 16),
        BasicBlock(16, 16, 1),
        BasicBlock(16, 32, 2),
        BasicBlock(32, 64, 2),
        _head(64, num_classes),
    ]
    model = BlockModel(blocks, cut_points=(1, 2, 3))
    init_ringsfl(model, linear=False)
    return model


@register_model(
    "resnet18",
    "CIFAR ResNet-18 as in RingSFL: stem conv3x3 →64, 8 BasicBlocks 64..512, avgpool+FC; 10 blocks",
)
def resnet18(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """ResNet-18 for CIFAR exactly as RingSFL's ``ResNet18_Cifar``, 10 blocks.

    Blocks: 0 stem conv3x3 C→64 BN ReLU; 1–8 BasicBlocks 64, 64, 128 (s2), 128, 256 (s2), 256,
    512 (s2), 512; 9 avgpool + flatten + FC 512→classes (adaptive pool instead of
    ``AvgPool2d(4)``: identical for 32×32, also works for 28×28). Init as RingSFL: Kaiming
    fan_out convs, BN 1/0, default Linear.

    Cut points ``(3, 5, 7)``: the device holds the stem plus the 64-, 128- or 256-channel stage
    (ends of the residual stages); the 512-channel stage and head stay on the server. For
    3×32×32 that is about 27%, 52% and 76% of the training FLOPs.
    """
    widths = [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2),
              (256, 256, 1), (256, 512, 2), (512, 512, 1)]  # fmt: skip
    blocks = [_stem(input_shape[0], 64)]
    blocks += [BasicBlock(i, o, s) for i, o, s in widths]
    blocks.append(_head(512, num_classes))
    model = BlockModel(blocks, cut_points=(3, 5, 7))
    init_ringsfl(model, linear=False)
    return model


@register_model(
    "resnet18_fsl_sage",
    "ResNet-18 as FSL-SAGE's code splits it: torchvision stem (7x7 s2 conv, maxpool), "
    "8 BasicBlocks, avgpool+FC; cut after layer2; 10 blocks",
)
def resnet18_fsl_sage(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """ResNet-18 of FSL-SAGE's repository (``src/models/resnet.py``: ``ResNetClient`` =
    conv1 7×7 stride 2 + BN + ReLU + maxpool 3×3 stride 2, ``layer1``, ``layer2``;
    ``ResNetServer`` = ``layer3``, ``layer4``, avgpool, fc), torchvision's architecture with
    its ImageNet stem even for 32×32 CIFAR-10 (a 128×4×4 cut). 10 blocks: 0 stem; 1–8
    BasicBlocks 64, 64, 128 (s2), 128, 256 (s2), 256, 512 (s2), 512; 9 avgpool + FC.

    Cut points ``(3, 5, 7)``; default 5 (after ``layer2``, FSL-SAGE's split). Init as
    torchvision (Kaiming fan-out convs, BN 1/0, default Linear).
    """
    stem = nn.Sequential(
        nn.Conv2d(input_shape[0], 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    )
    widths = [(64, 64, 1), (64, 64, 1), (64, 128, 2), (128, 128, 1), (128, 256, 2),
              (256, 256, 1), (256, 512, 2), (512, 512, 1)]  # fmt: skip
    blocks = [stem, *(BasicBlock(i, o, s) for i, o, s in widths), _head(512, num_classes)]
    model = BlockModel(blocks, cut_points=(3, 5, 7), default_cut=5)
    init_ringsfl(model, linear=False)
    return model

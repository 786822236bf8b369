"""VGG-16 with BatchNorm as 16-block lists: ``vgg16`` (RingSFL) and ``vgg16_cifar`` (FedMR).

Both share the 13 conv blocks of RingSFL's ``VGG16_Cifar`` (conv3x3 pad 1 + BN + ReLU, with a
2×2 max-pool inside blocks 2, 4, 7, 10 and 13, 1-based). The pools use ``ceil_mode=True``: for
32×32 inputs every map has even size so this is identical to the released code, and it lets
28×28 inputs (MNIST/FEMNIST) reach a 1×1 map instead of an empty one (28→14→7→4→2→1).
"""

from __future__ import annotations

from torch import nn

from splitfl.models.base import BlockModel
from splitfl.models.registry import register_model
from splitfl.models.zoo._common import init_ringsfl, numel, output_shape

# (out_channels, pool after) of the 13 conv blocks
_CONV_CFG = [(64, False), (64, True), (128, False), (128, True), (256, False), (256, False),
             (256, True), (512, False), (512, False), (512, True), (512, False), (512, False),
             (512, True)]  # fmt: skip

VGG_CUT_POINTS = (4, 7, 10)


def _conv_blocks(in_channels: int) -> list[nn.Module]:
    blocks: list[nn.Module] = []
    for out_channels, pool in _CONV_CFG:
        layers = [
            nn.Conv2d(in_channels, out_channels, 3, 1, 1),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
        ]
        if pool:
            layers.append(nn.MaxPool2d(2, 2, ceil_mode=True))
        blocks.append(nn.Sequential(*layers))
        in_channels = out_channels
    return blocks


@register_model(
    "vgg16",
    "VGG-16-BN as in RingSFL: 13 conv blocks, AdaptiveAvgPool(7,7)+FC 25088→4096→4096→classes "
    "(~134M params); 16 blocks",
)
def vgg16(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """VGG-16-BN exactly as RingSFL's ``VGG16_Cifar`` (torchvision-style classifier), 16 blocks.

    Blocks 0–12: the 13 conv blocks. 13: AdaptiveAvgPool(7, 7) + flatten + FC 25088→4096 + ReLU
    + Dropout; 14: FC 4096→4096 + ReLU + Dropout; 15: FC 4096→classes. The adaptive pool
    replicates the 1×1 map of a 32×32 input to 7×7, so the first FC alone has 102.8M parameters
    (about 134M in all). Init as RingSFL: Kaiming fan_out convs, BN 1/0, Linear N(0, 0.01).

    Cut points ``(4, 7, 10)``: the device holds the 64- and 128-channel stages, plus the
    256-channel stage, plus the first 512-channel stage (ends of pooling stages).
    """
    blocks = _conv_blocks(input_shape[0])
    blocks += [
        nn.Sequential(
            nn.AdaptiveAvgPool2d((7, 7)),
            nn.Flatten(),
            nn.Linear(512 * 7 * 7, 4096),
            nn.ReLU(),
            nn.Dropout(),
        ),
        nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout()),
        nn.Linear(4096, num_classes),
    ]
    model = BlockModel(blocks, cut_points=VGG_CUT_POINTS)
    init_ringsfl(model, linear=True)
    return model


@register_model(
    "vgg16_cifar",
    "CIFAR VGG-16-BN as in FedMR (S²FL authors' group): 13 conv blocks, FC 512→4096→4096→classes "
    "(~33.6M params); 16 blocks",
)
def vgg16_cifar(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """CIFAR VGG-16-BN as in the FedMR repository (``HMHelloWorld/FedMR``, ``VGG16``), 16 blocks.

    The S²FL paper has no code; its authors' FedMR repository uses this VGG-16-BN. Blocks 0–12:
    the 13 conv blocks (512×1×1 for 32×32 input). 13: flatten + FC (512·h·w)→4096 + ReLU +
    Dropout; 14: FC 4096→4096 + ReLU + Dropout; 15: FC 4096→classes. No 7×7 pool, so the
    flatten size is 512 for 32×32 and for 28×28 inputs. Default PyTorch init (as FedMR).

    Cut points ``(4, 7, 10)``, as :func:`vgg16`: device part ≈ 0.26M / 1.7M / 7.6M of 33.6M
    parameters and about 29%, 57% and 86% of the training FLOPs for 3×32×32.
    """
    blocks = _conv_blocks(input_shape[0])
    flat = numel(output_shape(blocks, tuple(input_shape)))
    blocks += [
        nn.Sequential(nn.Flatten(), nn.Linear(flat, 4096), nn.ReLU(), nn.Dropout()),
        nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout()),
        nn.Linear(4096, num_classes),
    ]
    return BlockModel(blocks, cut_points=VGG_CUT_POINTS)

"""MergeSFL's other models: ``cnn_h`` (UCI HAR), ``cnn_s`` (Speech Commands), ``vgg16_image100``.

MergeSFL (paper §V-A) trains CNN-H on HAR, CNN-S on Speech Commands and VGG-16 on IMAGE-100;
the layer details below come from the released code (``ymliao98/MergeSFL``) as summarised in
the public-implementation facts. Each model is a block list whose cut points include the
released client/server split. Default PyTorch init, as the released code.
"""

from __future__ import annotations

from torch import nn

from splitfl.models.base import BlockModel
from splitfl.models.registry import register_model
from splitfl.models.zoo._common import numel, output_shape

CNN_H_MERGESFL_CUT = 2  # client = conv1, conv2
CNN_S_MERGESFL_CUT = 3  # client = the first three conv blocks
VGG_IMAGE100_MERGESFL_CUT = 13  # client = all 13 conv blocks


@register_model(
    "cnn_h",
    "MergeSFL CNN-H for UCI HAR (1x128x9): 3 conv blocks + FC 4096→1024→classes; 5 blocks",
)
def cnn_h(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """CNN-H of MergeSFL (paper §V-A; released code ``ymliao98/MergeSFL``), 5 blocks.

    Blocks (convs 3×3, stride 1, pad 1): 0 conv C→12 ReLU maxpool2 (12×64×4 for 1×128×9);
    1 conv 12→32 ReLU maxpool2 (32×32×2); 2 conv 32→64 ReLU (64×32×2); 3 flatten + FC
    (64·h·w)→1024 + ReLU + Dropout(0.5) (64×32×2 = 4096 for 1×128×9, computed from the input
    shape); 4 FC 1024→classes.

    Cut points ``(1, 2, 3)``; MergeSFL's split, the default cut, is cut 2 (§V-A: "split at
    the 3rd layer", the server's first; the released client holds the two first convs and
    sends 32×32×2 smashed data; the server runs conv3 and the FCs).
    """
    convs: list[nn.Module] = [
        nn.Sequential(nn.Conv2d(input_shape[0], 12, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(12, 32, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(32, 64, 3, 1, 1), nn.ReLU()),
    ]
    flat = numel(output_shape(convs, tuple(input_shape)))
    blocks = convs + [
        nn.Sequential(nn.Flatten(), nn.Linear(flat, 1024), nn.ReLU(), nn.Dropout(0.5)),
        nn.Linear(1024, num_classes),
    ]
    return BlockModel(blocks, cut_points=(1, CNN_H_MERGESFL_CUT, 3), default_cut=CNN_H_MERGESFL_CUT)


def _m5_block(c_in: int, c_out: int, kernel: int, stride: int = 1) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv1d(c_in, c_out, kernel, stride), nn.BatchNorm1d(c_out), nn.ReLU(), nn.MaxPool1d(4)
    )


@register_model(
    "cnn_s",
    "MergeSFL CNN-S for Speech Commands (1x16000): PyTorch-tutorial M5, 4 conv1d blocks + "
    "avgpool/FC; 5 blocks",
)
def cnn_s(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """CNN-S of MergeSFL (paper §V-A; released code), the PyTorch tutorial's M5, 5 blocks.

    M5 with ``n_channel=32``, ``stride=16``; every block conv1d + BatchNorm + ReLU + maxpool4:
    0 conv C→32 k80 s16 (32×249 for 1×16000); 1 conv 32→32 k3 (32×61); 2 conv 32→64 k3
    (64×14); 3 conv 64→64 k3 (64×3); 4 global average pool + flatten + FC 64→classes. Returns
    logits (the tutorial's ``log_softmax`` is left to the loss).

    Cut points ``(1, 2, 3)``; MergeSFL's split, the default cut, is cut 3 (§V-A: "split at the
    4th layer", the server's first; the released client holds the first three conv blocks and
    sends 64×14 smashed data).
    """
    blocks: list[nn.Module] = [
        _m5_block(input_shape[0], 32, 80, 16),
        _m5_block(32, 32, 3),
        _m5_block(32, 64, 3),
        _m5_block(64, 64, 3),
        nn.Sequential(nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(64, num_classes)),
    ]
    return BlockModel(blocks, cut_points=(1, 2, CNN_S_MERGESFL_CUT), default_cut=CNN_S_MERGESFL_CUT)


# (out_channels, maxpool padding or None) of the 13 conv blocks; the 4th pool has padding 1
_VGG_CFG = [(64, None), (64, 0), (128, None), (128, 0), (256, None), (256, None), (256, 0),
            (512, None), (512, None), (512, 1), (512, None), (512, None), (512, 0)]  # fmt: skip


@register_model(
    "vgg16_image100",
    "MergeSFL VGG-16-BN for IMAGE-100 (144x144 or 64x64): 13 conv blocks (4th pool pad 1) + "
    "FC (512·h·w)→4096→4096→classes; 16 blocks",
)
def vgg16_image100(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """VGG-16-BN of MergeSFL for IMAGE-100 (paper §V-A; released code), 16 blocks.

    Blocks 0–12: conv3×3 pad 1 + BN + ReLU, with a 2×2/2 max-pool (floor mode) inside blocks
    1, 3, 6, 9 and 12 (0-based); the 4th pool (block 9) has padding 1. 13: flatten + FC
    (512·h·w)→4096 + ReLU + Dropout; 14: FC 4096→4096 + ReLU + Dropout; 15: FC 4096→classes.
    The flatten size comes from the input shape: 512×5×5 = 12800 for 3×144×144 (the released
    setting: 144→72→36→18→10→5), 512×2×2 = 2048 for 3×64×64 (64→32→16→8→5→2), 512×1×1 for
    3×32×32.

    Cut points ``(7, 10, 13)`` (ends of the 256-channel stage, the first and the second
    512-channel stages); MergeSFL's split is cut 13 (client = the 13 convs, smashed data
    512×5×5 for 144×144).
    """
    blocks: list[nn.Module] = []
    c_in = input_shape[0]
    for c_out, pool_pad in _VGG_CFG:
        layers = [nn.Conv2d(c_in, c_out, 3, 1, 1), nn.BatchNorm2d(c_out), nn.ReLU()]
        if pool_pad is not None:
            layers.append(nn.MaxPool2d(2, 2, padding=pool_pad))
        blocks.append(nn.Sequential(*layers))
        c_in = c_out
    flat = numel(output_shape(blocks, tuple(input_shape)))
    blocks += [
        nn.Sequential(nn.Flatten(), nn.Linear(flat, 4096), nn.ReLU(), nn.Dropout()),
        nn.Sequential(nn.Linear(4096, 4096), nn.ReLU(), nn.Dropout()),
        nn.Linear(4096, num_classes),
    ]
    return BlockModel(blocks, cut_points=(7, 10, VGG_IMAGE100_MERGESFL_CUT))

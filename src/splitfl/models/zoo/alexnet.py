"""AlexNets: ``alexnet`` (MergeSFL, CIFAR, 8 blocks) and ``alexnet_mnist`` (RingSFL, 17 blocks)."""

from __future__ import annotations

from torch import nn

from splitfl.models.base import BlockModel
from splitfl.models.registry import register_model
from splitfl.models.zoo._common import numel, output_shape


@register_model(
    "alexnet",
    "8-layer CIFAR AlexNet as in MergeSFL: 5 conv blocks (3x3, ReLU; maxpool after 1, 2, 5) + "
    "3 FC blocks; "
    "8 blocks",
)
def alexnet(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """AlexNet for CIFAR as MergeSFL (``ymliao98/MergeSFL``), one block per layer, 8 blocks.

    Blocks (all convs 3×3, stride 1, pad 1): 0 conv C→64 ReLU maxpool2; 1 conv 64→192 ReLU
    maxpool2; 2 conv 192→384 ReLU; 3 conv 384→256 ReLU; 4 conv 256→256 ReLU maxpool2;
    5 flatten + Dropout + FC (256·h·w)→4096 + ReLU (256×4×4 = 4096 for 32×32, 256×3×3 for
    28×28); 6 Dropout + FC 4096→4096 + ReLU; 7 FC 4096→classes. Default PyTorch init.

    Cut points ``(2, 4, 5)``: the device holds conv1–2 (192×8×8 activation); conv1–4
    (256×8×8); or all five convs (MergeSFL's split, smashed data 256×4×4). For 3×32×32 that is
    about 15%, 64% and 83% of the training FLOPs.
    """
    c = input_shape[0]
    convs: list[nn.Module] = [
        nn.Sequential(nn.Conv2d(c, 64, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(64, 192, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2)),
        nn.Sequential(nn.Conv2d(192, 384, 3, 1, 1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(384, 256, 3, 1, 1), nn.ReLU()),
        nn.Sequential(nn.Conv2d(256, 256, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2)),
    ]
    flat = numel(output_shape(convs, tuple(input_shape)))
    blocks = convs + [
        nn.Sequential(nn.Flatten(), nn.Dropout(), nn.Linear(flat, 4096), nn.ReLU()),
        nn.Sequential(nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU()),
        nn.Linear(4096, num_classes),
    ]
    return BlockModel(blocks, cut_points=(2, 4, 5))


@register_model(
    "alexnet_mnist",
    "AlexNet for MNIST as in RingSFL: 5 conv + 3 FC, one layer per block; 17 blocks",
)
def alexnet_mnist(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """AlexNet for MNIST as RingSFL's ``AlexNet_Mnist``: 17 one-layer blocks.

    Blocks (convs 3×3, pad 1): 0 conv C→32; 1 maxpool2; 2 ReLU; 3 conv 32→64; 4 maxpool2;
    5 ReLU; 6 conv 64→128; 7 conv 128→256; 8 conv 256→256; 9 maxpool2; 10 ReLU; 11 flatten;
    12 FC 2304→1024 (256×3×3 for 28×28; computed from the input shape); 13 ReLU;
    14 FC 1024→512; 15 ReLU; 16 FC 512→classes. No ReLU after conv3 and conv4, as released.
    Default PyTorch init, as the released code.

    Cut points ``(6, 8, 11)``: the device holds conv1–2 with their pools and ReLUs (64×7×7
    activation); conv1–4 (256×7×7); or all five convs with the last pool and ReLU (256×3×3).
    For 1×28×28 that is about 7%, 41% and 95% of the training FLOPs.
    """
    convs: list[nn.Module] = [
        nn.Conv2d(input_shape[0], 32, 3, 1, 1),
        nn.MaxPool2d(2, 2),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, 1, 1),
        nn.MaxPool2d(2, 2),
        nn.ReLU(),
        nn.Conv2d(64, 128, 3, 1, 1),
        nn.Conv2d(128, 256, 3, 1, 1),
        nn.Conv2d(256, 256, 3, 1, 1),
        nn.MaxPool2d(2, 2),
        nn.ReLU(),
        nn.Flatten(),
    ]
    flat = numel(output_shape(convs, tuple(input_shape)))
    blocks = convs + [
        nn.Linear(flat, 1024),
        nn.ReLU(),
        nn.Linear(1024, 512),
        nn.ReLU(),
        nn.Linear(512, num_classes),
    ]
    return BlockModel(blocks, cut_points=(6, 8, 11))

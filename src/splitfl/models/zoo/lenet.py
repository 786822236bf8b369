"""LeNet-5 for MNIST as in RingSFL (``ShenJinglong/DistRingSFL``), one layer per block."""

from __future__ import annotations

from torch import nn

from splitfl.models.base import BlockModel
from splitfl.models.registry import register_model
from splitfl.models.zoo._common import numel, output_shape


@register_model(
    "lenet5", "LeNet-5 (RingSFL MNIST): 2 conv + avgpool, 3 FC, one layer per block; 12 blocks"
)
def lenet5(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """LeNet-5 as RingSFL's ``LeNet_Mnist``: 12 one-layer blocks.

    Blocks: 0 conv C→6 k5 p2; 1 ReLU; 2 avgpool2; 3 conv 6→16 k5; 4 ReLU; 5 avgpool2;
    6 flatten; 7 FC 400→120 (16×5×5 for 28×28; computed from the input shape); 8 ReLU;
    9 FC 120→84; 10 ReLU; 11 FC 84→classes. Default PyTorch init, as the released code.

    Cut points ``(3, 6, 9)``: the device holds conv1+pool (6×14×14 activation), both convs
    (16×5×5), or also FC1 (120 features).
    """
    convs: list[nn.Module] = [
        nn.Conv2d(input_shape[0], 6, 5, 1, 2),
        nn.ReLU(),
        nn.AvgPool2d(2, 2),
        nn.Conv2d(6, 16, 5),
        nn.ReLU(),
        nn.AvgPool2d(2, 2),
        nn.Flatten(),
    ]
    flat = numel(output_shape(convs, tuple(input_shape)))
    blocks = convs + [
        nn.Linear(flat, 120),
        nn.ReLU(),
        nn.Linear(120, 84),
        nn.ReLU(),
        nn.Linear(84, num_classes),
    ]
    return BlockModel(blocks, cut_points=(3, 6, 9))

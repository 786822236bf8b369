"""Helpers shared by the model zoo: weight initialisation and output-shape inference."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn


def init_ringsfl(model: nn.Module, linear: bool = True) -> None:
    """RingSFL (``ShenJinglong/StalRingSFL``) initialisation.

    Convolutions: Kaiming-normal, ``mode='fan_out'``, ReLU gain, bias 0. BatchNorm: weight 1,
    bias 0. Linear (only if ``linear``): weight ``N(0, 0.01)``, bias 0.
    """
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif linear and isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            nn.init.zeros_(m.bias)


@torch.no_grad()
def output_shape(modules: Iterable[nn.Module], input_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Per-sample output shape of ``modules`` run in order on one zero input of ``input_shape``.

    Runs in eval mode (BatchNorm running statistics stay untouched, Dropout draws no random
    numbers), so building a model with it consumes no randomness; training mode is restored.
    """
    x = torch.zeros(1, *input_shape)
    for m in modules:
        training = m.training
        m.eval()
        x = m(x)
        m.train(training)
    return tuple(x.shape[1:])


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n

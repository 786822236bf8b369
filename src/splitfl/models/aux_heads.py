"""Auxiliary models: the small networks that give a device a loss of its own (``aux_model``).

Auxiliary-model split learning trains the device part on a *local* loss so that devices need
not wait for the server's gradients. An auxiliary model maps a batch of smashed data (the
per-sample ``input_shape`` of the cut) to ``num_classes`` logits; its cross-entropy is the
local loss (LocFedMix-SL, CSE-FSL), or the gradient of that loss w.r.t. the smashed data is
the estimate of the server's cut-layer gradient (FSL-SAGE). Built-ins (name → builder):

* ``linear`` — flatten + one linear layer. CSE-FSL's official code (ECSE-FL repo,
  ``src/trains/model.py::Auxiliary_model_cifar``: ``nn.Linear(6*6*64, 10)`` then
  ``log_softmax``, with ``NLLLoss`` = cross-entropy of the logits); splitfl's LocFedMix-SL proxy.
* ``resnet_stage`` — one ResNet stage of two BasicBlocks doubling the channels at stride 2,
  global average pool, linear. FSL-SAGE's ResNet auxiliary (FSL-SAGE repo,
  ``src/models/aux_models/resnet.py::ResNetAuxiliary``: ``layer3`` of ResNet-18 from
  ``in_planes = 128``, ``avgpool``, ``fc``; Kaiming fan-out convs, BN 1/0) for a cut after
  ResNet-18's ``layer2``. Its ``log_softmax`` + ``NLLLoss`` is cross-entropy of the logits.

Your own: an import path ``package.module:callable`` (resolved by
:func:`splitfl.extensions.build_aux`), called with ``input_shape`` and ``num_classes`` where its
signature takes them, returning any ``nn.Module``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from torch import nn

from splitfl.models.flops import count_flops
from splitfl.models.zoo._common import init_ringsfl
from splitfl.models.zoo.resnet import BasicBlock

AuxBuilder = Callable[[tuple[int, ...], int], nn.Module]


def linear_aux(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """Flatten + linear (torch's default initialisation)."""
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


def resnet_stage_aux(input_shape: tuple[int, ...], num_classes: int) -> nn.Module:
    """FSL-SAGE's ResNet auxiliary for a ``[C, H, W]`` cut: BasicBlock C→2C (stride 2),
    BasicBlock 2C→2C, global average pool, linear 2C→classes."""
    if len(input_shape) != 3:
        raise ValueError(f"resnet_stage needs [C, H, W] smashed data (got {list(input_shape)})")
    c = input_shape[0]
    model = nn.Sequential(
        BasicBlock(c, 2 * c, 2),
        BasicBlock(2 * c, 2 * c, 1),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(2 * c, num_classes),
    )
    init_ringsfl(model, linear=False)  # Kaiming fan-out convs, BN 1/0, default Linear
    return model


#: Built-in auxiliary models by name.
AUX_MODELS: dict[str, AuxBuilder] = {"linear": linear_aux, "resnet_stage": resnet_stage_aux}


def aux_names() -> list[str]:
    return sorted(AUX_MODELS)


def aux_flops(module: torch.nn.Module, shape: tuple[int, ...], dtype: torch.dtype) -> float:
    """Forward + backward FLOPs per sample of ``module`` (a batch of 2 in train mode, the
    input's gradient included, as :mod:`splitfl.models.profile` measures blocks)."""
    probe = copy.deepcopy(module).train()
    x = torch.zeros(2, *shape, dtype=dtype, requires_grad=True)

    def step() -> None:
        probe(x).float().sum().backward()

    with torch.random.fork_rng(devices=[]):
        return count_flops(step) / 2

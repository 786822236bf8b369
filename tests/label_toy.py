"""The two-class toy of label inference (Li et al., ICLR 2022): shared by the attack tests
(tests/privacy) and the label-defence tests (tests/roles)."""

import torch
from torch import nn


def two_class_head_gradients(n=200, positives=20, seed=0):
    """The gradient a U-shaped server receives: ∂(mean CE of the device's head)/∂h for the
    middle's outputs h; the head is biased towards the common class (as a model trained on
    an imbalanced task is, Li et al. §3.1), ``positives`` samples are of class 1."""
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, 6, generator=gen).requires_grad_(True)
    head = nn.Linear(6, 2)
    with torch.no_grad():
        head.weight.copy_(0.1 * torch.randn(2, 6, generator=gen))
        head.bias.copy_(torch.tensor([1.5, -1.5]))
    y = torch.zeros(n, dtype=torch.long)
    y[torch.randperm(n, generator=gen)[:positives]] = 1
    loss = nn.functional.cross_entropy(head(h), y)
    (grad,) = torch.autograd.grad(loss, h)
    return grad, y

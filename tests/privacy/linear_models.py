"""A model whose device part is linear (``model: linear_models:linear_front``): UnSplit's
objective on its smashed data is convex with the input as its unique minimiser."""

from torch import nn


def linear_front() -> nn.Sequential:
    """Flatten, an 8×8 → 96 linear map with orthonormal columns (the device part at cut 2),
    then a ReLU MLP head on the server."""
    first = nn.Linear(64, 96)
    nn.init.orthogonal_(first.weight)
    return nn.Sequential(nn.Flatten(), first, nn.ReLU(), nn.Linear(96, 10))

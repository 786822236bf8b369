"""Local optimisers (``train.optimizer``): one constructor used by every device and server part.

* ``sgd`` (default; S²FL §5, MergeSFL §V-A) — ``torch.optim.SGD`` with ``train.momentum`` and
  ``train.weight_decay`` (L2 added to the gradient).
* ``adam`` — ``torch.optim.Adam`` with ``train.beta1``/``beta2``, ``train.eps`` (torch's
  defaults 0.9, 0.999, 1e-8) and ``train.weight_decay`` (L2 added to the gradient, torch's
  Adam semantics).
* ``adamw`` — ``torch.optim.AdamW``: the same moments with *decoupled* weight decay
  (Loshchilov & Hutter 2019); ``train.weight_decay`` is its coefficient (0 by default, not
  torch's 0.01, so that changing the optimiser changes nothing else).

Lifetime of the optimiser state: a device part's optimiser (and a group's server-side one) is
built when its client's local round starts and dropped when it ends (a pooled working copy's,
``roles/parts.py``, is kept and emptied instead: the same state), so SGD momentum buffers
and Adam's moments and step count restart every round — the state of what is aggregated is
the model alone (as the papers' FedAvg-style rounds, and what a resume reproduces exactly).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

#: ``train.optimizer`` values; the first is the default.
OPTIMIZERS = ("sgd", "adam", "adamw")


def make_optimizer(params: Iterable[torch.Tensor], lr: float, train) -> torch.optim.Optimizer:
    """The ``train.optimizer`` of ``train`` (a :class:`~splitfl.config.TrainConfig`) over
    ``params`` at learning rate ``lr``."""
    params = list(params)
    name = train.optimizer
    if name == "sgd":
        return torch.optim.SGD(
            params, lr=lr, momentum=train.momentum, weight_decay=train.weight_decay
        )
    if name in ("adam", "adamw"):
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        betas = (train.beta1, train.beta2)
        return cls(params, lr=lr, betas=betas, eps=train.eps, weight_decay=train.weight_decay)
    raise ValueError(f"unknown optimizer {name!r}; allowed: {', '.join(OPTIMIZERS)}")


def import_optimizers() -> None:
    """Build (and drop) one optimiser: the first optimiser a process builds imports
    ``torch._dynamo`` (2–4 s on a small CPU), which a run then pays at set-up rather than
    inside its first round."""
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)

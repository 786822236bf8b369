"""The lean plain PyTorch FedAvg loop that splitfl and its peers are measured against
(``bench_overhead.py``, ``bench_peers.py``): one model object and one working copy, reloaded
with ``load_state_dict`` for every client, a fresh SGD optimiser per client, the
|D_i|-weighted average (accumulated in float64, as splitfl's FedAvg does, so that both give
the same model bit for bit), the test evaluation every round.

It imports only torch: a peer runner's process pays for nothing else. Which clients train in
a round and on which mini-batches comes from the caller (``schedule(r)``), so the loop does
exactly the work of the run it is compared with.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

#: A client's round: (its weight |D_i|, its mini-batches of training-sample indices).
ClientRound = tuple[int, Sequence[torch.Tensor]]


def average(total: torch.Tensor, weight: float, dtype: torch.dtype) -> torch.Tensor:
    """A weighted sum divided by the total weight, in the state's dtype (integer buffers
    rounded)."""
    mean = total / weight
    return (mean if dtype.is_floating_point else torch.round(mean)).to(dtype)


def train_round(
    local: nn.Module,
    state: dict[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    clients: Sequence[ClientRound],
    lr: float,
) -> dict[str, torch.Tensor]:
    """One FedAvg round from ``state``: each client trains ``local`` (reloaded) with SGD on
    its batches; returns the weighted average of the trained states."""
    total = {k: torch.zeros_like(v, dtype=torch.float64) for k, v in state.items()}
    for weight, batches in clients:
        local.load_state_dict(state)
        local.train()
        opt = torch.optim.SGD(local.parameters(), lr=lr)
        for idx in batches:
            opt.zero_grad()
            F.cross_entropy(local(x[idx]), y[idx]).backward()
            opt.step()
        for k, v in local.state_dict().items():
            total[k] += weight * v.to(torch.float64)
    weight = sum(w for w, _ in clients)
    return {k: average(total[k], weight, state[k].dtype) for k in state}


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    """Test accuracy and mean cross-entropy of ``model`` on ``(x, y)`` in eval mode."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
        acc = (logits.argmax(1) == y).float().mean().item()
        loss = F.cross_entropy(logits, y).item()
    return acc, loss


def fedavg_rounds(
    model: nn.Module,
    train: tuple[torch.Tensor, torch.Tensor],
    test: tuple[torch.Tensor, torch.Tensor],
    schedule: Callable[[int], Sequence[ClientRound]],
    rounds: int,
    lr: float,
    clock: Callable[[], float] = time.perf_counter,
    before_round: Callable[[int], None] | None = None,
    after_round: Callable[[float], None] | None = None,
) -> tuple[list[float], dict[str, torch.Tensor], list[float]]:
    """``rounds`` FedAvg rounds from ``model``'s weights: each round's time (``clock``), the
    final state and each round's test accuracy. ``before_round(r)`` runs first in round ``r``
    (timed; e.g. seeding torch's stream as the framework compared with does),
    ``after_round(accuracy)`` last."""
    state = {k: v.clone() for k, v in model.state_dict().items()}
    local = copy.deepcopy(model)  # one working copy, reloaded for every client
    times, accs = [], []
    for r in range(rounds):
        start = clock()
        if before_round is not None:
            before_round(r)
        state = train_round(local, state, *train, schedule(r), lr)
        model.load_state_dict(state)
        accs.append(evaluate(model, *test)[0])
        times.append(clock() - start)
        if after_round is not None:
            after_round(accs[-1])
    return times, state, accs

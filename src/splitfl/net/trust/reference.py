"""The server's own update step, a yardstick for device updates that no peer median can
judge (:class:`~splitfl.net.trust.checks.PeerHistory`: a round of fewer than 3 updates or clusters
before 3 were accepted — the first round of a run of one or two ParallelSFL clusters, or of
two clients).

FLTrust (Cao et al., "FLTrust: Byzantine-robust Federated Learning via Trust
Bootstrapping", NDSS 2021, §IV) keeps a small *root dataset* on the server and trains the
global model on it each round; the server's own update bounds the magnitude of every client
update. Here the server trains a copy of the model it sent on its first
``network.bounds.reference_samples`` test samples (the samples it already holds for the
activation bound, whatever the devices hold; deterministic: the same slice in order, the
run's ``train`` optimiser at the round's learning rate, torch's random state restored
afterwards) for the round's local steps, and the distance per local step of the tensors a
device returned from where they were sent stands in for the round's median. An honest device
moves its part by steps of the same optimiser and learning rate, so
``peer_update_factor`` × the server's step leaves it the same room as the round's median; a
sign-flipped part moves 2 × its own norm.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable

import torch

from splitfl.config import TrainConfig
from splitfl.models import BlockModel
from splitfl.training.losses import loss_fn
from splitfl.training.optim import make_optimizer


class ServerStep:
    """The server's reference step for one round (module docstring): ``model`` is the model
    the server sent (left as it is: the server trains a copy), ``held`` its samples, ``steps``
    the round's local steps. Trained at most once, and only when asked (:meth:`distance`)."""

    def __init__(
        self,
        model: BlockModel,
        held: tuple[torch.Tensor, torch.Tensor],
        train: TrainConfig,
        lr: float,
        steps: int,
    ):
        device = next(model.parameters()).device
        self.x, self.y = (t.to(device) for t in held)
        self.model, self.train, self.lr, self.steps = model, train, lr, max(int(steps), 1)
        self._moved: dict[str, torch.Tensor] | None = None

    def move(self, names: Iterable[str]) -> dict[str, torch.Tensor]:
        """How far the server's own steps moved each parameter of ``names`` (float64; the
        direction check's ``g_0``, :mod:`splitfl.net.trust.direction`: FLTrust compares
        gradient steps, so buffers — BatchNorm's running statistics, which move toward each
        side's own data — are left out; an honest top part's cosine was −0.04 with them on
        the graph-split ParallelSFL run of the tests)."""
        moved, sent = self._trained(), self.model.state_dict()
        params = {k for k, _ in self.model.named_parameters()}
        return {k: moved[k].double() - sent[k].double() for k in names if k in params}

    def distance(self, names: Iterable[str]) -> float:
        """Distance per step of the tensors ``names`` after the server's own steps (buffers
        too: the norm checks measure every floating tensor)."""
        moved, sent = self._trained(), self.model.state_dict()
        total = 0.0
        for k in names:
            if k in moved and moved[k].is_floating_point():
                total += float((moved[k].double() - sent[k].double()).pow(2).sum())
        return total**0.5 / self.steps

    def _trained(self) -> dict[str, torch.Tensor]:
        """The model's state after :attr:`steps` optimiser steps on the held samples, in
        batches of ``train.batch_size`` taken in order (cycling)."""
        if self._moved is None:
            probe = copy.deepcopy(self.model).train()
            optimizer = make_optimizer(probe.parameters(), self.lr, self.train)
            criterion, n, size = loss_fn(self.train.loss), len(self.y), self.train.batch_size
            cuda = [self.x.device.index or 0] if self.x.is_cuda else []
            with torch.random.fork_rng(devices=cuda):
                for step in range(self.steps):
                    first = (step * size) % max(n, 1)
                    index = torch.arange(first, first + min(size, n)) % n
                    optimizer.zero_grad()
                    criterion(probe(self.x[index]), self.y[index]).backward()
                    optimizer.step()
            self._moved = {k: v.detach() for k, v in probe.state_dict().items()}
        return self._moved


def own_step(reference: ServerStep | None, names: Iterable[str]) -> Callable[[], float] | None:
    """The server's own step per local step over the tensors ``names``, when asked (None
    without a reference or names): :meth:`~splitfl.net.trust.checks.PeerHistory.outliers`'
    yardstick of last resort."""
    wanted = set(names)
    if reference is None or not wanted:
        return None
    return lambda: reference.distance(wanted)


def server_step(ctx, model: BlockModel, plan) -> ServerStep | None:
    """The server's own step on its first ``network.bounds.reference_samples`` test samples
    (:class:`ServerStep`; None with 0 or no tasks), at the round's learning rate and
    local steps (its most): trained only when a check asks (the direction check, or a peer
    check with no median to use)."""
    n = ctx.config.network.bounds.reference_samples
    if not n or not plan.tasks:
        return None
    test = ctx.bundle.test
    steps = max(t.steps for t in plan.tasks)
    return ServerStep(model, (test.x[:n], test.y[:n]), ctx.config.train, plan.tasks[0].lr, steps)

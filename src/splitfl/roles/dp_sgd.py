"""DP-SGD of the device part (``train.defence.dp_noise``), with Opacus.

Abadi et al., "Deep Learning with Differential Privacy" (CCS 2016), Alg. 1: each step, every
sample's gradient ``g_i`` of the device part's parameters is clipped to L2 norm ``C``
(``dp_clip``), the clipped gradients are summed, Gaussian noise ``N(0, σ²C²I)`` is added
(``σ``: ``dp_noise``, the noise multiplier) and the sum is divided by the batch size ``B``;
the optimiser steps on that. The privacy of the whole training is tracked by the moments
accountant, here Opacus's RDP accountant (Mironov, CSF 2017; Mironov, Talwar, Zhang,
"Rényi Differential Privacy of the Sampled Gaussian Mechanism", 2019), for sample rate
``q = B / n`` (``n``: the client's samples) and the stated ``δ`` (``dp_delta``).

The arithmetic is Opacus's (Yousefpour et al., "Opacus: User-Friendly Differential Privacy
Library in PyTorch", 2021): :class:`opacus.grad_sample.GradSampleHooks` computes the per-sample
gradients on the device part only (hooks on its layers; the server's part is not touched),
:class:`opacus.optimizers.DPOptimizer` clips, noises (from a generator seeded by the run's
seed) and averages them. In split learning the gradient a device back-propagates comes from
the server (``∂L/∂fx``, L the mean loss over the batch): Opacus's ``loss_reduction="mean"``
turns sample ``i``'s share of it into that sample's own gradient (× B) before clipping.

Where splitfl differs from the paper's setting, and says so: batches are the run's shuffled
mini-batches (``task_batches``), not Poisson-sampled lots, and the accountant is told
``q = B/n`` as Opacus's own non-Poisson loaders do; the reported ε is the usual
approximation for shuffled batches, not a proof for them. The guarantee covers what the
device part's training reveals (its uploaded weights and the smashed data it computes from
them after the step), per client, for that client's samples; it does not make the smashed
data of the current batch private (noise them with ``noise_std`` for that).
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Iterable

import torch
from torch import nn

from splitfl.config import ConfigError, DefenceConfig
from splitfl.core.extras import install_extra

# Opacus's hooks are full backward hooks; on a part's first layer, whose input needs no
# gradient, torch notes that the hook sees the output's gradient only: what Opacus reads.
warnings.filterwarnings(
    "ignore",
    message="Full backward hook is firing when gradients are computed with respect to module "
    "outputs since no inputs require gradients",
    category=UserWarning,
)

History = dict[int, list[tuple[float, int]]]


def dp_active(config: DefenceConfig) -> bool:
    """Whether DP-SGD is on (``dp_noise > 0``)."""
    return config.dp_noise > 0


def check_supported(module: nn.Module) -> None:
    """One line naming the first layer Opacus cannot give per-sample gradients for: a
    trainable layer with buffers, e.g. BatchNorm, whose statistics mix a batch's samples
    (Opacus's own ``GradSampleModule.validate`` rule); one line too when Opacus is not
    installed."""
    if importlib.util.find_spec("opacus") is None:
        raise ConfigError(
            "train.defence.dp_noise",
            f"DP-SGD needs the opacus package: {install_extra('privacy', 'opacus>=1.5')}",
        )
    for name, m in module.named_modules():
        own = any(p.requires_grad for p in m.parameters(recurse=False))
        if own and any(True for _ in m.buffers(recurse=False)):
            raise ConfigError(
                "train.defence.dp_noise",
                f"DP-SGD needs per-sample gradients; the device part's layer {name} "
                f"({type(m).__name__}) mixes the samples of a batch: use a model without it",
            )


class DeviceDPSGD:
    """DP-SGD of one client's device part for one round: :attr:`optimizer` is Opacus's
    :class:`~opacus.optimizers.DPOptimizer` around the client's optimiser; :meth:`capture`
    before a forward pass installs the per-sample gradient hooks, :meth:`release` after the
    step removes them (the part is left as it was, hooks and attributes gone)."""

    def __init__(
        self,
        module: nn.Module,
        optimizer: torch.optim.Optimizer,
        config: DefenceConfig,
        batch_size: int,
        seed: int,
    ):
        from opacus.optimizers import DPOptimizer

        check_supported(module)
        self.module = module
        like = next(module.parameters())
        gen = torch.Generator(device=like.device).manual_seed(seed)
        self.optimizer = DPOptimizer(
            optimizer,
            noise_multiplier=config.dp_noise,
            max_grad_norm=config.dp_clip,
            expected_batch_size=batch_size,
            loss_reduction="mean",
            generator=gen,
        )
        self._hooks = None

    def capture(self) -> None:
        """Hooks that record the per-sample gradients of the next forward/backward pass."""
        from opacus.grad_sample import GradSampleHooks

        self.release()
        self._hooks = GradSampleHooks(self.module, loss_reduction="mean", strict=True)

    def release(self) -> None:
        """Remove the hooks and the per-sample gradients they left on the parameters."""
        if self._hooks is not None:
            self._hooks.cleanup()
            self._hooks = None
        for p in self.module.parameters():
            if hasattr(p, "summed_grad"):
                p.summed_grad = None


def device_dp(
    config: DefenceConfig,
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch_size: int,
    seed: int,
) -> DeviceDPSGD | None:
    """The client's :class:`DeviceDPSGD`, None when DP-SGD is off or the part has no
    trainable parameters (nothing to protect)."""
    if not dp_active(config) or not any(p.requires_grad for p in module.parameters()):
        return None
    return DeviceDPSGD(module, optimizer, config, batch_size, seed)


def dp_epsilon(noise: float, history: Iterable[tuple[float, int]], delta: float) -> float:
    """ε of a client's DP-SGD for ``δ`` after ``history`` ((sample rate q, steps) pairs),
    from Opacus's RDP accountant (the sampled Gaussian mechanism, composed over the steps);
    0 before any step."""
    from opacus.accountants import RDPAccountant

    acc = RDPAccountant()
    acc.history = [(noise, float(q), int(steps)) for q, steps in history if steps > 0]
    return float(acc.get_epsilon(delta)) if acc.history else 0.0


def dp_round(history: History, plan, result, sizes) -> dict:  # noqa: ANN001
    """Add the round's DP-SGD steps to ``history`` (client → (sample rate, steps) pairs;
    ``q = B/n``, ``n = sizes[client]``) and the row's fields: ``dp_steps`` and
    ``dp_sample_rates`` (aligned with ``clients``, null for a client that did not complete:
    the checkpointed rows rebuild ``history`` on resume, :func:`history_from_rows`)."""
    tasks = {t.client: t for t in plan.tasks}
    done = {u.client: u.steps for u in result.updates}
    rates = {}
    for c, steps in done.items():
        rates[c] = min(1.0, tasks[c].batch_size / max(int(sizes[c]), 1))
        history.setdefault(c, []).append((rates[c], int(steps)))
    return {
        "dp_steps": [done.get(t.client) for t in plan.tasks],
        "dp_sample_rates": [rates.get(t.client) for t in plan.tasks],
    }


def history_from_rows(rows: list[dict]) -> History:
    """The DP-SGD history of recorded rows (their ``dp_steps``, ``dp_sample_rates``)."""
    history: History = {}
    for row in rows:
        steps, rates = row.get("dp_steps") or [], row.get("dp_sample_rates") or []
        for c, k, q in zip(row.get("clients", []), steps, rates, strict=False):
            if k is not None and q is not None:
                history.setdefault(int(c), []).append((float(q), int(k)))
    return history


def epsilon_fields(config: DefenceConfig, history: History, clients: list[int]) -> dict:
    """``dp_epsilon`` (the largest ε of any client so far, for ``δ = dp_delta``) and
    ``dp_epsilon_by_client`` (aligned with ``clients``)."""
    eps = {c: dp_epsilon(config.dp_noise, h, config.dp_delta) for c, h in history.items()}
    return {
        "dp_epsilon": max(eps.values(), default=0.0),
        "dp_epsilon_by_client": [eps.get(c, 0.0) for c in clients],
        "dp_delta": config.dp_delta,
    }


def dp_flops_per_sample(device_params: int, batch_size: int) -> float:
    """The device FLOPs DP-SGD adds per trained sample (the clock charges them): the
    per-sample gradients materialised (≈ 2 per parameter: the batch's weight gradient is
    computed once more, per sample), their norms (2), the clip factor applied and summed
    (2), and the noise drawn and added once per batch (≈ 2 per parameter per batch)."""
    return 6.0 * device_params + 2.0 * device_params / max(batch_size, 1)

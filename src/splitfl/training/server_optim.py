"""Server-side optimisers on the aggregated update (``train.server_optimizer``).

Reddi et al., "Adaptive Federated Optimization" (ICLR 2021), Algorithm 2: the server treats
the round's aggregate as a *pseudo-gradient* and takes one optimiser step on the global model

    Δ_t = x̄_t − x_t                   (aggregated − global; the negative of a gradient)
    m_t = β1 m_{t−1} + (1 − β1) Δ_t
    v_t = v_{t−1} + Δ_t²                                   FedAdagrad
    v_t = v_{t−1} − (1 − β2) Δ_t² sign(v_{t−1} − Δ_t²)     FedYogi
    v_t = β2 v_{t−1} + (1 − β2) Δ_t²                       FedAdam
    x_{t+1} = x_t + η m_t / (√v_t + τ)

with ``m_{−1} = 0`` and ``v_{−1} = τ²`` (the paper's input ``v_{−1} ≥ τ²``; no bias
correction, as in the paper). FedAvgM (Hsu et al., "Measuring the Effects of Non-Identical
Data Distribution for Federated Visual Classification", 2019): ``m_t = β m_{t−1} + Δ_t``,
``x_{t+1} = x_t + η m_t`` (β = 0, η = 1 is FedAvg).

Pure functions in the style of Optax: :func:`server_step` maps ``(global, aggregated,
state)`` to ``(new global, new state)`` and writes into nothing; the initial state is ``{}``.
Only floating-point tensors take a step; integer buffers (BatchNorm's
``num_batches_tracked``) keep the aggregate. Tensors absent from a state (a LoRA model's
frozen base, which a checkpoint leaves out) count as the initial ``m = 0``, ``v = τ²``.
Imports only torch.
"""

from __future__ import annotations

from typing import Any

import torch

Tensors = dict[str, torch.Tensor]

#: ``train.server_optimizer.name`` values; ``none`` (default) keeps the aggregate as it is.
SERVER_OPTIMIZERS = ("none", "fedavgm", "fedadam", "fedyogi", "fedadagrad")
#: Server learning rate η when ``train.server_optimizer.lr`` is null: Flower's defaults
#: (``FedAvgM`` 1.0, ``FedAdam`` 0.1, ``FedYogi`` 0.01, ``FedAdagrad`` 0.1).
DEFAULT_LR = {"fedavgm": 1.0, "fedadam": 0.1, "fedyogi": 0.01, "fedadagrad": 0.1}


def server_lr(opt: Any) -> float:
    """η of ``opt`` (a ``ServerOptimizerConfig``): its ``lr``, or the variant's default."""
    return float(opt.lr) if opt.lr is not None else DEFAULT_LR[opt.name]


def pseudo_gradient(global_state: Tensors, aggregated: Tensors) -> Tensors:
    """Δ = aggregated − global for every floating-point tensor (Reddi et al., Alg. 2)."""
    return {k: aggregated[k] - x for k, x in global_state.items() if x.is_floating_point()}


def second_moment(name: str, v: torch.Tensor, d2: torch.Tensor, beta2: float) -> torch.Tensor:
    """v_t from v_{t−1} and Δ² per variant (Reddi et al., Alg. 2, lines for v_t)."""
    if name == "fedadagrad":
        return v + d2
    if name == "fedyogi":
        return v - (1 - beta2) * d2 * torch.sign(v - d2)
    if name == "fedadam":
        return beta2 * v + (1 - beta2) * d2
    raise ValueError(f"unknown server optimizer {name!r}; allowed: {', '.join(SERVER_OPTIMIZERS)}")


def fedavgm_update(
    agg: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, opt: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """FedAvgM (Hsu et al. 2019): m_t = β m_{t−1} + Δ_t; x_{t+1} = x_t + η m_t, computed as
    the aggregate plus the step's difference from it, x̄ + (η − 1) Δ_t + η β m_{t−1} (the
    same value), so that β = 0, η = 1 gives the aggregate bit for bit (x + (x̄ − x) rounds).
    Returns (x_{t+1}, m_t)."""
    lr = server_lr(opt)
    if m is None:
        return agg + (lr - 1) * d, d
    return agg + ((lr - 1) * d + lr * opt.momentum * m), opt.momentum * m + d


def adaptive_update(
    x: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None, v: torch.Tensor | None, opt: Any
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """FedAdagrad/FedYogi/FedAdam (Reddi et al., Alg. 2): m = β1 m + (1−β1) Δ; v per
    variant; x + η m / (√v + τ). Returns (new x, m, v)."""
    m = (1 - opt.beta1) * d if m is None else opt.beta1 * m + (1 - opt.beta1) * d
    v = torch.full_like(d, opt.tau**2) if v is None else v
    v = second_moment(opt.name, v, d * d, opt.beta2)
    return x + server_lr(opt) * m / (v.sqrt() + opt.tau), m, v


def server_step(
    opt: Any, global_state: Tensors, aggregated: Tensors, state: dict[str, Tensors]
) -> tuple[Tensors, dict[str, Tensors]]:
    """One server step of ``opt`` (``train.server_optimizer``): the next global model and the
    next optimiser state. ``none`` returns ``aggregated`` and ``state`` untouched (the run is
    bit-for-bit the run without a server optimiser); else float tensors take the step and
    the others keep the aggregate."""
    if opt.name == "none":
        return aggregated, state
    deltas = pseudo_gradient(global_state, aggregated)
    new, m_out, v_out = dict(aggregated), {}, {}
    m_in, v_in = state.get("m", {}), state.get("v", {})
    for k, d in deltas.items():
        x = global_state[k]
        if opt.name == "fedavgm":
            new[k], m_out[k] = fedavgm_update(aggregated[k], d, m_in.get(k), opt)
        else:
            new[k], m_out[k], v_out[k] = adaptive_update(x, d, m_in.get(k), v_in.get(k), opt)
    return new, ({"m": m_out} if opt.name == "fedavgm" else {"m": m_out, "v": v_out})


def restrict_state(state: dict[str, Tensors], keys: set[str] | None) -> dict[str, Tensors]:
    """``state`` with only the tensors named in ``keys`` (None: all) — what a checkpoint
    keeps (a LoRA model's frozen base never moves: its Δ is 0)."""
    if keys is None:
        return state
    return {part: {k: t for k, t in ts.items() if k in keys} for part, ts in state.items()}

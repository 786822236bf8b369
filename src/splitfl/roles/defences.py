"""Privacy defences a device applies to what it sends the server (``train.defence``).

* **Gaussian noise on smashed data**: each sample's smashed data (every floating tensor that
  crosses the cut) is clipped to L2 norm ``C`` (``noise_clip``; none: not clipped) and
  ``N(0, σ²)`` noise (``noise_std``) is added to every element, drawn from the run's seed
  (``derive_seed(round_seed, "smashed-noise", client, step)``). The gradient flows through the
  clipping to the device part; the noise is a constant. With a clip, one release of a sample's
  smashed data is the Gaussian mechanism of L2 sensitivity ``Δ = 2C`` (replacing the sample
  moves its clipped output by at most 2C): :func:`gaussian_epsilon` composes ``k`` releases in
  Rényi DP (Mironov, CSF 2017, Prop. 7: ``ε_α = α Δ² / (2σ²)`` per release, additive over
  releases) and converts to ``(ε, δ)`` (Prop. 3: ``ε = ε_α + log(1/δ)/(α − 1)``), at the best
  order ``α`` (closed form). The guarantee covers the smashed data only: the device part the
  device uploads for aggregation is not noised.
* **NoPeek** (Vepakomma et al., ICDMW 2020, §3): the device's loss gains ``α·DCor(X, Z)``,
  the sample distance correlation (Székely, Rizzo, Bakirov, Ann. Statist. 2007, Def. 4)
  between the mini-batch's inputs ``X`` and the smashed data ``Z`` it sends (each sample
  flattened); the device back-propagates it together with the server's gradient.

:func:`defence_flops_per_sample` is what the clock charges the device for them (in the shared
cost model, :meth:`splitfl.experiment.context.RunContext.client_cost`, and the U-shaped
family's price; the ring family's own cost function does not charge them yet). DP-SGD of the
device part is :mod:`splitfl.roles.dp_sgd`, the U-shaped family's label defences
:mod:`splitfl.roles.label_defences`.
"""

from __future__ import annotations

import math

import torch

from splitfl.config import DefenceConfig
from splitfl.core.activations import Activation, differentiable, leaves, rebuild
from splitfl.core.seeding import derive_seed
from splitfl.roles.dp_sgd import dp_flops_per_sample
from splitfl.roles.label_defences import label_flops_per_sample

#: Each ``train.defence`` switch and its off value (the defaults; ranges keep the rest >= 0).
OFF = {"nopeek": 0.0, "noise_std": 0.0, "dp_noise": 0.0, "label_noise": "none"}


def active_defences(config: DefenceConfig) -> list[str]:
    """The ``train.defence`` fields switched on, in :data:`OFF`'s order."""
    return [name for name, off in OFF.items() if getattr(config, name) != off]


def is_active(config: DefenceConfig) -> bool:
    """Whether any defence is on (all defaults: off)."""
    return bool(active_defences(config))


def clip_rows(t: torch.Tensor, clip: float) -> torch.Tensor:
    """Each sample of ``t`` (``[B, ...]``) scaled to L2 norm at most ``clip``."""
    norms = t.reshape(len(t), -1).norm(dim=1).clamp_min(1e-12)
    factor = (clip / norms).clamp(max=1.0)
    return t * factor.reshape(-1, *([1] * (t.dim() - 1))).to(t.dtype)


def add_noise(fx: Activation, std: float, clip: float | None, seed: int) -> Activation:
    """``fx`` with every floating tensor clipped per sample (``clip``) and noised (σ = ``std``,
    one generator seeded ``seed``, on the tensors' device, in leaf order)."""
    parts, gen = [], None
    for t in leaves(fx):
        if not differentiable(t):
            parts.append(t)
            continue
        if gen is None:
            gen = torch.Generator(device=t.device).manual_seed(seed)
        clipped = clip_rows(t, clip) if clip is not None else t
        noise = torch.randn(t.shape, generator=gen, device=t.device, dtype=t.dtype)
        parts.append(clipped + std * noise)
    return rebuild(fx, parts)


def _centred_distances(rows: torch.Tensor) -> torch.Tensor:
    """The double-centred pairwise Euclidean distance matrix ``A_jk − Ā_j· − Ā_·k + Ā··``."""
    d = torch.cdist(rows, rows)
    return d - d.mean(dim=0, keepdim=True) - d.mean(dim=1, keepdim=True) + d.mean()


def distance_correlation(x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Sample distance correlation ``dCor(X, Z) = dCov(X,Z) / sqrt(dVar(X)·dVar(Z))``
    (Székely et al. 2007, Def. 4; ``dCov² = mean(A∘B)`` of the double-centred distances),
    differentiable; 0 for a batch of one sample or a constant batch."""
    if len(x) < 2:
        return z.new_zeros(())
    a = _centred_distances(x.reshape(len(x), -1).to(z.dtype))
    b = _centred_distances(z.reshape(len(z), -1))
    dcov2 = (a * b).mean()
    dvar = (a * a).mean() * (b * b).mean()
    if float(dvar.detach()) <= 0:
        return z.new_zeros(())
    return dcov2.clamp_min(0).sqrt() / dvar.sqrt().sqrt()


class DeviceDefence:
    """One client's defences for one round: :meth:`protect` what it sends, :meth:`penalty`
    to add to the loss it back-propagates."""

    def __init__(self, config: DefenceConfig, client: int, round_seed: int):
        self.config, self.client, self.round_seed = config, client, round_seed
        self._pair: tuple[torch.Tensor, Activation] | None = None

    def protect(self, x: torch.Tensor, fx: Activation, step: int) -> Activation:
        """The smashed data to send for inputs ``x`` (noised where ``noise_std > 0``); kept
        with ``x`` for :meth:`penalty`."""
        c = self.config
        if c.noise_std > 0:
            seed = derive_seed(self.round_seed, "smashed-noise", self.client, step)
            fx = add_noise(fx, c.noise_std, c.noise_clip, seed)
        self._pair = (x, fx) if c.nopeek > 0 else None
        return fx

    def penalty(self) -> torch.Tensor | None:
        """NoPeek's ``α·DCor(X, Z)`` of the last :meth:`protect` (first floating tensor of
        ``Z``), None when NoPeek is off."""
        if self._pair is None:
            return None
        x, fx = self._pair
        self._pair = None
        z = next(t for t in leaves(fx) if differentiable(t))
        return self.config.nopeek * distance_correlation(x, z)


def device_defence(config: DefenceConfig, client: int, round_seed: int) -> DeviceDefence | None:
    """The client's :class:`DeviceDefence`, None when every defence is off."""
    return DeviceDefence(config, client, round_seed) if is_active(config) else None


def gaussian_epsilon(std: float, clip: float, releases: int, delta: float) -> float:
    """(ε, δ)-DP of ``releases`` Gaussian-noised releases of one sample's clipped smashed data:
    noise multiplier ``z = σ/Δ``, ``Δ = 2·clip``; RDP ``k·α/(2z²)`` (Mironov Prop. 7 composed)
    plus ``log(1/δ)/(α − 1)`` (Prop. 3), minimised at ``α − 1 = z·sqrt(2 log(1/δ)/k)``:
    ``ε = k/(2z²) + sqrt(2 k log(1/δ))/z``."""
    if std <= 0 or clip <= 0 or releases < 1 or not 0 < delta < 1:
        raise ValueError("needs std > 0, clip > 0, releases >= 1 and delta in (0, 1)")
    z = std / (2 * clip)
    k, log_inv = float(releases), math.log(1 / delta)
    return k / (2 * z * z) + math.sqrt(2 * k * log_inv) / z


def defence_flops_per_sample(
    config: DefenceConfig,
    input_elements: int,
    smashed_elements: int,
    batch_size: int,
    device_params: int = 0,
    head_grad_elements: int = 0,
) -> float:
    """The device FLOPs the defences add per trained sample (the clock charges them, S²FL
    Eq. 1's device term): noise, ≈ 5 per smashed element (norm 2, scale 1, draw and add 2);
    NoPeek, the two ``B × B`` distance matrices of a batch of ``B`` (≈ 3 FLOPs per element pair
    and dimension) forward and ≈ twice that backward, ≈ ``9·B·(d_x + d_z)`` per sample; DP-SGD,
    :func:`~splitfl.roles.dp_sgd.dp_flops_per_sample` of the ``device_params`` trained;
    label noise on the ``head_grad_elements`` of the U-shaped head's gradient,
    :func:`~splitfl.roles.label_defences.label_flops_per_sample`. No bytes: every defended
    tensor has the shape of the clean one."""
    flops = 0.0
    if config.noise_std > 0:
        flops += 5.0 * smashed_elements
    if config.nopeek > 0:
        flops += 9.0 * batch_size * (input_elements + smashed_elements)
    if config.dp_noise > 0:
        flops += dp_flops_per_sample(device_params, batch_size)
    if config.label_noise != "none":
        flops += label_flops_per_sample(config.label_noise, head_grad_elements)
    return flops

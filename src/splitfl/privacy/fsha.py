"""The feature-space hijacking attack (FSHA) by a malicious split-learning server: its nets
and its step (:class:`HijackingServer`).

Pasquini, Ateniese, Bernaschi, "Unleashing the Tiger: Inference Attacks on Split Learning",
ACM CCS 2021 (arXiv 2012.02670); authors' code ``pasquini-dario/SplitNN_FSHA``
(``FSHA.py::FSHA.train_step``, hyper-parameters from ``FSHA.ipynb``). The server holds public
data ``x_pub`` of the client's domain and trains three nets of its own: a pilot ``f̃`` (input
→ the cut's shape), its decoder ``f̃⁻¹`` and a discriminator ``D`` on that space. At each
iteration, from one forward of every net:

* the client's part ``f`` gets, instead of the task's gradient, ``∂/∂z mean D(z)`` at its
  smashed data ``z = f(x_priv)`` (the WGAN generator loss ``L_f = mean D(f(x_priv))``), and
  applies it with its own optimiser (splitfl's :class:`~splitfl.roles.sides.DeviceRole`:
  the client does only what it always does);
* ``f̃, f̃⁻¹`` step on ``‖f̃⁻¹(f̃(x_pub)) − x_pub‖²`` (mean), Adam at ``lr_pilot``;
* ``D`` steps on ``mean D(f̃(x_pub)) − mean D(f(x_priv)) + w·GP`` (WGAN-GP, Gulrajani et al.
  2017: ``GP = mean (‖∇D(x̂)‖₂ − 1)²`` at ``x̂ = ε·z_priv + (1−ε)·z_pub``, ε ~ U(0, 1) per
  sample), Adam at ``lr_discriminator``.

As ``f`` is steered into ``f̃``'s feature space the server reconstructs
``x̂ = f̃⁻¹(f(x_priv))``. The run against a splitfl client, its honest control and SplitGuard's
score are :mod:`splitfl.privacy.fsha_run`.

Where this differs from the authors' code: the client's part is the registered splitfl
model cut at ``cut`` (theirs: a ResNet prefix). The pilot's architecture is the attacker's
choice (the authors' ``f̃`` is not ``f``'s architecture): ``pilot: client`` (the default) is the
client part's own architecture, initialised afresh from the seed (a SplitFed server knows
it); ``pilot: linear`` is linear as the authors' ``architectures.pilot`` (no activations),
stride-1/stride-2 3×3 convolutions that reach the cut's shape (an MLP for flat smashed
data). On splitfl's models, whose blocks end in ReLU, the linear pilot's signed features lie
far from ``f``'s and the hijack takes longer (benchmarks/README.md). The decoder is
splitfl's inverse network (:func:`~splitfl.privacy.reconstruct.inverse_network`: bilinear
upsampling and convolutions, no final tanh; theirs: transposed convolutions and tanh);
``D`` is a two-convolution net (theirs: convolutions and residual blocks); the gradient
penalty's norm runs over every dimension of a sample (theirs, on NHWC tensors, sums over
axes 1–2 only, a per-channel norm).
The server cannot tell SplitGuard's fake batches apart: it answers and trains on them as
on any other batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from splitfl.core.seeding import derive_seed
from splitfl.privacy.reconstruct import inverse_network


def pilot_network(
    input_shape: tuple[int, ...], smashed_shape: tuple[int, ...], width: int
) -> nn.Module:
    """``f̃``: linear (no activations, as the authors' ``architectures.pilot``). Images to
    image features ``[C, h, w]``: a 3×3 convolution to ``width`` channels, one stride-2 3×3
    convolution per halving of the height down to ``h``, a 3×3 convolution to ``C`` and an
    adaptive average pool to ``h × w`` (a no-op where the sizes met). Otherwise flatten, two
    linear layers (``8·width`` between) and unflatten to the cut's shape."""
    if len(input_shape) == 3 and len(smashed_shape) == 3:
        layers: list[nn.Module] = [nn.Conv2d(input_shape[0], width, 3, padding=1)]
        height = input_shape[1]
        while height > smashed_shape[1] and height > 1:
            layers.append(nn.Conv2d(width, width, 3, stride=2, padding=1))
            height = (height + 1) // 2
        layers += [
            nn.Conv2d(width, smashed_shape[0], 3, padding=1),
            nn.AdaptiveAvgPool2d(smashed_shape[1:]),
        ]
        return nn.Sequential(*layers)
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(input_shape), 8 * width),
        nn.Linear(8 * width, math.prod(smashed_shape)),
        nn.Unflatten(1, smashed_shape),
    )


def discriminator(smashed_shape: tuple[int, ...], width: int) -> nn.Module:
    """``D``: a critic of the cut's space with one output per sample and no normalisation
    (WGAN-GP's critic has none). Image features: a 3×3 convolution, ReLU, a stride-2 3×3
    convolution, ReLU, a linear layer; otherwise an MLP with ``8·width`` hidden units."""
    if len(smashed_shape) == 3:
        c, h, w = smashed_shape
        return nn.Sequential(
            nn.Conv2d(c, width, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(width, width, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(width * ((h + 1) // 2) * ((w + 1) // 2), 1),
        )
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(math.prod(smashed_shape), 8 * width),
        nn.ReLU(),
        nn.Linear(8 * width, 1),
    )


def gradient_penalty(
    critic: nn.Module, real: torch.Tensor, fake: torch.Tensor, gen: torch.Generator
) -> torch.Tensor:
    """WGAN-GP's ``mean (‖∇D(x̂)‖₂ − 1)²`` at ``x̂ = ε·real + (1−ε)·fake``, ε ~ U(0, 1) per
    sample from ``gen`` (the norm over every dimension of a sample); differentiable in
    ``critic``'s parameters."""
    eps = torch.rand((real.shape[0],) + (1,) * (real.dim() - 1), generator=gen)
    mixed = (eps * real.detach() + (1 - eps) * fake.detach()).requires_grad_(True)
    (grads,) = torch.autograd.grad(critic(mixed).sum(), mixed, create_graph=True)
    return ((grads.reshape(len(grads), -1).norm(dim=1) - 1) ** 2).mean()


class HijackingServer:
    """FSHA's server (``FSHA.train_step``'s server side): :meth:`reply` answers one batch of
    smashed data with the gradient of ``L_f`` and steps ``f̃, f̃⁻¹`` and ``D`` on the same
    iteration's values (the authors' persistent tape: every gradient from the nets before
    this iteration's updates)."""

    def __init__(
        self,
        pilot: nn.Module,
        input_shape: tuple[int, ...],
        smashed_shape: tuple[int, ...],
        *,
        width: int,
        lr_pilot: float,
        lr_discriminator: float,
        penalty: float,
        seed: int,
    ):
        self.pilot = pilot.train()
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.decoder = inverse_network(smashed_shape, input_shape, width)
            self.critic = discriminator(smashed_shape, width)
        autoencoder = [*self.pilot.parameters(), *self.decoder.parameters()]
        self.opt_pilot = torch.optim.Adam(autoencoder, lr=lr_pilot)
        self.opt_critic = torch.optim.Adam(self.critic.parameters(), lr=lr_discriminator)
        self.weight = penalty
        self.gen = torch.Generator().manual_seed(derive_seed(seed, "gradient-penalty"))
        self.last: dict[str, float] = {}

    def reply(self, z_private: torch.Tensor, x_public: torch.Tensor) -> torch.Tensor:
        """The gradient FSHA sends for ``z_private`` (labels are not used)."""
        z = z_private.detach().requires_grad_(True)
        f_loss = self.critic(z).mean()
        (grad,) = torch.autograd.grad(f_loss, z)
        z_public = self.pilot(x_public)
        pilot_loss = F.mse_loss(self.decoder(z_public), x_public)
        self.opt_pilot.zero_grad()
        pilot_loss.backward()
        z_public = z_public.detach()
        d_loss = self.critic(z_public).mean() - self.critic(z.detach()).mean()
        d_loss = d_loss + self.weight * gradient_penalty(self.critic, z, z_public, self.gen)
        self.opt_critic.zero_grad()
        d_loss.backward()
        self.opt_pilot.step()
        self.opt_critic.step()
        self.last = {"f_loss": float(f_loss.detach()), "pilot_loss": float(pilot_loss.detach())}
        self.last["d_loss"] = float(d_loss.detach())
        return grad

    def reconstruct(self, z: torch.Tensor) -> torch.Tensor:
        """``x̂ = f̃⁻¹(z)`` (decoder in eval mode, no graph)."""
        with torch.no_grad():
            return self.decoder.eval()(z).detach()

"""FSHA against one splitfl client, with an honest server's run as its control and the
client's SplitGuard score in both (``splitfl privacy fsha``, :func:`run_fsha`).

The attack is :mod:`splitfl.privacy.fsha` (Pasquini et al., CCS 2021), the score
:mod:`splitfl.privacy.splitguard` (Erdogan et al., WPES 2022). The client is a splitfl
:class:`~splitfl.roles.sides.DeviceRole` holding the registered model's blocks ``[0, cut)``;
it applies whatever gradient comes back. The server's reconstruction ``x̂ = f̃⁻¹(f(x_priv))``
is scored with MSE/PSNR/SSIM on held private samples at each checkpoint. The FSHA notebook's
values are the defaults: WGAN, ``w = 500``, ``lr_f = lr_f̃ = 1e-5``, ``lr_D = 1e-4``, batch 64,
10 000 iterations. The same client, batches and seed then train against an *honest* server
(the model's own server part, :class:`~splitfl.roles.sides.ServerRole`, cross-entropy, Adam
at ``lr_server``: the SplitGuard notebook's Adam at 0.001) as the control, and both runs
carry SplitGuard's fake batches (:mod:`splitfl.privacy.splitguard`).
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from splitfl.config import ConfigError, TrainConfig
from splitfl.core.plan import ClientTask, RoundPlan
from splitfl.core.seeding import derive_seed
from splitfl.core.topology import ServerSpec, Star
from splitfl.data import dataset_names
from splitfl.data.base import load_dataset
from splitfl.models import ModelPart, build_model, model_names
from splitfl.privacy.fsha import HijackingServer, pilot_network
from splitfl.privacy.metrics import reconstruction_scores
from splitfl.privacy.splitguard import SplitGuard, fake_labels
from splitfl.roles.common import client_batches
from splitfl.roles.fleet import server_role
from splitfl.roles.sides import DeviceRole, Runtime, Smashed


@dataclass(frozen=True)
class FshaConfig:
    """An FSHA run and its honest control. The client holds the first ``private_samples``
        training samples of ``dataset`` (0: all) and trains ``model``'s blocks ``[0, cut)`` with
        ``client_optimizer`` at ``lr_client``; the server's public data are the test split.
        Server nets: ``width`` channels; ``eval_samples`` private samples are reconstructed every
        ``checkpoint_every`` iterations. ``pilot``: ``client`` or ``linear`` (module docstring).
    SplitGuard: fake batches with probability
        ``fake_probability`` after ``splitguard_start`` batches. Defaults: the FSHA notebook's
        (``lr_f``, ``lr_tilde``, ``lr_D``, ``gradient_penalty``, batch 64, 10 000 iterations) and
        the SplitGuard notebook's (``p_fake``, ``N``, Adam at 0.001 for the honest server)."""

    model: str = "cnn_digits"
    dataset: str = "digits"
    root: str | None = None
    cut: int = 1
    iterations: int = 10_000
    batch_size: int = 64
    lr_client: float = 1e-5
    lr_pilot: float = 1e-5
    lr_discriminator: float = 1e-4
    gradient_penalty: float = 500.0
    lr_server: float = 1e-3
    client_optimizer: str = "adam"
    pilot: str = "client"
    width: int = 64
    private_samples: int = 0
    eval_samples: int = 64
    checkpoint_every: int = 500
    fake_probability: float = 0.1
    splitguard_start: int = 20
    seed: int = 0
    out: str = "runs/privacy-fsha"


POSITIVE = ("iterations", "batch_size", "width", "eval_samples", "checkpoint_every")
RATES = ("lr_client", "lr_pilot", "lr_discriminator", "lr_server")
OPTIMIZERS = ("adam", "sgd", "adamw")
PILOTS = ("linear", "client")


def validate_fsha(spec: FshaConfig) -> None:
    """Static checks; a bad value raises :class:`~splitfl.config.ConfigError` naming the
    field."""
    for name in POSITIVE:
        if getattr(spec, name) < 1:
            raise ConfigError(name, f"must be >= 1 (got {getattr(spec, name)})")
    for name in RATES:
        value = getattr(spec, name)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(name, f"must be a finite number > 0 (got {value})")
    if not (math.isfinite(spec.gradient_penalty) and spec.gradient_penalty >= 0):
        raise ConfigError("gradient_penalty", f"must be >= 0 (got {spec.gradient_penalty})")
    if not 0.0 <= spec.fake_probability <= 1.0:
        raise ConfigError("fake_probability", f"must be in [0, 1] (got {spec.fake_probability})")
    for name in ("private_samples", "splitguard_start", "cut"):
        if getattr(spec, name) < 0:
            raise ConfigError(name, f"must be >= 0 (got {getattr(spec, name)})")
    if spec.pilot not in PILOTS:
        raise ConfigError("pilot", f"one of {', '.join(PILOTS)} (got {spec.pilot!r})")
    if spec.client_optimizer not in OPTIMIZERS:
        raise ConfigError(
            "client_optimizer", f"one of {', '.join(OPTIMIZERS)} (got {spec.client_optimizer!r})"
        )


@dataclass
class Setup:
    """What both runs share: the client's data, the public data, the initial model."""

    x: torch.Tensor
    y: torch.Tensor
    public: torch.Tensor
    num_classes: int
    model: nn.Module
    smashed_shape: tuple[int, ...]
    pilot: nn.Module


def prepare_fsha(spec: FshaConfig) -> Setup:
    """Load the data and build the (seeded) model; :class:`ConfigError` for a model, dataset
    or cut that does not fit."""
    validate_fsha(spec)
    if spec.model not in model_names():
        raise ConfigError("model", f"unknown {spec.model!r}; allowed: {', '.join(model_names())}")
    if spec.dataset not in dataset_names():
        raise ConfigError(
            "dataset", f"unknown {spec.dataset!r}; allowed: {', '.join(dataset_names())}"
        )
    bundle = load_dataset(spec.dataset, spec.root)
    n = spec.private_samples or len(bundle.train)
    x, y = bundle.train.x[:n], bundle.train.y[:n]
    if len(x) < spec.batch_size:
        raise ConfigError("private_samples", f"{len(x)} samples hold no batch of {spec.batch_size}")
    if len(bundle.test) < spec.batch_size:
        raise ConfigError("batch_size", f"the public (test) split has only {len(bundle.test)}")
    try:
        with torch.random.fork_rng():
            torch.manual_seed(derive_seed(spec.seed, "fsha-model"))
            model = build_model(spec.model, tuple(bundle.input_shape), bundle.num_classes)
        with torch.no_grad():
            model.eval()(x[:2])
    except (RuntimeError, ValueError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        shape = tuple(bundle.input_shape)
        raise ConfigError("model", f"{spec.model} does not fit input {shape}: {first}") from err
    if not 1 <= spec.cut < model.num_blocks:
        raise ConfigError("cut", f"must be in [1, {model.num_blocks - 1}] (got {spec.cut})")
    with torch.no_grad():
        probe = ModelPart(model, 0, spec.cut).eval()(x[:2])
    if not isinstance(probe, torch.Tensor):
        raise ConfigError("cut", f"FSHA needs one tensor crossing cut {spec.cut}")
    model.train()
    shape = tuple(probe.shape[1:])
    with torch.random.fork_rng():
        torch.manual_seed(derive_seed(spec.seed, "fsha-pilot"))
        if spec.pilot == "client":  # the client part's architecture, initialised afresh
            fresh = build_model(spec.model, tuple(bundle.input_shape), bundle.num_classes)
            pilot: nn.Module = ModelPart(fresh, 0, spec.cut)
        else:
            pilot = pilot_network(tuple(bundle.input_shape), shape, spec.width)
    return Setup(x, y, bundle.test.x, bundle.num_classes, model, shape, pilot)


Reply = Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor]


def train_client(
    spec: FshaConfig, setup: Setup, reply: Reply, checkpoint: Callable[[int, nn.Module], None]
) -> SplitGuard:
    """The client's run: a splitfl :class:`DeviceRole` on ``setup``'s private data applying
    whatever gradient ``reply(iteration, smashed, labels)`` returns, SplitGuard's fake
    batches included (those not stepped on); ``checkpoint(iteration, part)`` every
    ``checkpoint_every`` iterations and at the end. Returns the detector with its scores."""
    part = ModelPart(copy.deepcopy(setup.model), 0, spec.cut)
    task = ClientTask(
        client=0, cut=spec.cut, batch_size=spec.batch_size, steps=spec.iterations,
        lr=spec.lr_client,
    )  # fmt: skip
    data = (setup.x, setup.y, np.arange(len(setup.x)))
    train = TrainConfig(optimizer=spec.client_optimizer, drop_last=True)
    round_seed = derive_seed(spec.seed, "fsha-client")
    client = DeviceRole(task, part, None, train, data, round_seed, Runtime(torch.device("cpu")))
    guard = SplitGuard(derive_seed(spec.seed, "splitguard"), spec.fake_probability,
                       spec.splitguard_start)  # fmt: skip
    first = next(p for p in part.parameters() if p.requires_grad)
    for i in range(spec.iterations):
        z, y = client.forward(i)
        fake = guard.fake_now(i)
        grad = reply(i, z, fake_labels(y, setup.num_classes, guard.gen) if fake else y)
        if fake:  # SplitGuard: the gradient of a fake batch is kept, never stepped on
            (observed,) = torch.autograd.grad(client.pending_output(), first, grad)
        else:
            client.backward(grad)
            observed = first.grad
        guard.record(i, observed, fake)
        if (i + 1) % spec.checkpoint_every == 0 or i + 1 == spec.iterations:
            checkpoint(i + 1, part)
    return guard


def _hijacked(spec: FshaConfig, setup: Setup) -> tuple[dict, torch.Tensor]:
    """The FSHA run: its checkpoints, SplitGuard scores and the last reconstruction."""
    input_shape = tuple(setup.x.shape[1:])
    server = HijackingServer(
        copy.deepcopy(setup.pilot), input_shape, setup.smashed_shape, width=spec.width,
        lr_pilot=spec.lr_pilot, lr_discriminator=spec.lr_discriminator,
        penalty=spec.gradient_penalty, seed=derive_seed(spec.seed, "fsha-server"),
    )  # fmt: skip
    order = client_batches(np.arange(len(setup.public)), spec.batch_size, spec.iterations,
                           derive_seed(spec.seed, "fsha-public"), drop_last=True)  # fmt: skip
    x_eval = setup.x[: spec.eval_samples]
    rows: list[dict] = []
    last: list[torch.Tensor] = []

    def checkpoint(iteration: int, part: nn.Module) -> None:
        with torch.no_grad():
            rec = server.reconstruct(part.eval()(x_eval))
            control = server.reconstruct(server.pilot(x_eval))
        part.train()
        server.decoder.train()
        pilot = reconstruction_scores(x_eval, control)
        rows.append({"iteration": iteration, **reconstruction_scores(x_eval, rec),
                     "pilot_mse": pilot["mse"], **server.last})  # fmt: skip
        last[:] = [rec]

    guard = train_client(spec, setup, lambda i, z, y: server.reply(z, setup.public[order[i]]),
                         checkpoint)  # fmt: skip
    return {"checkpoints": rows, **_detection(guard)}, last[0]


def _honest(spec: FshaConfig, setup: Setup) -> dict:
    """The control: the same client against the model's own server part trained on the task."""
    model = copy.deepcopy(setup.model)
    task = ClientTask(client=0, cut=spec.cut, batch_size=spec.batch_size, lr=spec.lr_server)
    plan = RoundPlan([task], topology=Star(server=ServerSpec(lr=spec.lr_server)))
    runtime = Runtime(torch.device("cpu"))
    server = server_role(model, [task], plan, TrainConfig(optimizer="adam"), runtime,
                         np.random.default_rng(derive_seed(spec.seed, "fsha-honest")))  # fmt: skip
    losses: list[float] = []
    rows: list[dict] = []

    def reply(i: int, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        grad, loss_sum = server.step([Smashed(0, spec.cut, z, y)])[0]
        losses.append(loss_sum / len(y))
        return grad

    def checkpoint(iteration: int, part: nn.Module) -> None:
        window = losses[-spec.checkpoint_every :]
        rows.append({"iteration": iteration, "train_loss": sum(window) / len(window)})

    guard = train_client(spec, setup, reply, checkpoint)
    return {"checkpoints": rows, **_detection(guard)}


def _detection(guard: SplitGuard) -> dict:
    scores = guard.scores
    mean = sum(scores) / len(scores) if scores else math.nan
    return {"splitguard": scores, "splitguard_mean": mean, "fake_batches": guard.fakes.count}


def run_fsha(spec: FshaConfig) -> dict:
    """FSHA against one client and the honest control (the Python twin of ``splitfl privacy
    fsha``). Returns ``config``, ``smashed_shape``, ``baseline`` (the scores of the public
    mean image and of uniform noise over the public range, the server's guesses without the
    attack), ``fsha`` (``checkpoints``: iteration, mse, psnr, ssim, pilot_mse — the pilot's own
    autoencoder on the same samples — f_loss, pilot_loss, d_loss; ``splitguard`` scores and
    their mean), ``honest`` (checkpoints with the task's train loss; SplitGuard), and the
    tensors ``true_x``, ``reconstruction``."""
    setup = prepare_fsha(spec)
    x_eval = setup.x[: spec.eval_samples]
    gen = torch.Generator().manual_seed(derive_seed(spec.seed, "fsha-baseline"))
    lo, hi = float(setup.public.min()), float(setup.public.max())
    noise = lo + (hi - lo) * torch.rand(x_eval.shape, generator=gen)
    baseline = {
        "public_mean": reconstruction_scores(x_eval, setup.public.mean(0).expand_as(x_eval)),
        "noise": reconstruction_scores(x_eval, noise),
    }
    attack, reconstruction = _hijacked(spec, setup)
    return {
        "config": dataclasses.asdict(spec), "smashed_shape": list(setup.smashed_shape),
        "baseline": baseline, "fsha": attack, "honest": _honest(spec, setup),
        "true_x": x_eval, "reconstruction": reconstruction,
    }  # fmt: skip

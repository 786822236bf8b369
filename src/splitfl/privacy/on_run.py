"""An honest-but-curious server's attack on a finished splitfl run (``splitfl privacy
reconstruct|labels RUN_DIR``, :func:`attack_run`).

What the server holds after the run: the final global model (``model.pt``: the device
parts it aggregated), the run's config (so the victim's cut: the last round's cut of that
client, from ``metrics.jsonl``) and its own test split (auxiliary data of the same domain).
The victim's smashed data are computed from the victim client's first training samples
(its partition, rebuilt from the config) by the device part, passed through the run's own
``train.defence`` as the device applies it (:class:`~splitfl.roles.defences.DeviceDefence`,
noise seeded from the run's seed): what that device would send with the final model. They
are not the tensors recorded on the wire during training (no run records them yet).

* ``reconstruct``: UnSplit or the inverse network (:mod:`splitfl.privacy.reconstruct`) on
  those smashed data; MSE, PSNR, SSIM against the true inputs, an image grid.
* ``labels`` (U-shaped runs, labels on the device): the head's cut-layer gradients
  ``∂L/∂h`` the server receives for those samples (the final front, middle and head; the
  device's mean loss over the batch), scored by Li et al.'s norm and direction attacks
  (:mod:`splitfl.privacy.labels`): the leak AUC of "label == positive".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from splitfl.config import ConfigError, ExperimentConfig
from splitfl.config.parse import load_config
from splitfl.core.seeding import derive_seed
from splitfl.experiment.runner import prepare
from splitfl.metrics.records import read_metrics
from splitfl.models import ModelPart
from splitfl.privacy.labels import label_leak_auc
from splitfl.privacy.metrics import reconstruction_scores
from splitfl.privacy.reconstruct import invert, train_inverse_network, unsplit_attack
from splitfl.roles.defences import DeviceDefence
from splitfl.training import loss_fn

ATTACKS = ("unsplit", "inverse", "labels")


@dataclass(frozen=True)
class RunAttack:
    """One attack on a run: ``attack`` (``unsplit``, ``inverse``, ``labels``) on ``samples``
    training samples of ``client`` (null: the first client of the last round), at ``cut``
    (null: that client's last cut). UnSplit: ``iterations`` Adam steps at ``lr`` (the
    authors' λ_TV = 0.1, λ_2 = 1 unless changed). Inverse network: trained ``epochs`` on the
    first ``aux_samples`` test samples. Labels: ``positive`` class."""

    run_dir: str
    attack: str = "unsplit"
    client: int | None = None
    samples: int = 16
    cut: int | None = None
    iterations: int = 300
    lr: float = 0.05
    lambda_tv: float = 0.1
    lambda_l2: float = 1.0
    epochs: int = 20
    aux_samples: int = 1024
    positive: int = 1


def _check(spec: RunAttack) -> None:
    if spec.attack not in ATTACKS:
        raise ConfigError("attack", f"one of {', '.join(ATTACKS)} (got {spec.attack!r})")
    for name in ("samples", "iterations", "epochs", "aux_samples"):
        if getattr(spec, name) < 1:
            raise ConfigError(name, f"must be >= 1 (got {getattr(spec, name)})")
    if not spec.lr > 0:
        raise ConfigError("lr", f"must be > 0 (got {spec.lr})")
    if not (Path(spec.run_dir) / "model.pt").is_file():
        raise ConfigError("run_dir", f"{spec.run_dir} holds no model.pt (a finished run)")


def _victim(spec: RunAttack, rows: list[dict], num_blocks: int) -> tuple[int, int]:
    """(client, cut): the spec's, else the last round's first client and its cut there."""
    last = rows[-1] if rows else {"clients": [], "cuts": []}
    client = spec.client if spec.client is not None else (last["clients"] or [0])[0]
    cuts = dict(zip(last["clients"], last["cuts"], strict=True))
    cut = spec.cut if spec.cut is not None else cuts.get(client)
    if cut is None:
        raise ConfigError("cut", f"client {client} did not train in the last round: give --cut")
    if not 1 <= cut < num_blocks:
        raise ConfigError("cut", f"must be in [1, {num_blocks - 1}] (got {cut})")
    return client, cut


def _sent(config: ExperimentConfig, client: int, x: torch.Tensor, fx):
    """What the device sends for ``fx``: the run's defence applied as the device does."""
    seed = derive_seed(config.seed, "privacy-attack", client)
    return DeviceDefence(config.train.defence, client, seed).protect(x, fx, 0)


def attack_run(spec: RunAttack) -> dict:
    """Run ``spec`` (the Python twin of ``splitfl privacy reconstruct|labels``); returns the
    scores, the victim (client, cut, samples) and, for reconstructions, ``true_x`` and
    ``reconstruction`` tensors."""
    _check(spec)
    run_dir = Path(spec.run_dir)
    config = load_config(run_dir / "config.yaml")
    prep = prepare(config)
    model = prep.ctx.model
    model.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True))
    model.eval()
    client, cut = _victim(spec, read_metrics(run_dir / "metrics.jsonl"), model.num_blocks)
    if not 0 <= client < len(prep.ctx.client_indices):
        raise ConfigError("client", f"must be in [0, {len(prep.ctx.client_indices) - 1}]")
    idx = torch.as_tensor(prep.ctx.client_indices[client][: spec.samples])
    x, y = prep.ctx.bundle.train.x[idx], prep.ctx.bundle.train.y[idx]
    front = ModelPart(model, 0, cut)
    out = {"spec": asdict(spec), "client": client, "cut": cut, "samples": len(idx)}
    if spec.attack == "labels":
        return {**out, **_label_attack(spec, config, prep, model, client, cut, x, y)}
    with torch.no_grad():
        sent = _sent(config, client, x, front(x))
    if spec.attack == "unsplit":
        rec = unsplit_attack(
            front, sent, x.shape[1:], iterations=spec.iterations, lr=spec.lr,
            lambda_tv=spec.lambda_tv, lambda_l2=spec.lambda_l2,
        ).inputs  # fmt: skip
    else:
        aux = prep.ctx.bundle.test.x[: spec.aux_samples]
        g, _ = train_inverse_network(front, aux, epochs=spec.epochs, seed=config.seed)
        rec = invert(g, sent)
    return {**out, **reconstruction_scores(x, rec), "true_x": x, "reconstruction": rec}


def _label_attack(spec, config, prep, model, client, cut, x, y) -> dict:
    """The head gradients of a U-shaped run for ``x`` and both leak AUCs."""
    tail = getattr(prep.algorithm, "tail", None)
    if tail is None:
        raise ConfigError("attack", f"labels needs a U-shaped run (got {config.algorithm})")
    with torch.no_grad():
        sent = _sent(config, client, x, ModelPart(model, 0, cut)(x))
        h = ModelPart(model, cut, tail)(sent, start=cut)
    h = h.detach().requires_grad_(True)
    loss = loss_fn(config.train.loss)(ModelPart(model, tail, model.num_blocks)(h, start=tail), y)
    (grads,) = torch.autograd.grad(loss, h)
    is_pos = y == spec.positive
    if bool(is_pos.all()) or not bool(is_pos.any()):
        raise ConfigError("positive", f"class {spec.positive} must be some, not all, samples")
    return {
        "tail": tail,
        "positives": int(is_pos.sum()),
        "auc_norm": label_leak_auc(grads, y, spec.positive, "norm"),
        "auc_direction": label_leak_auc(grads, y, spec.positive, "direction"),
    }

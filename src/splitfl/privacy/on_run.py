"""An honest-but-curious server's attack on a finished splitfl run (``splitfl privacy
reconstruct|labels RUN_DIR``, :func:`attack_run`).

What the server holds after the run: the final global model (``model.pt``: the device
parts it aggregated), the run's config (so the victim's cut: the last round's cut of that
client, from ``metrics.jsonl``) and its own test split (auxiliary data of the same domain).
The victim's smashed data are computed from the victim client's first training samples
(its partition, rebuilt from the config) by the device part, passed through the run's own
``train.defence`` as the device applies it (:class:`~splitfl.roles.defences.DeviceDefence`,
noise seeded from the run's seed): what that device would send with the final model. They
are not the tensors the server received during training: for those, ``--recorded``.

With ``recorded`` (``--recorded``) the attacks run on what the server side kept during
training (``privacy.record``, :mod:`splitfl.roles.cut_record`): the smashed data of the
victim's recorded mini-batches of one round, as they arrived (defence applied on the device),
and for ``labels`` the head gradients the device sent; UnSplit and the inverse network invert
with the device part the server sent at that round's start (the global model's blocks
``[0, cut)``). That part produced the round's first mini-batch exactly; after the device's
first local step its own part has moved, which the server does not see (every algorithm
here whose devices step on the server's gradient; vanilla SL's chain also starts a device
from the previous client's part), so later batches are attacked with a part that is a step
or more behind. The true inputs and labels are fetched by the recorded sample indices (the
unaugmented samples: with ``data.transforms`` augmentation the device's input differed).
The attacks run the part in eval mode (UnSplit's clone always is): a device part with
BatchNorm or dropout computed the recorded batch in training mode, which even its true
inputs reproduce only through that batch's statistics and masks.

* ``reconstruct``: UnSplit or the inverse network (:mod:`splitfl.privacy.reconstruct`) on
  those smashed data; MSE, PSNR, SSIM against the true inputs, an image grid. UnSplit inverts
  with the device part the server holds (``device_part="known"``) or, as the paper's server
  that knows only the architecture (Erdogan et al., WPES 2022, Alg. 1), with
  ``device_part="estimated"``: a re-drawn part of the same architecture
  (:func:`~splitfl.privacy.reconstruct.reinitialised`, seeded from the run's seed and the
  victim client) fitted by model stealing, its reconstruction brought into the range of the
  server's test split (:func:`~splitfl.privacy.reconstruct.align_to_domain`).
* ``labels`` (U-shaped runs, labels on the device): the head's cut-layer gradients
  ``∂L/∂h`` the server receives for those samples (the final front, middle and head; the
  device's mean loss over the batch; its ``train.defence.label_noise`` applied as the
  device applies it), scored by Li et al.'s norm and direction attacks
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
from splitfl.privacy.reconstruct import (
    align_to_domain,
    invert,
    reinitialised,
    train_inverse_network,
    unsplit_attack,
)
from splitfl.roles.cut_record import HEAD_GRADIENT, SMASHED, RecordedBatch, read_record
from splitfl.roles.defences import DeviceDefence
from splitfl.roles.label_defences import protect_labels
from splitfl.training import loss_fn

ATTACKS = ("unsplit", "inverse", "labels")
#: What UnSplit's server knows of the device part: its weights, or only its architecture.
DEVICE_PARTS = ("known", "estimated")


@dataclass(frozen=True)
class RunAttack:
    """One attack on a run: ``attack`` (``unsplit``, ``inverse``, ``labels``) on ``samples``
    training samples of ``client`` (null: the first client of the last round), at ``cut``
    (null: that client's last cut). UnSplit: ``iterations`` Adam steps at ``lr`` (the
    authors' λ_TV = 0.1, λ_2 = 1 unless changed; ``optimizer`` ``adam``, or ``lbfgs`` for a
    convex objective such as a linear device part's); ``device_part`` ``known`` (the part the
    server holds) or ``estimated`` (architecture only: a re-drawn part, stepped
    ``model_iters`` times per iteration — null: 0 with the known part, 1 with an estimated
    one — and the result aligned to the first ``aux_samples`` test samples);
    ``input_iters`` input steps per iteration. Inverse network: trained ``epochs`` on the
    first ``aux_samples`` test samples. Labels: ``positive`` class. ``recorded``: attack
    the tensors recorded during training (``privacy.record``) of round ``round`` (null: the
    victim's first recorded round); ``client`` null: the first recorded client."""

    run_dir: str
    attack: str = "unsplit"
    client: int | None = None
    samples: int = 16
    cut: int | None = None
    iterations: int = 300
    lr: float = 0.05
    lambda_tv: float = 0.1
    lambda_l2: float = 1.0
    optimizer: str = "adam"
    epochs: int = 20
    aux_samples: int = 1024
    positive: int = 1
    recorded: bool = False
    round: int | None = None
    device_part: str = "known"
    model_iters: int | None = None
    input_iters: int = 1


def _check(spec: RunAttack) -> None:
    if spec.attack not in ATTACKS:
        raise ConfigError("attack", f"one of {', '.join(ATTACKS)} (got {spec.attack!r})")
    for name in ("samples", "iterations", "epochs", "aux_samples", "input_iters"):
        if getattr(spec, name) < 1:
            raise ConfigError(name, f"must be >= 1 (got {getattr(spec, name)})")
    _check_device_part(spec)
    if spec.optimizer not in ("adam", "lbfgs"):
        raise ConfigError("optimizer", f"adam or lbfgs (got {spec.optimizer!r})")
    if not spec.lr > 0:
        raise ConfigError("lr", f"must be > 0 (got {spec.lr})")
    if spec.round is not None and not spec.recorded:
        raise ConfigError("round", "names a recorded round: give --recorded too")
    if not (Path(spec.run_dir) / "config.yaml").is_file():
        raise ConfigError("run_dir", f"{spec.run_dir} holds no config.yaml (a splitfl run)")
    if not spec.recorded and not (Path(spec.run_dir) / "model.pt").is_file():
        raise ConfigError("run_dir", f"{spec.run_dir} holds no model.pt (a finished run)")


def _check_device_part(spec: RunAttack) -> None:
    if spec.device_part not in DEVICE_PARTS:
        raise ConfigError("device_part", f"known or estimated (got {spec.device_part!r})")
    if spec.device_part == "estimated" and spec.attack != "unsplit":
        raise ConfigError("device_part", f"estimated is UnSplit's (got attack {spec.attack})")
    if spec.model_iters is not None and spec.model_iters < 0:
        raise ConfigError("model_iters", f"must be >= 0 (got {spec.model_iters})")
    if spec.device_part == "estimated" and spec.model_iters == 0:
        raise ConfigError("model_iters", "an estimated part is fitted: must be >= 1 (got 0)")


def _victim(spec: RunAttack, rows: list[dict], num_blocks: int) -> tuple[int, int]:
    """(client, cut): the spec's, else the last round's first client and its cut there."""
    last = rows[-1] if rows else {"clients": [], "cuts": []}
    client = spec.client if spec.client is not None else (last["clients"] or [0])[0]
    cuts = dict(zip(last["clients"], last["cuts"], strict=True))
    cut = spec.cut if spec.cut is not None else cuts.get(client)
    if cut is None:
        raise ConfigError("cut", f"client {client} did not train in the last round: give --cut")
    _check_cut(cut, num_blocks)
    return client, cut


def _check_cut(cut: int, num_blocks: int) -> None:
    if not 1 <= cut < num_blocks:
        raise ConfigError("cut", f"must be in [1, {num_blocks - 1}] (got {cut})")


def _sent(config: ExperimentConfig, client: int, x: torch.Tensor, fx):
    """What the device sends for ``fx``: the run's defence applied as the device does."""
    seed = derive_seed(config.seed, "privacy-attack", client)
    return DeviceDefence(config.train.defence, client, seed).protect(x, fx, 0)


@dataclass
class Victim:
    """What an attack works on: the victim's client and cut, the device part the attacker
    inverts with (``front``), the true inputs and labels (the evaluator's), what the server
    received (``sent``) and, for ``labels``, the head's cut-layer gradients (``grads``);
    ``round``: the recorded round (None: the final model's)."""

    client: int
    cut: int
    front: ModelPart
    x: torch.Tensor
    y: torch.Tensor
    sent: torch.Tensor | None
    grads: torch.Tensor | None = None
    round: int | None = None


def attack_run(spec: RunAttack) -> dict:
    """Run ``spec`` (the Python twin of ``splitfl privacy reconstruct|labels``); returns the
    scores, the victim (client, cut, samples; ``round`` when recorded) and, for
    reconstructions, ``true_x`` and ``reconstruction`` tensors."""
    _check(spec)
    run_dir = Path(spec.run_dir)
    config = load_config(run_dir / "config.yaml")
    prep = prepare(config)
    tail = getattr(prep.algorithm, "tail", None)
    if spec.attack == "labels" and tail is None:
        raise ConfigError("attack", f"labels needs a U-shaped run (got {config.algorithm})")
    if spec.recorded:
        v = _recorded_victim(spec, prep)
    else:
        v = _final_victim(spec, config, prep, run_dir, tail)
    out = {"spec": asdict(spec), "client": v.client, "cut": v.cut, "samples": len(v.x)}
    if v.round is not None:
        out["round"] = v.round
    if spec.attack == "labels":
        return {**out, "tail": tail, **_label_scores(spec, v.grads, v.y)}
    aux = prep.ctx.bundle.test.x[: spec.aux_samples]
    if spec.attack == "unsplit":
        rec = _unsplit(spec, v, aux, config.seed)
    else:
        g, _ = train_inverse_network(v.front, aux, epochs=spec.epochs, seed=config.seed)
        rec = invert(g, v.sent)
    return {**out, **reconstruction_scores(v.x, rec), "true_x": v.x, "reconstruction": rec}


def _unsplit(spec: RunAttack, v: Victim, aux: torch.Tensor, seed: int) -> torch.Tensor:
    """UnSplit on the victim: with its device part (known), or with a part of its
    architecture re-drawn from ``(seed, "unsplit-estimated", client)`` and fitted by model
    stealing, the result aligned to the auxiliary data (estimated; UnSplit Alg. 1)."""
    estimated = spec.device_part == "estimated"
    model_iters = spec.model_iters if spec.model_iters is not None else int(estimated)
    part = v.front
    if estimated:
        part = reinitialised(part, derive_seed(seed, "unsplit-estimated", v.client))
    rec = unsplit_attack(
        part, v.sent, v.x.shape[1:], iterations=spec.iterations, lr=spec.lr,
        lambda_tv=spec.lambda_tv, lambda_l2=spec.lambda_l2, optimizer=spec.optimizer,
        input_iters=spec.input_iters, model_iters=model_iters,
    ).inputs  # fmt: skip
    return align_to_domain(rec, aux) if estimated else rec


def attack_recorded(run_dir: str | Path, attack: str = "unsplit", **options) -> dict:
    """``splitfl privacy reconstruct|labels RUN_DIR --recorded``: :func:`attack_run` on the
    tensors the run recorded (``options``: the other :class:`RunAttack` fields)."""
    return attack_run(RunAttack(str(run_dir), attack, recorded=True, **options))


def _final_victim(spec: RunAttack, config, prep, run_dir: Path, tail: int | None) -> Victim:
    """The victim's first ``samples`` training samples through the final model
    (``model.pt``), its defence applied: what its device would send now."""
    model = prep.ctx.model
    model.load_state_dict(torch.load(run_dir / "model.pt", weights_only=True))
    model.eval()
    client, cut = _victim(spec, read_metrics(run_dir / "metrics.jsonl"), model.num_blocks)
    _check_client(client, prep)
    idx = torch.as_tensor(prep.ctx.client_indices[client][: spec.samples])
    x, y = prep.ctx.bundle.train.x[idx], prep.ctx.bundle.train.y[idx]
    front = ModelPart(model, 0, cut)
    with torch.no_grad():
        sent = _sent(config, client, x, front(x))
    v = Victim(client, cut, front, x, y, sent)
    if spec.attack == "labels":
        v.grads = _final_head_grads(config, model, (client, cut, tail), sent, y)
    return v


def _check_client(client: int, prep) -> None:
    if not 0 <= client < len(prep.ctx.client_indices):
        raise ConfigError("client", f"must be in [0, {len(prep.ctx.client_indices) - 1}]")


def _recorded_victim(spec: RunAttack, prep) -> Victim:
    """The victim's recorded batches of one round (``privacy.record``), in step order, their
    first ``samples`` rows; the model's device part is the one recorded with them."""
    kind = HEAD_GRADIENT if spec.attack == "labels" else SMASHED
    batches = _recorded_batches(spec, read_record(spec.run_dir), kind)
    first = batches[0]
    model = prep.ctx.model
    _check_cut(first.cut, model.num_blocks)
    front = ModelPart(model, 0, first.cut)
    keys = set(front.state_dict())
    front.load_state_dict({k: v for k, v in first.part.items() if k in keys})
    front.eval()
    idx = torch.cat([b.indices for b in batches])[: spec.samples]
    value = torch.cat([_one_tensor(b) for b in batches])[: spec.samples]
    x, y = prep.ctx.bundle.train.x[idx], prep.ctx.bundle.train.y[idx]
    grads = value if kind == HEAD_GRADIENT else None
    sent = value if kind == SMASHED else None
    return Victim(first.client, first.cut, front, x, y, sent, grads, first.round)


def _recorded_batches(spec: RunAttack, record: list[RecordedBatch], kind: str):
    """The recorded batches of ``kind`` the spec names (client, round, cut), in step order."""
    found = [b for b in record if b.kind == kind]
    if not found:
        raise ConfigError("recorded", f"the run's record holds no {kind} tensors")
    client = spec.client if spec.client is not None else found[0].client
    mine = [b for b in found if b.client == client]
    if not mine:
        got = sorted({b.client for b in found})
        raise ConfigError("client", f"client {client} was not recorded (recorded: {got})")
    r = spec.round if spec.round is not None else min(b.round for b in mine)
    batches = sorted((b for b in mine if b.round == r), key=lambda b: b.step)
    if not batches:
        got = sorted({b.round for b in mine})
        raise ConfigError("round", f"round {r} of client {client} was not recorded ({got})")
    if spec.cut is not None and spec.cut != batches[0].cut:
        raise ConfigError("cut", f"the recorded batches are at cut {batches[0].cut}")
    return batches


def _one_tensor(batch: RecordedBatch) -> torch.Tensor:
    if not isinstance(batch.value, torch.Tensor):
        raise ConfigError("recorded", "several tensors cross this cut: the attacks take one")
    return batch.value


def _final_head_grads(config, model, where: tuple[int, int, int], sent, y) -> torch.Tensor:
    """The head's cut-layer gradients of a U-shaped run's final model for ``sent``, as the
    device ``where = (client, cut, tail)`` sends them: its ``train.defence.label_noise``
    (max-norm / Marvell, :func:`~splitfl.roles.label_defences.protect_labels`) applied, noise
    seeded from the run's seed and the client."""
    client, cut, tail = where
    with torch.no_grad():
        h = ModelPart(model, cut, tail)(sent, start=cut)
    h = h.detach().requires_grad_(True)
    loss = loss_fn(config.train.loss)(ModelPart(model, tail, model.num_blocks)(h, start=tail), y)
    (grads,) = torch.autograd.grad(loss, h)
    seed = derive_seed(config.seed, "privacy-attack-label-noise", client)
    return protect_labels(config.train.defence, grads, y, seed)


def _label_scores(spec: RunAttack, grads: torch.Tensor, y: torch.Tensor) -> dict:
    """Both leak AUCs of "label == positive" from the head gradients."""
    is_pos = y == spec.positive
    if bool(is_pos.all()) or not bool(is_pos.any()):
        raise ConfigError("positive", f"class {spec.positive} must be some, not all, samples")
    return {
        "positives": int(is_pos.sum()),
        "auc_norm": label_leak_auc(grads, y, spec.positive, "norm"),
        "auc_direction": label_leak_auc(grads, y, spec.positive, "direction"),
    }

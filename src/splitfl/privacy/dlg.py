"""Deep Leakage from Gradients (Zhu et al., NeurIPS 2019) against FedAvg and RingSFL uploads.

RingSFL §4.2.5 (``papers/ringsfl.md``) eavesdrops the model a client uploads to the server,
turns it into a gradient and runs DLG [10] on it, scoring the reconstruction by the cosine
similarity to the true image (Eq. 9):  s = xᵀx̂ / (‖x‖₂ ‖x̂‖₂)  on flattened images.

* FedAvg: client 0 uploads ``W' = W − lr·∇L(x_0)``, so ``(W − W')/lr`` is its exact gradient.
* RingSFL: client 0 uploads a *blended* model (one :func:`~splitfl.executors.ring.ring_batch_update`
  with ``a_i = 1/N``): each of its blocks was trained by whichever clients' batches passed through
  it. The eavesdropper, not knowing the propagation lengths, takes ``(W − W_0')/(lr·a_0)`` as
  client 0's full gradient and runs the same attack.

The attack (:func:`dlg_attack`) optimises a dummy input (and, for DLG, a dummy soft label) so that
the gradient it induces on the known pre-update model matches the observed one (sum of squared
differences over all parameters), with L-BFGS as in Zhu et al. (``optimizer="lbfgs"``, strong
Wolfe line search for stability, ``max_iter`` inner steps per iteration) or Adam. With
``label="idlg"`` the label of a single sample is read off the sign of the last layer's gradient
(iDLG, Zhao et al. 2020) and only the input is optimised.

Following Zhu et al.'s setup, the attacked network uses smooth activations: with
``smooth_activations=True`` :func:`run_attack` swaps every ``nn.ReLU`` of a private copy of the
registered model for ``nn.Sigmoid`` (twice differentiable; the registered model is unchanged).
Both scenarios train and are attacked on that same copy.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from splitfl.algorithms.ringsfl import parse_ratios
from splitfl.config import ConfigError, apply_overrides, from_dict, read_yaml_mapping
from splitfl.data import dataset_names
from splitfl.data.base import load_dataset
from splitfl.executors.ring import ring_batch_update
from splitfl.models import build_model, model_names
from splitfl.models.base import BlockModel

# ----------------------------------------------------------------------------- observations


def gradient_from_update(
    before: Mapping[str, torch.Tensor] | nn.Module,
    after: Mapping[str, torch.Tensor] | nn.Module,
    lr_effective: float,
) -> dict[str, torch.Tensor]:
    """``(before − after) / lr_effective`` per parameter (models or name → tensor mappings)."""
    if lr_effective == 0:
        raise ValueError("lr_effective must be non-zero")
    b = _params(before)
    a = _params(after)
    if set(a) != set(b):
        raise ValueError("before and after hold different parameter names")
    return {k: (b[k] - a[k]) / lr_effective for k in b}


def _params(obj: Mapping[str, torch.Tensor] | nn.Module) -> dict[str, torch.Tensor]:
    if isinstance(obj, nn.Module):
        return {k: p.detach().clone() for k, p in obj.named_parameters()}
    return {k: torch.as_tensor(v).detach().clone() for k, v in obj.items()}


def true_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """The exact gradient of the mean cross-entropy of ``(x, y)`` for every parameter."""
    names, params = zip(*model.named_parameters(), strict=True)
    grads = torch.autograd.grad(F.cross_entropy(model(x), y), params)
    return {n: g.detach().clone() for n, g in zip(names, grads, strict=True)}


def observe_fedavg(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, lr: float
) -> dict[str, torch.Tensor]:
    """FedAvg upload: one local SGD step of a copy of ``model`` on ``(x, y)``; the eavesdropper
    computes ``(W − W')/lr`` (the exact gradient, up to floating-point rounding)."""
    local = copy.deepcopy(model)
    local.zero_grad(set_to_none=True)
    F.cross_entropy(local(x), y).backward()
    with torch.no_grad():
        for p in local.parameters():
            if p.grad is not None:
                p.sub_(lr * p.grad)
    return gradient_from_update(model, local, lr)


def observe_ringsfl(
    model: BlockModel,
    xs: torch.Tensor,
    ys: torch.Tensor,
    lengths: Sequence[int],
    lr: float,
    dynamic_lr: bool = False,
) -> dict[str, torch.Tensor]:
    """RingSFL upload of client 0 after one BatchUpdate of ``N = len(xs)`` clients.

    Client i holds sample ``xs[i]`` and the propagation length ``lengths[i]``; every client
    starts from ``model`` and the weights are ``a_i = 1/N``. Returns the eavesdropper's
    pseudo-gradient ``(W − W_0')/(lr·a_0)`` of client 0's uploaded blended model.
    """
    n = len(xs)
    if len(ys) != n or len(lengths) != n:
        raise ValueError(f"{n} samples but {len(ys)} labels and {len(lengths)} lengths")
    if sum(lengths) > model.num_blocks or min(lengths) < 1:
        raise ValueError(f"lengths {list(lengths)} must be >= 1 and sum to <= {model.num_blocks}")
    order = list(range(n))
    models = {i: copy.deepcopy(model) for i in order}
    batches = {i: (xs[i : i + 1], ys[i : i + 1]) for i in order}
    weights = {i: 1.0 / n for i in order}
    ring_batch_update(models, order, dict(enumerate(lengths)), batches, weights, lr, dynamic_lr)
    return gradient_from_update(model, models[0], lr * weights[0])


# ----------------------------------------------------------------------------- the attack


@dataclass
class DLGResult:
    """Reconstruction ``[B, *input_shape]`` (after the last finite iteration), the cosine to the
    true input after each iteration (Eq. 9; empty without ``true_x``), the gradient-matching
    loss of each iteration (normalised by ``Σ‖g‖²``; for L-BFGS the value at the iteration's
    start) and ``label``: the inferred (iDLG) label or the final soft label's argmax."""

    reconstruction: torch.Tensor
    cosine_history: list[float] = field(default_factory=list)
    loss_history: list[float] = field(default_factory=list)
    label: list[int] = field(default_factory=list)


def cosine_similarity(x: torch.Tensor, x_hat: torch.Tensor) -> float:
    """RingSFL Eq. (9) on flattened tensors."""
    a = x.detach().reshape(-1).double()
    b = x_hat.detach().reshape(-1).double()
    denom = a.norm() * b.norm()
    return float(a @ b / denom) if denom > 0 else 0.0


def infer_label(model: nn.Module, target_grads: Mapping[str, torch.Tensor]) -> int:
    """iDLG: for one sample and cross-entropy, the last layer's bias gradient is
    ``softmax(z) − onehot(y)``, negative only at the true label; without a bias, the row of the
    last weight gradient with the smallest sum (its inputs are non-negative after ReLU/Sigmoid)."""
    last = [m for m in model.modules() if isinstance(m, nn.Linear)][-1]
    names = {id(p): n for n, p in model.named_parameters()}
    if last.bias is not None and names[id(last.bias)] in target_grads:
        return int(torch.argmin(target_grads[names[id(last.bias)]]))
    return int(torch.argmin(target_grads[names[id(last.weight)]].sum(dim=1)))


def dlg_attack(
    model: nn.Module,
    target_grads: Mapping[str, torch.Tensor],
    input_shape: Sequence[int],
    num_classes: int,
    iterations: int = 300,
    seed: int = 0,
    true_x: torch.Tensor | None = None,
    *,
    batch_size: int = 1,
    optimizer: str = "lbfgs",
    label: str = "idlg",
    lr: float | None = None,
    max_iter: int = 20,
) -> DLGResult:
    """Reconstruct the input behind ``target_grads`` (parameter name → observed gradient).

    Minimises ``Σ_params ‖∇_θ L(model(x̂), ŷ) − g‖²`` (divided by the constant ``Σ‖g‖²`` so the
    optimiser's tolerances do not depend on the gradients' scale) over the dummy input ``x̂``
    (seeded standard normal start) and, with ``label="soft"`` (DLG), a dummy label
    ``ŷ = softmax(z)``; with ``label="idlg"`` (single sample only) ŷ is fixed to
    :func:`infer_label`. Only parameters named in ``target_grads`` are matched (pass a subset
    to attack some layers only). ``optimizer`` is ``"lbfgs"`` (Zhu et al.; ``lr`` default 1,
    ``max_iter`` inner steps and strong-Wolfe line search per iteration) or ``"adam"`` (``lr``
    default 0.1, one step per iteration).
    ``model`` keeps its parameters (a private copy is attacked; its train/eval mode is kept).
    """
    if optimizer not in ("lbfgs", "adam"):
        raise ValueError(f"optimizer must be lbfgs or adam (got {optimizer!r})")
    if label not in ("idlg", "soft"):
        raise ValueError(f"label must be idlg or soft (got {label!r})")
    if label == "idlg" and batch_size != 1:
        label = "soft"  # iDLG's sign rule identifies a single sample's label only
    net = copy.deepcopy(model)
    for p in net.parameters():
        p.requires_grad_(True)
    names = [n for n, _ in net.named_parameters() if n in target_grads]
    if not names:
        raise ValueError("target_grads names none of the model's parameters")
    params = dict(net.named_parameters())
    matched = [params[n] for n in names]
    targets = [target_grads[n].detach().to(params[n].dtype) for n in names]
    scale = float(sum((t**2).sum() for t in targets)) or 1.0

    gen = torch.Generator().manual_seed(seed)
    dummy_x = torch.randn((batch_size, *input_shape), generator=gen).requires_grad_(True)
    variables = [dummy_x]
    fixed_y = None
    dummy_z = None
    if label == "idlg":
        fixed_y = torch.tensor([infer_label(net, target_grads)])
    else:
        dummy_z = torch.randn((batch_size, num_classes), generator=gen).requires_grad_(True)
        variables.append(dummy_z)

    def matching_loss() -> torch.Tensor:
        out = net(dummy_x)
        if fixed_y is not None:
            task = F.cross_entropy(out, fixed_y)
        else:
            task = torch.mean(torch.sum(-F.softmax(dummy_z, -1) * F.log_softmax(out, -1), -1))
        grads = torch.autograd.grad(task, matched, create_graph=True)
        diff = sum(((g - t) ** 2).sum() for g, t in zip(grads, targets, strict=True))
        return diff / scale

    if optimizer == "lbfgs":
        opt = torch.optim.LBFGS(
            variables,
            lr=1.0 if lr is None else lr,
            max_iter=max_iter,
            tolerance_grad=1e-10,
            tolerance_change=1e-12,
            line_search_fn="strong_wolfe",
        )
    else:
        opt = torch.optim.Adam(variables, lr=0.1 if lr is None else lr)

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = matching_loss()
        loss.backward(inputs=variables)
        return loss

    result = DLGResult(reconstruction=dummy_x.detach().clone())
    for _ in range(iterations):
        loss = opt.step(closure)
        value = float(loss.detach())
        if not math.isfinite(value) or not torch.isfinite(dummy_x).all():
            break  # keep the last finite reconstruction
        result.loss_history.append(value)
        result.reconstruction = dummy_x.detach().clone()
        if true_x is not None:
            result.cosine_history.append(cosine_similarity(true_x, dummy_x))
    if fixed_y is not None:
        result.label = fixed_y.tolist()
    else:
        result.label = dummy_z.detach().argmax(-1).tolist()
    return result


# ----------------------------------------------------------------------------- the experiment


@dataclass(frozen=True)
class AttackConfig:
    """RingSFL §4.2.5 attack experiment: N clients holding one image each (the first N training
    images of ``dataset``); the eavesdropper attacks client 0's upload under FedAvg and RingSFL.

    ``lengths`` are propagation-length ratios (``"8:1:1:1:1"``), rounded to the model's blocks
    by :func:`splitfl.algorithms.ringsfl.parse_ratios`. ``smooth_activations`` swaps ReLU for
    Sigmoid and
    ``init="uniform"`` draws every parameter from U(−0.5, 0.5) — both Zhu et al.'s DLG setup
    (``"default"`` keeps the registered model's initialisation). ``optimizer`` is ``lbfgs``
    (``iterations`` outer steps of up to 20 inner steps) or ``adam``; ``label`` is ``idlg``
    (label inferred from the last layer's gradient) or ``soft`` (optimised, as DLG).
    """

    model: str = "lenet5"
    dataset: str = "mnist"
    root: str | None = None
    clients: int = 5
    lengths: str = "8:1:1:1:1"
    iterations: int = 300
    lr: float = 0.1
    seed: int = 0
    out: str = "runs/privacy-attack"
    smooth_activations: bool = True
    init: str = "uniform"
    optimizer: str = "lbfgs"
    label: str = "idlg"
    dynamic_lr: bool = False


ATTACK_CHOICES = {
    "init": ("uniform", "default"),
    "optimizer": ("lbfgs", "adam"),
    "label": ("idlg", "soft"),
}


def validate_attack(config: AttackConfig) -> None:
    """Static checks of an :class:`AttackConfig`; raises :class:`~splitfl.config.ConfigError`."""
    def check(ok: bool, name: str, message: str) -> None:
        if not ok:
            raise ConfigError(name, message)

    check(
        config.model in model_names(),
        "model",
        f"unknown {config.model!r}; allowed: " + ", ".join(model_names()),
    )
    check(
        config.dataset in dataset_names(),
        "dataset",
        f"unknown {config.dataset!r}; allowed: " + ", ".join(dataset_names()),
    )
    check(config.clients >= 1, "clients", f"must be >= 1 (got {config.clients})")
    check(config.iterations >= 1, "iterations", f"must be >= 1 (got {config.iterations})")
    check(config.lr > 0, "lr", f"must be > 0 (got {config.lr})")
    for name, allowed in ATTACK_CHOICES.items():
        value = getattr(config, name)
        check(value in allowed, name, f"unknown {value!r}; allowed: {', '.join(allowed)}")
    try:
        ratios = [float(r) for r in config.lengths.split(":")]
    except ValueError:
        ratios = []
    check(
        len(ratios) == config.clients and all(r > 0 for r in ratios),
        "lengths",
        f"give {config.clients} positive ratios like 8:1:1:1:1 (got {config.lengths!r})",
    )


def load_attack_config(
    path: str | Path | None = None, overrides: Sequence[str] = ()
) -> AttackConfig:
    """Read an :class:`AttackConfig` from YAML (defaults when ``path`` is None), apply
    ``key=value`` overrides, validate. Ratios such as ``lengths: 8:1:1:1:1`` need no quotes."""
    data = read_yaml_mapping(path) if path is not None else {}
    config = from_dict(AttackConfig, apply_overrides(data, list(overrides)))
    validate_attack(config)
    return config


def smooth_copy(model: BlockModel) -> BlockModel:
    """A deep copy of ``model`` with every ``nn.ReLU`` replaced by ``nn.Sigmoid`` (Zhu et al.)."""
    out = copy.deepcopy(model)

    def swap(module: nn.Module) -> None:
        for name, child in module.named_children():
            if isinstance(child, nn.ReLU):
                setattr(module, name, nn.Sigmoid())
            else:
                swap(child)

    swap(out)
    return out


def _relative_error(a: Mapping[str, torch.Tensor], b: Mapping[str, torch.Tensor]) -> float:
    num = sum(float(((a[k] - b[k]) ** 2).sum()) for k in b)
    den = sum(float((b[k] ** 2).sum()) for k in b)
    return math.sqrt(num / den) if den > 0 else math.inf


def build_attack_model(config: AttackConfig, input_shape: Sequence[int], num_classes: int):
    """The attacked model: registered ``config.model`` (seeded), optionally smoothed and
    re-initialised as in Zhu et al.; :class:`ConfigError` if it does not fit the input."""
    try:
        with torch.random.fork_rng():
            torch.manual_seed(config.seed)
            model = build_model(config.model, tuple(input_shape), num_classes)
        with torch.no_grad():
            model.eval()(torch.zeros((1, *input_shape)))
        model.train()
    except (RuntimeError, ValueError) as err:
        first = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ConfigError(
            "model", f"{config.model} does not fit input {tuple(input_shape)}: {first}"
        ) from err
    if config.smooth_activations:
        model = smooth_copy(model)
    if config.init == "uniform":
        gen = torch.Generator().manual_seed(config.seed)
        with torch.no_grad():
            for p in model.parameters():
                p.uniform_(-0.5, 0.5, generator=gen)
    return model


def run_attack(config: AttackConfig) -> dict:
    """Run DLG against client 0's FedAvg upload and its RingSFL blended upload.

    Returns ``{"config", "lengths", "labels", "true_x", "fedavg": {...}, "ringsfl": {...}}``;
    each scenario holds ``cosine`` (per iteration), ``loss``, ``final_cosine``, ``max_cosine``,
    ``label`` (the attack's label), ``gradient_error`` (relative L2 error of the observed
    gradient vs client 0's true gradient), ``seconds`` and ``reconstruction`` (a tensor).
    """
    validate_attack(config)
    bundle = load_dataset(config.dataset, config.root)
    n = config.clients
    if len(bundle.train) < n:
        raise ConfigError("clients", f"{config.dataset} has only {len(bundle.train)} images")
    xs, ys = bundle.train.x[:n].clone(), bundle.train.y[:n].clone()
    shape, classes = tuple(bundle.input_shape), bundle.num_classes
    model = build_attack_model(config, shape, classes)
    try:
        lengths = parse_ratios(config.lengths, n, model.num_blocks)
    except ValueError as err:
        raise ConfigError("lengths", str(err)) from err
    if min(lengths) < 1:
        raise ConfigError("lengths", f"rounded to {lengths} blocks of {model.num_blocks}")
    model.train()
    truth = true_gradient(model, xs[:1], ys[:1])
    observed = {
        "fedavg": observe_fedavg(model, xs[:1], ys[:1], config.lr),
        "ringsfl": observe_ringsfl(model, xs, ys, lengths, config.lr, config.dynamic_lr),
    }
    results: dict = {
        "config": dataclasses.asdict(config),
        "lengths": lengths,
        "labels": ys.tolist(),
        "true_x": xs[:1].clone(),
    }
    for name, grads in observed.items():
        start = time.perf_counter()
        attack = dlg_attack(
            model,
            grads,
            shape,
            classes,
            iterations=config.iterations,
            seed=config.seed,
            true_x=xs[:1],
            optimizer=config.optimizer,
            label=config.label,
        )
        cos = attack.cosine_history
        results[name] = {
            "cosine": cos,
            "loss": attack.loss_history,
            "final_cosine": cos[-1] if cos else float("nan"),
            "max_cosine": max(cos) if cos else float("nan"),
            "label": attack.label,
            "gradient_error": _relative_error(grads, truth),
            "seconds": time.perf_counter() - start,
            "reconstruction": attack.reconstruction,
        }
    return results


def results_to_json(results: dict) -> dict:
    """``results`` with tensors turned into nested lists (for ``results.json``)."""

    def convert(value):
        if isinstance(value, torch.Tensor):
            return value.tolist()
        if isinstance(value, np.ndarray):
            return value.tolist()
        if isinstance(value, dict):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [convert(v) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    return convert(results)


def write_results(results: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``results.json`` and ``attack.png`` to ``out_dir``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "results.json"
    json_path.write_text(json.dumps(results_to_json(results), indent=1))
    return json_path, plot_attack(results, out / "attack.png")


def _display(img: torch.Tensor) -> np.ndarray:
    """``[C, H, W]`` → an image in [0, 1] for ``imshow`` (min–max scaled)."""
    arr = img.detach().double().numpy()
    lo, hi = arr.min(), arr.max()
    arr = (arr - lo) / (hi - lo) if hi > lo else np.zeros_like(arr)
    return arr[0] if arr.shape[0] == 1 else np.transpose(arr[:3], (1, 2, 0))


def plot_attack(results: dict, path: str | Path) -> Path:
    """Cosine similarity vs iteration for both scenarios (as RingSFL Fig. 15) and the true image
    beside the FedAvg and RingSFL reconstructions (as Fig. 16)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = plt.figure(figsize=(11, 3.4))
    grid = fig.add_gridspec(1, 5)
    ax = fig.add_subplot(grid[0, :2])
    for name, label in (("fedavg", "FedAvg"), ("ringsfl", "RingSFL")):
        cos = results[name]["cosine"]
        ax.plot(
            range(1, len(cos) + 1), cos, label=f"{label} (final {cos[-1]:.3f})" if cos else label
        )
    ax.set_xlabel("attack iteration")
    ax.set_ylabel("cosine similarity (Eq. 9)")
    ax.set_ylim(-1.05, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    panels = [
        ("true image", results["true_x"][0]),
        ("FedAvg", results["fedavg"]["reconstruction"][0]),
        ("RingSFL", results["ringsfl"]["reconstruction"][0]),
    ]
    for k, (title, img) in enumerate(panels):
        sub = fig.add_subplot(grid[0, 2 + k])
        sub.imshow(_display(torch.as_tensor(img)), cmap="gray")
        sub.set_title(title)
        sub.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path

"""RingSFL §4.2.5 attack experiment: DLG (:mod:`splitfl.privacy.attack`) against client 0's
FedAvg upload and its RingSFL blended upload (:mod:`splitfl.privacy.observe`); its config, the
attacked model and the run. Results are written by :mod:`splitfl.privacy.results`.

Following Zhu et al.'s setup, the attacked network uses smooth activations: with
``smooth_activations=True`` :func:`run_attack` swaps every ``nn.ReLU`` of a private copy of the
registered model for ``nn.Sigmoid`` (twice differentiable; the registered model is unchanged).
Both scenarios train and are attacked on that same copy.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from splitfl.algorithms.ringsfl import parse_ratios
from splitfl.config import ConfigError, apply_overrides, from_dict, read_yaml_mapping
from splitfl.data import dataset_names
from splitfl.data.base import load_dataset
from splitfl.models import build_model, model_names
from splitfl.models.base import BlockModel
from splitfl.privacy.attack import dlg_attack
from splitfl.privacy.observe import observe_fedavg, observe_ringsfl, true_gradient


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

"""The config's model checked on the data before a run: it builds for the data's shape, and
its forward on a few training samples gives what training needs.

The model is user code (an import path, a registered builder, an ``nn.Module`` cut by its
graph): building it and its forward run under :func:`~splitfl.core.usercode.user_code`, so any
exception is one line naming the model. Its outputs must be one row per sample at two batch
sizes (a model whose output shape follows a fixed batch is refused), float32 (the training
loss's dtype: int64, float64 or float16 outputs are refused) and finite before any training.
"""

from __future__ import annotations

import functools
import warnings

import torch

from splitfl.config import ConfigError, ExperimentConfig
from splitfl.core.usercode import user_code
from splitfl.data import DatasetBundle
from splitfl.extensions import ONE_LINE, build_model
from splitfl.models import BlockModel
from splitfl.models.crossing import RawInputWarning, input_name, what_crosses
from splitfl.models.registry import Split

#: The batch sizes the model's forward is checked at (fewer where the data has fewer).
PROBE_BATCHES = (2, 3)


def checked_model(
    config: ExperimentConfig, bundle: DatasetBundle
) -> tuple[BlockModel, torch.Tensor]:
    """The config's model and its outputs for the first two samples, checked: it builds
    for the data's shape, runs forward, and gives one finite float32 row of outputs per
    sample (``[B, outputs]``; ``[B, tokens, vocabulary]`` for ``causal_lm``) whatever the
    batch size. Raises a one-line ConfigError on ``model``."""
    what = f"{config.model} does not fit {config.data.dataset} inputs {bundle.input_shape}"
    model = build_model(
        config.model,
        bundle.input_shape,
        bundle.num_classes,
        Split.of(config.split),
        config.train.lora,
        what,
        config.hf,
    )
    samples = (bundle.train if len(bundle.train) else bundle.test).x
    results = []
    for n in sorted({min(b, len(samples)) for b in PROBE_BATCHES}):
        logits = _forward(what, model, samples[:n])
        _check_outputs(config, logits, n)
        results.append(logits)
    if results[0].shape[1:] != results[-1].shape[1:]:
        raise ConfigError(
            "model",
            f"{config.model} gives outputs {list(results[0].shape)} for a batch of "
            f"{len(results[0])} but {list(results[-1].shape)} for {len(results[-1])}: the "
            "outputs per sample must not depend on the batch size",
        )
    return model, results[0]


def _forward(what: str, model: BlockModel, x: torch.Tensor) -> object:
    """The model's eval-mode forward of ``x``; any exception is one line on ``what``."""
    with user_code(what, functools.partial(ConfigError, "model"), ONE_LINE), torch.no_grad():
        return model.eval()(x)


def _check_outputs(config: ExperimentConfig, logits: object, n: int) -> None:
    """``logits`` (the forward of ``n`` samples) must be a finite float32 tensor of one row
    per sample."""
    dims = 3 if config.train.loss == "causal_lm" else 2  # [B, T, vocabulary] for an LM
    if not isinstance(logits, torch.Tensor) or logits.dim() != dims or logits.shape[0] != n:
        shape = list(logits.shape) if isinstance(logits, torch.Tensor) else type(logits).__name__
        want = f"[{n}, classes]"
        if dims == 3:
            want = f"[{n}, tokens, vocabulary] (train.loss: causal_lm)"
        raise ConfigError(
            "model", f"{config.model} gives outputs {shape} for a batch of {n}; expected {want}"
        )
    if logits.dtype != torch.float32:
        raise ConfigError(
            "model",
            f"{config.model} gives {str(logits.dtype).removeprefix('torch.')} outputs; "
            "expected float32 (the training loss's dtype; precision: bf16 autocasts forward "
            "passes where wanted)",
        )
    if not bool(torch.isfinite(logits).all()):
        raise ConfigError(
            "model",
            f"{config.model} gives NaN or infinite outputs for the first {n} training samples "
            "before any training",
        )


def check_splittable(config: ExperimentConfig, model: BlockModel, algorithm: type) -> None:
    """A model with no cut point that leaves trainable parameters on both sides (a bare
    ``Flatten`` or ``ReLU`` as its only first block) trains whole only: an algorithm that
    splits it (:attr:`~splitfl.algorithms.Algorithm.splits_model`) is refused in one line."""
    if getattr(algorithm, "splits_model", True) and not model.cut_points:
        raise ConfigError(
            "model",
            f"{config.model}: no cut point leaves trainable parameters on both sides (a first "
            f"block without parameters, e.g. a bare Flatten, trains nothing on the device); "
            f"{config.algorithm} splits the model (fedavg trains it whole)",
        )


def crossing_lines(config: ExperimentConfig, model: BlockModel, bundle: DatasetBundle) -> list[str]:
    """What the device sends at each cut point for one batch of the first ``train.batch_size``
    training samples (:func:`~splitfl.models.crossing.what_crosses`): one line per cut point
    naming every tensor with its shape and dtype. A raw input crossing (the input, a slice of
    it) is a one-line :class:`~splitfl.models.crossing.RawInputWarning` per tensor."""
    samples = (bundle.train if len(bundle.train) else bundle.test).x
    batch = samples[: min(config.train.batch_size, len(samples))]
    with user_code(config.model, functools.partial(ConfigError, "model"), ONE_LINE):
        crossings = what_crosses(model, batch)
    name = input_name(model)
    for c in crossings:
        for line in c.warnings(name):
            warnings.warn(line, RawInputWarning, stacklevel=2)
    return [c.line() for c in crossings]

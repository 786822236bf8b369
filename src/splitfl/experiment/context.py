"""Everything a run needs that does not change from round to round: data, clients, devices,
model, cost profile. Built (and checked against the data) before any run directory exists.
:class:`Prepared` is that context with its config and algorithm, as ``runner.prepare`` makes
it for the loop, the round step and the device data."""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch

from splitfl.config import ConfigError, ExperimentConfig
from splitfl.core.seeding import rng_for
from splitfl.data import DatasetBundle
from splitfl.data.base import ArrayDataset, DatasetWarning, labels_only, unseen_test_labels
from splitfl.data.clients import client_partition, holdout_split
from splitfl.data.local import load_test
from splitfl.data.partition import batch_sizes, epoch_batch_sizes, label_histograms
from splitfl.data.source import (
    augmentation,
    container_options,
    normalized,
    transforms_of,
)
from splitfl.data.transforms import Transforms
from splitfl.experiment.fingerprint import data_fingerprint
from splitfl.experiment.model_check import checked_model
from splitfl.experiment.validation import resolve_config
from splitfl.extensions import load_dataset, profile_model
from splitfl.models import BlockModel, ModelProfile
from splitfl.models.profile import BYTES_PER_ELEMENT
from splitfl.models.registry import Split
from splitfl.roles.defences import defence_flops_per_sample, is_active
from splitfl.system import ClientCost, Population, draw_population, split_client_cost
from splitfl.system.devices import with_flops_scale, with_variation
from splitfl.training import target_problem

if TYPE_CHECKING:
    from splitfl.algorithms import Algorithm


class Positions:
    """Positions ``0..n-1`` of a device's own samples, held as their count: indexing with
    positions returns them (int64), ``len`` is ``n``; memory does not grow with ``n``."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, positions) -> np.ndarray:
        return np.asarray(positions, dtype=np.int64)


@dataclass
class RunContext:
    config: ExperimentConfig
    bundle: DatasetBundle
    client_indices: list[np.ndarray]
    label_hist: np.ndarray
    population: Population
    model: BlockModel
    profile: ModelProfile
    #: ``data.source: devices``: where computations on a client's own samples run (IFCA's
    #: cluster identity): an object with ``lowest_loss(client, states, positions) -> int``
    #: set by the networked executor; None = this process, on ``bundle.train``.
    client_compute: object | None = None
    #: networked runs: a callable → the clients whose device is connected now (set by the
    #: networked executor; RingSFL forms its ring of them); None = every client
    reachable: object | None = None
    #: ``privacy.record``: the run's :class:`~splitfl.roles.cut_record.CutRecorder` (set by
    #: the loop; the executors take each recorded round's tap from it); None = not recorded
    cut_record: object | None = None
    #: ``eval.on: clients | both``: each client's held-out samples (indices into
    #: ``bundle.train``, never in ``client_indices``, so never trained on); None otherwise.
    holdout_indices: list[np.ndarray] | None = None

    def adopt_announced(self, sizes: list[int], hist: np.ndarray) -> None:
        """``data.source: devices``: the clients' data view is what their devices announced
        (sample counts, label histograms); a client's samples are positions ``0..n-1`` of
        its device's own data (the server holds none of them: :class:`Positions`, no array
        of the announced size)."""
        self.client_indices = [Positions(int(n)) for n in sizes]
        self.label_hist = np.asarray(hist, dtype=np.int64)
        self.__dict__.pop("data_sizes", None)  # the cached property is recomputed

    @property
    def num_clients(self) -> int:
        return len(self.client_indices)

    @property
    def num_blocks(self) -> int:
        return self.model.num_blocks

    @property
    def cut_points(self) -> tuple[int, ...]:
        return self.model.cut_points

    @cached_property
    def augment(self) -> Transforms:
        """``data.transforms``: the random ones are applied to training batches where they
        are drawn (:meth:`splitfl.roles.sides.Runtime.batch`)."""
        return augmentation(self.config.data, self.bundle)

    @cached_property
    def data_sizes(self) -> np.ndarray:
        return np.array([len(ix) for ix in self.client_indices], dtype=np.int64)

    def local_steps(self, client: int, batch_size: int | None = None) -> int:
        """Iterations per round: ``train.local_steps`` or ``local_epochs`` epochs of batches."""
        t = self.config.train
        if t.local_steps is not None:
            return t.local_steps
        b = batch_size or t.batch_size
        return t.local_epochs * len(epoch_batch_sizes(int(self.data_sizes[client]), b, t.drop_last))

    def lr_at(self, round_idx: int) -> float:
        """Learning rate of round ``round_idx``: ``max(lr_min, lr * lr_decay**round)``."""
        t = self.config.train
        return max(t.lr_min, t.lr * t.lr_decay**round_idx)

    def round_samples(self, client: int, batch_size: int, steps: int) -> int:
        n, drop = int(self.data_sizes[client]), self.config.train.drop_last
        return sum(batch_sizes(n, batch_size, steps, drop))

    def client_cost(
        self,
        client: int,
        cut: int,
        samples: int,
        round_idx: int,
        batch_size: int | None = None,
        **flags,
    ) -> ClientCost:
        """Shared cost model (S²FL Eq. 1) for ``client``'s profile in round ``round_idx``;
        ``flags``: ``model_down``, ``model_up``, ``gradients``, ``uploaded``, ``aux`` (see
        ``split_client_cost``).
        With ``devices.exchange_latency_s``, each exchange costs that much more: one per
        mini-batch of ``batch_size`` (default ``train.batch_size``) for a split model, one per
        model transfer."""
        latency = self.config.devices.exchange_latency_s
        exchanges = 0
        if latency:
            b = batch_size or self.config.train.batch_size
            sent = flags.get("uploaded")
            exchanges = -(-(samples if sent is None else sent) // b) if cut < self.num_blocks else 0
            exchanges += int(flags.get("model_down", True)) + int(flags.get("model_up", True))
        device = self.population.at(client, round_idx)
        cost = split_client_cost(
            self.profile,
            cut,
            samples,
            device,
            self.population.server,
            self.config.devices.label_bytes,
            exchanges=exchanges,
            exchange_latency=latency,
            **flags,
        )
        if cut < self.num_blocks and is_active(self.config.train.defence):
            self.charge_defence(cost, cut, samples, batch_size, device)
        return cost

    def charge_defence(
        self, cost: ClientCost, cut: int, samples: int, batch_size, device, tail=None
    ):
        """``train.defence``'s device FLOPs for ``samples`` samples at ``cut`` (the U-shaped
        family's price calls it too, with its ``tail``: the head's gradient is what the label
        defences perturb; DP-SGD trains the front, blocks ``[0, cut)``)
        (:func:`~splitfl.roles.defences.defence_flops_per_sample`) added to ``cost`` at the
        device's speed (no bytes)."""
        prof = self.profile
        params = prof.device_bytes(cut)
        head_grad = 0 if tail is None else prof.gradient_bytes(tail)
        per_sample = defence_flops_per_sample(
            self.config.train.defence,
            math.prod(self.bundle.input_shape),
            prof.gradient_bytes(cut) // BYTES_PER_ELEMENT,
            batch_size or self.config.train.batch_size,
            device_params=params // BYTES_PER_ELEMENT,
            head_grad_elements=head_grad // BYTES_PER_ELEMENT,
        )
        cost.device_flops += samples * per_sample
        cost.device_time += samples * per_sample / device.flops

    def task_cost(
        self, task, samples: int, round_idx: int, device_loss: str, **extra
    ) -> ClientCost:
        """Cost of a planned task (a :class:`~splitfl.core.plan.ClientTask`); ``extra``: more
        :func:`~splitfl.system.cost.split_client_cost` arguments (auxiliary plans' uploads
        and auxiliary-model charge)."""
        return self.client_cost(
            task.client,
            task.cut,
            samples,
            round_idx,
            task.batch_size,
            model_down=task.download_model,
            model_up=task.upload_model,
            gradients=device_loss in ("server", "local+server"),
            **extra,
        )

    def nominal_time(self, client: int, cut: int, round_idx: int) -> float:
        """Eq. (1) time of ``client`` at ``cut`` with the run's batch size, no jitter."""
        b = self.config.train.batch_size
        samples = self.round_samples(client, b, self.local_steps(client, b))
        return self.client_cost(client, cut, samples, round_idx).time

    def resolve_cut(self, cut: int | None, algorithm: str) -> int:
        """An algorithm's ``cut`` option, or the model's default cut (its paper's split, else
        its last candidate) when null."""
        if cut is None:
            return self.model.default_cut
        if not 1 <= cut < self.num_blocks:
            raise ConfigError(
                f"options.{algorithm}.cut",
                f"must be in [1, {self.num_blocks - 1}] for model {self.config.model} "
                f"(candidates {list(self.cut_points)}); got {cut}",
            )
        return cut


@dataclass
class Prepared:
    config: ExperimentConfig
    ctx: RunContext
    algorithm: Algorithm

    @cached_property
    def data_fingerprint(self) -> dict[str, str]:
        """What the run's data files (or loaded data) are: kept in its checkpoints, compared
        on resume (:mod:`splitfl.experiment.fingerprint`)."""
        return data_fingerprint(self.config, self.ctx.bundle)


def _check_label_range(config: ExperimentConfig, bundle: DatasetBundle, outputs: int) -> None:
    """The targets must fit ``train.loss`` on the model's ``outputs`` logits: class labels
    below ``outputs`` (else cross-entropy fails mid-run with an IndexError), float targets of
    ``outputs`` values per sample (:func:`~splitfl.training.target_problem`). An empty train
    split (``data.source: devices``: the devices hold it) is not checked here."""
    loss = config.train.loss
    splits = [split for split in (bundle.train, bundle.test) if len(split)]
    if loss == "cross_entropy" and not bundle.test.y.is_floating_point():
        top = max(int(split.y.max()) for split in splits)
        if top >= outputs:
            raise ConfigError(
                "model",
                f"{config.model} has {outputs} outputs but {config.data.dataset} labels "
                f"reach {top}",
            )
    if config.data.train_samples is not None:  # executor: timing's label vector trains nothing
        return
    for split in splits:
        problem = target_problem(loss, split.y, outputs)
        if problem:
            raise ConfigError("train.loss", f"{loss} {problem} ({config.data.dataset})")


def _warn_extra_outputs(config: ExperimentConfig, bundle: DatasetBundle, outputs: int) -> None:
    """A one-line :class:`DatasetWarning` when a classifier has more outputs than the data has
    classes (a 10-way head on 3 classes trains, its extra logits never a target): often a
    builder that ignores ``num_classes``."""
    if config.train.loss != "cross_entropy" or config.data.targets == "values":
        return
    if outputs > bundle.num_classes:
        warnings.warn(
            DatasetWarning(
                f"model {config.model} has {outputs} outputs but {config.data.dataset} has "
                f"{bundle.num_classes} classes: outputs {bundle.num_classes}..{outputs - 1} "
                "are never a label (does the model's builder use num_classes?)"
            ),
            stacklevel=2,
        )


def _warn_unseen_labels(config: ExperimentConfig, bundle: DatasetBundle) -> None:
    """A one-line :class:`DatasetWarning` when test labels never occur in training (a typo'd
    class folder, a split by time): the class count includes them, no client can learn them."""
    if config.data.train_samples is not None or config.train.loss != "cross_entropy":
        return
    unseen = unseen_test_labels(bundle)
    if unseen:
        names = bundle.class_names
        shown = [names[k] if names and k < len(names) else k for k in unseen[:5]]
        more = f" and {len(unseen) - 5} more" if len(unseen) > 5 else ""
        warnings.warn(
            DatasetWarning(
                f"{config.data.dataset}: test labels {shown}{more} never occur in the training "
                f"split; the model has {bundle.num_classes} classes"
            ),
            stacklevel=2,
        )


def read_data(config: ExperimentConfig) -> DatasetBundle:
    """The dataset's files, or (``data.train_samples``, ``executor: timing``) labels only."""
    d = config.data
    if d.source == "devices":
        return test_only(config)
    if d.train_samples is None:
        return load_dataset(d)
    try:
        return labels_only(d.dataset, d.train_samples)
    except KeyError:
        raise ConfigError(
            "data.train_samples",
            f"{d.dataset}'s sample shape is not registered (no labels without its files); "
            "use null to read the dataset",
        ) from None


def test_only(config: ExperimentConfig) -> DatasetBundle:
    """``data.source: devices``: the server's test set (``data.test_path``, else the test split
    of ``data.dataset``) and an empty training split — the devices hold the training data."""
    d = config.data
    black = None
    if d.test_path is None:
        full = load_dataset(d)
        test, classes, black = full.test, full.num_classes, full.black
    else:
        x, y, classes = load_test(d.test_path, d.format, container_options(d))
        test = ArrayDataset(normalized(x, transforms_of(d)), y)
    empty = ArrayDataset(test.x[:0].clone(), test.y[:0].clone())
    return DatasetBundle(d.dataset, empty, test, classes, tuple(test.x.shape[1:]), black)


def resolve_drop_last(config: ExperimentConfig, model: torch.nn.Module) -> ExperimentConfig:
    """``train.drop_last: auto`` → ``single`` when ``model`` has BatchNorm layers (never a
    batch of one through them, :class:`~splitfl.config.TrainConfig`), else ``false``."""
    if config.train.drop_last != "auto":
        return config
    norms = torch.nn.modules.batchnorm._BatchNorm  # BatchNorm1d/2d/3d, their lazy and sync kin
    drop = "single" if any(isinstance(m, norms) for m in model.modules()) else False
    return config.replace(train=dataclasses.replace(config.train, drop_last=drop))


def build_context(config: ExperimentConfig) -> RunContext:
    """Load data, partition it, draw devices, build the model and its profile. The context
    holds ``config`` resolved (:func:`~splitfl.experiment.validation.resolve_config`).

    Raises:
        ConfigError: where the config does not fit the data or the model.
        DatasetError: where the dataset's files are missing, corrupt or inconsistent.
    """
    config = resolve_config(config)
    d = config.data
    bundle = read_data(config)
    classes = bundle.num_classes if config.train.loss == "cross_entropy" else 0
    held = None
    if d.source == "devices":  # filled from the devices' announcements when they join
        parts = [np.arange(0) for _ in range(d.num_clients)]
        hist = np.zeros((d.num_clients, classes), dtype=np.int64)
    else:
        parts = client_partition(config, bundle)
        if config.eval.on != "server":  # the clients' own validation splits
            parts, held = holdout_split(parts, config.eval.client_holdout, config.seed)
        if classes:
            hist = label_histograms(bundle.train.y.numpy(), parts, classes)
        else:  # no class labels (regression, multi-label): no label histograms
            hist = np.zeros((len(parts), 0), dtype=np.int64)
    population = draw_population(
        config.devices.preset,
        d.num_clients,
        rng_for(config.seed, "devices"),
        config.devices.composition,
        config.devices.d2d_rate,
        config.devices.server_rate,
        config.devices.bandwidth_correlation,
    )
    v = config.devices
    population = with_flops_scale(population, v.flops_scale)
    population = with_variation(population, v.variation, v.variation_period, config.seed)
    torch.manual_seed(config.seed)
    model, logits = checked_model(config, bundle)
    config = resolve_drop_last(config, model)
    _check_label_range(config, bundle, int(logits.shape[-1]))
    _warn_extra_outputs(config, bundle, int(logits.shape[-1]))
    _warn_unseen_labels(config, bundle)
    profile = profile_model(
        config.model,
        bundle.input_shape,
        bundle.num_classes,
        Split.of(config.split),
        config.train.lora,
        config.hf,
    )
    return RunContext(config, bundle, parts, hist, population, model, profile, holdout_indices=held)

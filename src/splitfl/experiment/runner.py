"""Running an experiment: config → prepared run (context + algorithm) → round loop → result.

The round step is :func:`splitfl.experiment.round_step.play_round`, the loop around it
:mod:`splitfl.experiment.loop`, the records :mod:`splitfl.experiment.recorder`. A run
directory holds ``config.yaml`` (resolved), ``data.json`` (input shape and dtype, class names,
cut points), ``clients.json`` (label histograms and device
profiles), ``metrics.jsonl`` (one row per round), ``summary.json``, ``accuracy.png``,
``version.json`` (:mod:`splitfl.experiment.provenance`) and ``checkpoints/last.pt``.
Optimisers are created afresh each round and every random stream is derived from ``(seed,
purpose, round)`` (see :mod:`splitfl.core.seeding`), so a checkpoint of
the global model, the algorithm state and the clock is all a resume needs to reproduce an
uninterrupted run exactly. The checkpoint also holds the metric rows up to its round and is
the source of truth on resume (:mod:`splitfl.experiment.checkpoint`); a run directory is
locked while a process works in it (:mod:`splitfl.rundir.lock`); Ctrl-C/SIGTERM and exploding
losses are handled in :mod:`splitfl.experiment.guards`.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch

from splitfl.algorithms import resolve_algorithm
from splitfl.config import (
    ConfigError,
    ExperimentConfig,
    apply_overrides,
    check_overrides,
    config_fields,
    dump_config,
    from_dict,
)
from splitfl.core.atomic import (
    NAME_MAX,
    TMP_PREFIX,
    creatable_dir_problem,
    naming,
    remove_stale_tmp,
)
from splitfl.executors import WorkersLostError
from splitfl.experiment.checkpoint import load_checkpoint
from splitfl.experiment.context import Prepared, RunContext, build_context
from splitfl.experiment.device_data import write_clients
from splitfl.experiment.fingerprint import check_fingerprint
from splitfl.experiment.loop import run_loop
from splitfl.experiment.model_card import card_table, model_card
from splitfl.experiment.model_check import check_splittable, crossing_lines
from splitfl.experiment.model_errors import ModelRoundError
from splitfl.experiment.provenance import write_data_record, write_version
from splitfl.experiment.validation import check_config, load_config, with_imports
from splitfl.extensions import import_user_modules, reject_objects
from splitfl.metrics.background import wait_plots
from splitfl.models.base import ModelPart, moving_state
from splitfl.net.server.session import StartError
from splitfl.ray_cluster import RayJoinError
from splitfl.roles.dp_sgd import check_supported, dp_active
from splitfl.rundir.lock import LOCK_FILE, hold_lock


@dataclass
class RunResult:
    """What :func:`run` returns: the run directory, its per-round metrics and its summary.
    It is returned once ``summary.json`` is written; ``accuracy.png`` and ``loss.png``
    (``output.plots``) are drawn by a background process: :meth:`wait_plots` waits for them."""

    run_dir: Path
    config: ExperimentConfig
    metrics: list[dict[str, Any]]
    summary: dict[str, Any]

    def wait_plots(self, timeout: float | None = None) -> bool:
        """Wait until this run's end-of-run plots are written (none pending: at once); True
        if they were drawn (:func:`splitfl.metrics.background.wait_plots`)."""
        return wait_plots(self.run_dir, timeout)


def prepare(config: ExperimentConfig, dtype: torch.dtype | None = None) -> Prepared:
    """Build the context and the algorithm; every check that needs the data runs here.

    ``dtype`` (tests only, e.g. ``torch.float64``) converts the model and the data before the
    algorithm copies anything from them. Executor equivalence is checked in float64: there the
    rounding noise of different kernel choices (oneDNN's grouped convolutions under vmap vs.
    one convolution per client differ by ~1e-7 in fp32, amplified by small-batch BatchNorm)
    falls to ~1e-16, while a real discrepancy stays of the order of the update itself."""
    ctx = build_context(config)
    if dtype is not None:
        ctx.model.to(dtype)
        for split in (ctx.bundle.train, ctx.bundle.test):
            if split.x.is_floating_point():  # token ids stay integers
                split.x = split.x.to(dtype)
    cls, options = resolve_algorithm(config.algorithm, config.options)
    check_splittable(ctx.config, ctx.model, cls)
    if getattr(options, "cut", None) is not None:
        ctx.resolve_cut(options.cut, config.algorithm)
    for name in config.options:  # a non-selected algorithm's cut must fit the model too
        cut = getattr(resolve_algorithm(name, config.options)[1], "cut", None)
        if cut is not None:
            ctx.resolve_cut(cut, name)
    if dp_active(config.train.defence):  # before the run directory: a BatchNorm front
        deepest = max(ctx.model.cut_points, default=ctx.num_blocks)
        check_supported(ModelPart(ctx.model, 0, deepest))
    return Prepared(ctx.config, ctx, cls(options, ctx))


def validate(
    config: ExperimentConfig | str | Path | dict,
    overrides: list[str] | None = None,
    imports: list[str] | None = None,
) -> str:
    """Check a config and that it fits its data and model, without running (``splitfl
    validate``); the output folder too (:func:`check_output`). ``imports``: modules to import
    first (``--import``), added to the config's ``imports``. Returns a one-line
    description, then the clock's model card (:mod:`splitfl.experiment.model_card`); raises
    ConfigError / DatasetError."""
    cfg = as_config(config, overrides, imports)
    check_output(cfg)
    prepared = prepare(cfg)
    ctx = prepared.ctx
    cfg = ctx.config  # resolved
    shared = "shared" if cfg.devices.contention else "not shared"
    train = f"{len(ctx.bundle.train)} train samples"
    if cfg.data.source == "devices":
        train = f"training data on the devices, {len(ctx.bundle.test)} test samples"
    summary = (
        f"ok: {cfg.algorithm} on {cfg.data.dataset} ({train}, {_outputs(ctx)}, "
        f"{ctx.num_clients} clients), model {cfg.model} ({ctx.num_blocks} blocks, "
        f"cut points {_cuts(ctx)}), devices "
        f"{cfg.devices.preset} (server link {shared}: "
        f"devices.contention={str(cfg.devices.contention).lower()}), {cfg.rounds} rounds"
    )
    notes = "".join(f"\nnote: {line}" for line in [*_model_notes(ctx), *prepared.algorithm.notes()])
    crossing = "".join(f"\n{line}" for line in crossing_lines(cfg, ctx.model, ctx.bundle))
    card = card_table(model_card(cfg))
    return f"{summary}{crossing}{notes}\n\nThe clock's decisions (docs/model-cards.md):\n\n{card}"


def _model_notes(ctx: RunContext) -> list[str]:
    """What crosses each cut of a Hugging Face model, and its attention implementation."""
    crossing = getattr(ctx.model, "crossing", None)
    if crossing is None:
        return []
    return [
        f"model: {ctx.model.attention} attention; at every cut the device sends {crossing}; "
        "the server sends back the gradient of the hidden states"
    ]


def _cuts(ctx: RunContext) -> str:
    """The cut points as block indices, with the user's module paths where the model was cut
    by them (``split.cut_points``, :mod:`splitfl.models.graph`): ``[1 (layer1), 2 (layer2)],
    default 2 (layer2)``."""
    names = dict(zip(ctx.cut_points, getattr(ctx.model, "cut_names", ()), strict=False))
    named = lambda c: f"{c} ({names[c]})" if c in names else str(c)  # noqa: E731
    if not names:
        return f"{list(ctx.cut_points)}, default {ctx.model.default_cut}"
    listed = ", ".join(named(c) for c in ctx.cut_points)
    return f"[{listed}], default {named(ctx.model.default_cut)}"


def _outputs(ctx: RunContext) -> str:
    """What the model predicts: the class count, or float targets per sample."""
    if ctx.config.data.targets == "values":
        return f"{ctx.bundle.num_classes} float target(s) per sample"
    return f"{ctx.bundle.num_classes} classes"


def _default_name(config: ExperimentConfig) -> str:
    dataset = config.data.dataset.rpartition(":")[2]  # an import path: its callable's name
    return config.output.name or (f"{config.algorithm}-{dataset}-{datetime.now():%Y%m%d-%H%M%S}")


def check_output(config: ExperimentConfig, run_dir: str | Path | None = None) -> None:
    """Refuse (one line) a run directory that :func:`run` could not create: ``run_dir``, or
    ``output.out_dir`` with ``output.name`` (a numbered suffix is added when it exists)."""
    field = "--out" if run_dir is not None else "output.out_dir"
    folder = Path(run_dir) if run_dir is not None else Path(config.output.out_dir)
    problem = creatable_dir_problem(folder)
    if problem is not None:
        raise ConfigError(field, f"{str(folder).replace(chr(0), '?')}: {problem}")
    if run_dir is None:
        name = _default_name(config)
        size, limit = len(Path(name).name.encode()), NAME_MAX - 8  # room for a "-<n>" suffix
        if size > limit:
            raise ConfigError(
                "output.name", f"{size} bytes long; at most {limit} (file systems refuse more)"
            )
        problem = creatable_dir_problem(folder / name)
        if problem is not None:
            raise ConfigError("output.name", f"{name!r}: {problem}")


def new_run_dir(config: ExperimentConfig, parent: Path | None = None) -> Path:
    """Create and return a new run directory ``out_dir/name`` (``name-1``, ``name-2``, …
    when taken). ``mkdir`` itself decides, so two runs started together never share one."""
    target = (parent or Path(config.output.out_dir)) / _default_name(config)
    base, name = target.parent, target.name
    with naming(base):
        base.mkdir(parents=True, exist_ok=True)
    path, i = target, 1
    while True:
        try:
            with naming(path):
                path.mkdir()
            return path
        except FileExistsError:
            path, i = base / f"{name}-{i}", i + 1


def _claim_run_dir(path: Path) -> bool:
    """Create ``path`` for a run (``splitfl run --out``); an existing empty directory is
    accepted (the lock and temporary files of a process killed there aside). Returns whether
    it was created. Raises a one-line ConfigError otherwise."""
    if path.is_dir():
        leftovers = (LOCK_FILE, TMP_PREFIX)
        if any(not p.name.startswith(leftovers) for p in path.iterdir()):
            raise ConfigError(
                "--out",
                f"{path} already exists and is not empty; give a new directory, or continue "
                f"a stopped run with: splitfl run --resume {path}",
            )
        return False
    if path.exists() or path.is_symlink():
        raise ConfigError("--out", f"{path} exists and is not a directory")
    with naming(path):
        path.mkdir(parents=True)
    return True


def run(
    config: ExperimentConfig | str | Path | dict,
    overrides: list[str] | None = None,
    run_dir: str | Path | None = None,
    progress: bool | None = None,
    imports: list[str] | None = None,
    address: str | None = None,
) -> RunResult:
    """Run one experiment (the Python twin of ``splitfl run``).

    Args:
        config: An :class:`ExperimentConfig`, a YAML path, or a mapping of fields. A model
            or dataset is named (registered, or an import path ``package.module:callable``),
            never given as an object: a name reaches Ray workers, devices and a resume.
        overrides: ``key=value`` overrides (``train.lr=0.05``).
        run_dir: Where to write: a new or an empty directory; default
            ``output.out_dir/<algorithm>-<dataset>-<time>``.
        progress: Show a progress bar (default: ``output.progress``).
        imports: Modules to import first (``--import``), added to the config's ``imports``.
        address: The Ray cluster of ``executor: parallel`` with ``parallel.backend: ray``
            (``--address``: ``auto``, ``ray://host:10001``); sets ``parallel.address``.

    An OS error (a full disk, a read-only folder), a Ray cluster that does not answer
    (:class:`~splitfl.ray_cluster.RayJoinError`), a networked server that cannot start
    (:class:`~splitfl.net.server.session.StartError`: listen address, TLS files, no devices in
    time) or parallel workers that cannot be started
    (:class:`~splitfl.executors.WorkersLostError`) before the run's first checkpoint removes
    what the run created; after it, the directory is a stopped run to resume.
    """
    config = as_config(config, with_address(overrides, address), imports)
    check_output(config, run_dir)
    prepared = prepare(config)
    if run_dir is None:
        path, created = new_run_dir(config), True
    else:
        path = Path(run_dir)
        created = _claim_run_dir(path)
    try:
        with hold_lock(path):
            if run_dir is not None:
                _claim_run_dir(path)  # still empty, now that no other process can write it
            dump_config(prepared.config, path / "config.yaml")  # resolved
            write_clients(prepared.ctx, path / "clients.json")
            write_data_record(prepared.ctx, path / "data.json")
            return _finish(prepared, path, start=None, progress=progress)
    except (OSError, RayJoinError, StartError, WorkersLostError):  # disk; Ray; devices; workers
        if not (path / "checkpoints" / "last.pt").exists():
            _remove_unstarted(path, created)
        raise
    except ModelRoundError as err:  # the model raised in round 1: no run to keep
        if err.rounds_done == 0:
            _remove_unstarted(path, created)
        raise


def with_address(overrides: list[str] | None, address: str | None) -> list[str]:
    """``overrides`` and, where ``address`` is given (``--address``), ``parallel.address``
    set to it (quoted: an address is never read as a YAML number)."""
    extra = [f"parallel.address={json.dumps(address)}"] if address is not None else []
    return [*check_overrides(overrides or []), *extra]  # a lone string: one line


def _remove_unstarted(path: Path, created: bool) -> None:
    """Remove what a run that never reached its first checkpoint wrote (the folder itself
    if the run created it), so no half-made run directory is left behind."""
    if created:
        shutil.rmtree(path, ignore_errors=True)
    else:
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)


def resume(
    run_dir: str | Path,
    progress: bool | None = None,
    overrides: list[str] | None = None,
    imports: list[str] | None = None,
    address: str | None = None,
) -> RunResult:
    """Continue a stopped run from ``run_dir/checkpoints/last.pt`` (``splitfl run --resume``).

    ``overrides`` may change only ``network.*`` and ``parallel.*`` settings (a resumed server
    listens where it is told, with the certificates and tokens it is given; parallel workers
    run where they are told, ``address`` setting ``parallel.address`` as in :func:`run`) and
    ``rounds`` (more rounds extend a stopped or finished run exactly; ``config.yaml`` is
    rewritten with them); the experiment stays as it was.
    ``config.yaml`` may differ from the checkpoint's config only in the fields of
    :data:`~splitfl.experiment.checkpoint.MAY_CHANGE` (e.g. more ``rounds``): a checkpoint
    of another config is refused in one line naming the differing fields. The run's own
    ``imports`` are imported again from where they were found (``import_dirs``); ``imports``
    names more modules to import first (they do not change the run's config).
    """
    import_user_modules(imports or [], [Path.cwd()], field="--import")
    path = Path(run_dir)
    if not (path / "config.yaml").is_file():
        raise ConfigError("--resume", f"{path} is not a run directory (no config.yaml)")
    overrides = with_address(overrides, address)
    for item in overrides:
        if not item.startswith(("network.", "parallel.", "rounds=")):
            raise ConfigError(
                "--resume",
                f"only rounds, network.* and parallel.* settings can change (got {item!r})",
            )
    with hold_lock(path):
        config = load_config(path / "config.yaml", overrides)
        prepared = prepare(config)
        ckpt_path = path / "checkpoints" / "last.pt"
        remove_stale_tmp(ckpt_path.parent)
        start = None
        if ckpt_path.exists():
            model = prepared.ctx.model  # a LoRA checkpoint holds the moving tensors only
            shapes = {k: v.shape for k, v in moving_state(model, model).items()}
            start = load_checkpoint(ckpt_path, shapes, config)
            check_fingerprint(start.get("data"), prepared.data_fingerprint, ckpt_path)
        else:  # stopped before its first checkpoint: a fresh start under this config
            write_clients(prepared.ctx, path / "clients.json")
            write_data_record(prepared.ctx, path / "data.json")
        if any(item.startswith("rounds=") for item in overrides):  # extended (checked above)
            dump_config(prepared.config, path / "config.yaml")
        return _finish(prepared, path, start=start, progress=progress)


def _finish(prep: Prepared, run_dir: Path, start: dict | None, progress: bool | None):
    """Record the software (``version.json``), then play the rounds (the loop writes
    ``model.pt``, then ``summary.json``)."""
    write_version(run_dir)
    summary, st, rows = run_loop(prep, run_dir, start, progress)
    prep.ctx.model.load_state_dict(st.global_state)
    return RunResult(run_dir, prep.config, rows, summary)


def as_config(
    config: Any, overrides: list[str] | None = None, imports: list[str] | None = None
) -> ExperimentConfig:
    """An :class:`ExperimentConfig` from a config, a mapping or a YAML path (+ overrides, +
    ``imports``), fully validated. A hand-built config is rebuilt from its fields, so its
    values are type-checked (and numpy scalars turned into Python ones) as a file's would
    be; a model or dataset object in a mapping is a one-line error saying what to give."""
    if isinstance(config, ExperimentConfig):
        config = config_fields(config)
    elif not isinstance(config, dict | str | Path | None):
        raise ConfigError(
            "config", f"expected an ExperimentConfig, a mapping or a YAML path, got {config!r}"
        )
    if isinstance(config, dict):
        reject_objects(config)
        cfg = from_dict(ExperimentConfig, apply_overrides(config, overrides or []))
        cfg = with_imports(cfg, imports)
        check_config(cfg)
        return cfg
    return load_config(config, overrides, imports)

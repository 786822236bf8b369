"""Extension points resolved in one place: user modules (``imports:``), installed plugins
(the ``splitfl.plugins`` entry-point group), and ``model:`` / ``data.dataset:`` given as a
registered name or an import path ``package.module:callable``.

Validation (:mod:`splitfl.experiment.validation`), the run's context, sweep trials (in this
process or a Ray worker) and device processes all call these functions, so a model or a
dataset that works in one of them works in all:

* :func:`import_config_modules` imports a config's ``imports`` and the modules of its import
  paths, searching ``PYTHONPATH``, then the config's ``import_dirs`` (where a run found them,
  recorded in its ``config.yaml`` for ``--resume``), the config file's directory and the
  current directory; a module that fails is one line naming it and its error's last line.
* :func:`fill_import_dirs` records where those modules were found (``import_dirs``);
  :func:`modules_to_ship` lists the ones a Ray worker on another machine lacks (not installed
  in site-packages), shipped as the trial's ``runtime_env`` ``py_modules``.
* :func:`build_model`, :func:`profile_model`, :func:`load_dataset` take a registered name or
  an import path. A model callable follows the builder contract of
  :mod:`splitfl.models.registry`; a dataset callable gets ``root`` (and ``verify``) if it takes
  them and returns what :func:`splitfl.data.source.from_object` accepts.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import inspect
import os
import re
import site
import sys
import sysconfig
import warnings
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from splitfl.config import ConfigError, DataConfig, ExperimentConfig
from splitfl.config.choices import unknown_choice
from splitfl.core.usercode import error_line, user_code
from splitfl.data.base import DatasetBundle, DatasetError, dataset_names
from splitfl.data.source import from_object, read_dataset
from splitfl.models import profile as profiles
from splitfl.models.aux_heads import AUX_MODELS, aux_names
from splitfl.models.base import BlockModel
from splitfl.models.hf import check_hf_spec, hf_block_model, is_hf_spec
from splitfl.models.hf_stack import Unsplittable
from splitfl.models.lora_targets import is_target_error, target_problem
from splitfl.models.registry import (
    NO_SPLIT,
    ModelContractError,
    Split,
    call_builder,
    make_model,
    model_names,
)
from splitfl.models.registry import build_model as build_registered_model

#: Entry-point group of installed packages that register models, datasets or algorithms:
#: ``[project.entry-points."splitfl.plugins"] mine = "mypkg.splitfl_plugin"`` (a module,
#: imported; or a function, called with no arguments).
PLUGIN_GROUP = "splitfl.plugins"
_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
#: splitfl's one-line errors, which user code may raise (a loader calling splitfl's own).
ONE_LINE = (ConfigError, DatasetError, ModelContractError)
_plugins_loaded = False


def is_import_path(spec: str) -> bool:
    """``package.module:callable`` (registered names hold no ``:``; ``hf:``/``hf-config:``
    name Hugging Face models, :mod:`splitfl.models.hf`)."""
    return ":" in spec and not is_hf_spec(spec)


def load_plugins() -> None:
    """Import every ``splitfl.plugins`` entry point once per process (a function entry
    point is called). A broken plugin is a one-line warning, not a failed run."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in metadata.entry_points(group=PLUGIN_GROUP):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, ModuleType):
                obj()
        except Exception as err:  # noqa: BLE001 - one broken plugin must not stop the others
            warnings.warn(f"splitfl plugin {ep.name} ({ep.value}): {error_line(err)}", stacklevel=2)


def _needed(config: ExperimentConfig) -> list[tuple[str, str]]:
    """(field, module) of ``imports`` and of ``model:``/``data.dataset:`` import paths."""
    out = [("imports", name) for name in config.imports]
    for field, spec in (("model", config.model), ("data.dataset", config.data.dataset)):
        if is_import_path(spec):
            out.append((field, spec.partition(":")[0]))
    return out


def required_modules(config: ExperimentConfig) -> list[str]:
    """``imports`` plus the modules of ``model:`` and ``data.dataset:`` import paths."""
    return list(dict.fromkeys(name for _, name in _needed(config)))


def import_user_modules(
    names: Iterable[str], search_dirs: Iterable[str | Path] = (), field: str = "imports"
) -> list[ModuleType]:
    """Import ``names`` (after the plugins), with ``search_dirs`` appended to ``sys.path``
    (after ``PYTHONPATH`` and the installed packages). Raises a one-line ConfigError."""
    load_plugins()
    search_dirs = list(search_dirs)
    for folder in search_dirs:
        path = str(Path(folder).resolve())
        if path not in sys.path and Path(path).is_dir():
            sys.path.append(path)
    modules = []
    where = ", ".join(["PYTHONPATH", *map(str, search_dirs)])

    def failed(message: str) -> ConfigError:
        return ConfigError(field, f"{message} (searched {where})")

    for name in names:
        if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name):
            raise ConfigError(field, f"{name!r} is not a module name (package.module)")
        with user_code(f"cannot import {name!r}", failed):
            modules.append(importlib.import_module(name))
    return modules


def import_config_modules(
    config: ExperimentConfig, config_dir: str | Path | None = None
) -> list[ModuleType]:
    """Import what ``config`` needs (:func:`required_modules`), searching its
    ``import_dirs``, ``config_dir`` (the config file's directory) and the current directory."""
    load_plugins()
    dirs = [*(config.import_dirs or []), *([config_dir] if config_dir else []), Path.cwd()]
    return [m for field, name in _needed(config) for m in import_user_modules([name], dirs, field)]


def _installed_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths]
    roots += [*site.getsitepackages(), site.getusersitepackages()]
    return [Path(r).resolve() for r in roots]


def _user_roots(names: Iterable[str]) -> list[ModuleType]:
    """The top-level modules of ``names`` (imported) that are not installed packages."""
    installed, out = _installed_roots(), []
    for top in dict.fromkeys(n.split(".")[0] for n in names):
        module = sys.modules.get(top)
        file = getattr(module, "__file__", None)
        if module is None or file is None or top == "splitfl":
            continue
        path = Path(file).resolve()
        if not any(path.is_relative_to(root) for root in installed):
            out.append(module)
    return out


def modules_to_ship(config: ExperimentConfig) -> list[str]:
    """The files (a module) or folders (a package) of the config's user modules that are not
    installed (a Ray worker elsewhere lacks them): a trial's runtime environment's
    ``py_modules``."""
    return [
        str(Path(m.__path__[0]) if hasattr(m, "__path__") else Path(m.__file__))
        for m in _user_roots(required_modules(config))
    ]


def fill_import_dirs(config: ExperimentConfig) -> ExperimentConfig:
    """``config`` with ``import_dirs`` (null) set to the folders its user modules were found
    in, so ``--resume`` from elsewhere and launched devices find them again."""
    if config.import_dirs is not None or not required_modules(config):
        return config
    dirs = []
    for module in _user_roots(required_modules(config)):
        path = Path(module.__file__).resolve().parent
        dirs.append(str(path.parent if hasattr(module, "__path__") else path))
    return config.replace(import_dirs=list(dict.fromkeys(dirs)))


def child_env(config: ExperimentConfig) -> dict[str, str]:
    """This process's environment with the config's ``import_dirs`` on ``PYTHONPATH`` (for
    the device processes ``splitfl launch`` starts)."""
    env = dict(os.environ)
    extra = [*(config.import_dirs or []), str(Path.cwd())]
    env["PYTHONPATH"] = os.pathsep.join([*filter(None, [env.get("PYTHONPATH")]), *extra])
    return env


def resolve_callable(spec: str, field: str) -> Callable[..., Any]:
    """The callable named by ``package.module:attr[.attr]`` (one-line ConfigError)."""
    module_name, _, attr = spec.partition(":")
    if not attr or not _MODULE_NAME.fullmatch(attr):
        raise ConfigError(field, f"{spec!r}: expected an import path package.module:callable")
    (module,) = import_user_modules([module_name], field=field)
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(field, f"{spec!r}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(field, f"{spec!r} is a {type(obj).__name__}, not a callable")
    return obj


def check_model(spec: str) -> None:
    """``model:`` is a registered name (with a "did you mean"), an import path or a Hugging
    Face model (``hf:``/``hf-config:``, whose folder must exist where it is not a hub id)."""
    if is_hf_spec(spec):
        try:
            check_hf_spec(spec)
        except (ImportError, ValueError) as err:
            raise ConfigError("model", str(err)) from None
    elif is_import_path(spec):
        resolve_callable(spec, "model")
    elif spec not in model_names():
        raise ConfigError("model", unknown_choice(spec, model_names()) + _import_hint())


def check_dataset(spec: str) -> None:
    """``data.dataset:`` is a registered name (with a "did you mean") or an import path."""
    if is_import_path(spec):
        resolve_callable(spec, "data.dataset")
    elif spec not in dataset_names():
        raise ConfigError("data.dataset", unknown_choice(spec, dataset_names()) + _import_hint())


def device_imports(config: ExperimentConfig) -> None:
    """On a device process: import what the server's config names (its ``imports`` and
    import paths) from this device's own environment (``PYTHONPATH``, current directory;
    never the server's paths), and check its model and dataset names. A device lacking one
    gets a one-line ConfigError. The dataset name matters only where the device reads the
    server's dataset: with ``data.format`` it merely names a container, and with
    ``data.source: devices`` the device reads its own files."""
    import_config_modules(config.replace(import_dirs=None))
    d = config.data
    try:
        check_model(config.model)
        if d.format is None and d.source == "partition":
            check_dataset(d.dataset)
    except ConfigError as err:
        raise ConfigError(
            err.field_path,
            f"{str(err).partition(': ')[2]} (on this device: a name registered in the "
            "server's process only reaches devices through a module in imports:)",
        ) from None


def _import_hint() -> str:
    return "; or an import path package.module:callable"


def build_model(
    spec: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    split: Split = NO_SPLIT,
    lora: Any = None,
    what: str | None = None,
    hf: Any = None,
) -> BlockModel:
    """The model ``spec`` names (registered or an import path), for ``input_shape`` and
    ``num_classes``, an ``nn.Module`` cut where ``split`` says, a Hugging Face model with
    ``lora`` adapters (``train.lora``) where given, built as ``hf`` (the ``hf`` section)
    says. A model that cannot be split, a broken builder contract, and any
    exception of the builder, is a one-line ConfigError on ``model`` starting with ``what``
    (default ``spec``)."""
    try:
        if is_hf_spec(spec):
            return _hf_model(spec, num_classes, lora, hf)
        if not is_import_path(spec):
            build = functools.partial(build_registered_model, spec)
        else:
            build = functools.partial(make_model, resolve_callable(spec, "model"), spec)
        with user_code(what or spec, functools.partial(ConfigError, "model"), ONE_LINE):
            return build(input_shape, num_classes, split)
    except (ModelContractError, Unsplittable) as err:
        raise ConfigError("model", str(err)) from None


def _hf_model(spec: str, num_classes: int, lora: Any, hf: Any = None) -> BlockModel:
    """:func:`~splitfl.models.hf.hf_block_model`; LoRA target modules that match none of
    the model's modules are a one-line ConfigError listing its module names."""
    try:
        return hf_block_model(spec, num_classes, lora, hf)
    except ValueError as err:
        if lora is None or not is_target_error(err):
            raise
        problem = target_problem(spec, num_classes, lora.target_modules)
    raise ConfigError("train.lora.target_modules", problem)


def build_aux(
    spec: str, input_shape: tuple[int, ...], num_classes: int, field: str = "aux_model"
) -> torch.nn.Module:
    """The auxiliary model ``spec`` names (:data:`~splitfl.models.aux_heads.AUX_MODELS` or an import
    path, called with ``input_shape``/``num_classes`` where its signature takes them) for smashed
    data of ``input_shape`` per sample; a wrong name or a builder that returns no ``nn.Module``
    is a one-line ConfigError on ``field``."""
    if is_import_path(spec):
        module = call_builder(resolve_callable(spec, field), tuple(input_shape), num_classes)
    elif spec in AUX_MODELS:
        try:
            module = AUX_MODELS[spec](tuple(input_shape), num_classes)
        except ValueError as err:
            raise ConfigError(field, f"{spec}: {err}") from None
    else:
        raise ConfigError(field, unknown_choice(spec, aux_names()) + _import_hint())
    if not isinstance(module, torch.nn.Module):
        raise ConfigError(field, f"{spec!r} returned a {type(module).__name__}, not an nn.Module")
    return module


def profile_model(
    spec: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    split: Split = NO_SPLIT,
    lora: Any = None,
    hf: Any = None,
):
    """The per-block cost profile of ``spec`` (cached), measured as for built-ins."""
    build = build_model
    if lora is not None or hf is not None:
        build = functools.partial(build_model, lora=lora, hf=hf)
    return profiles.profile_model(spec, input_shape, num_classes, build=build, split=split)


def load_dataset(d: DataConfig, root: str | Path | None = None) -> DatasetBundle:
    """The run's dataset (``d``: the config's ``data``; ``root`` overrides ``d.root``): a
    registered name or a container (``data.format``) read by
    :func:`~splitfl.data.source.read_dataset`, or an import path whose callable gets ``root``
    and ``verify`` where its signature takes them and returns what
    :func:`~splitfl.data.source.from_object` accepts (a ``DatasetBundle``, a ``(train,
    test)`` pair of torch ``Dataset`` s, a Hugging Face ``DatasetDict``)."""
    root = root if root is not None else d.root
    if not is_import_path(d.dataset):
        return read_dataset(d, root)
    fn = resolve_callable(d.dataset, "data.dataset")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        params = {}
    given = {"root": Path(root) if root is not None else None, "verify": d.verify}
    with user_code(d.dataset, DatasetError, ONE_LINE):
        obj = fn(**{k: v for k, v in given.items() if k in params})
    return from_object(obj, d)


def reject_objects(data: dict[str, Any]) -> None:
    """A config mapping holding a model or dataset object instead of its name: one line
    saying what to give instead (objects do not reach Ray workers, devices or a resume)."""
    for path, value in (("model", data.get("model")), ("data.dataset", _dataset(data))):
        if value is None or isinstance(value, str):
            continue
        hint = ""
        qual = getattr(value, "__qualname__", "")
        if callable(value) and getattr(value, "__module__", "__main__") != "__main__" and qual:
            hint = f" (here: {value.__module__}:{qual})"
        raise ConfigError(
            path,
            f"got a {type(value).__name__} object; give a registered name "
            f"(splitfl.register_{'model' if path == 'model' else 'dataset'}) or an import "
            f"path package.module:callable that builds it{hint}",
        )


def _dataset(data: dict[str, Any]) -> Any:
    section = data.get("data")
    return section.get("dataset") if isinstance(section, dict) else None


def add_import_flag(parser: argparse.ArgumentParser) -> None:
    """``--import MODULE`` (repeatable) on a command: modules imported before the config
    is checked, as the config's ``imports:``."""
    parser.add_argument(
        "--import",
        dest="imports",
        action="append",
        default=[],
        metavar="MODULE",
        help="import MODULE first (it may register models, datasets, algorithms); repeatable; "
        "found on PYTHONPATH, in the current directory and the config's directory",
    )

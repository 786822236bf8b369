"""The run's dataset as its config names it (``data.*``): a registered loader or a container
the user brings (``data.format``), with ``normalize`` (``data.transforms``) applied to its
inputs. The one place a run reads its data: the experiment's context and every device process
(:mod:`splitfl.net.device.agent`) call :func:`read_dataset`, so both see the same samples."""

from __future__ import annotations

from splitfl.config import ConfigError, DataConfig
from splitfl.data.base import DatasetBundle, cast_labels, check_bundle, load_dataset
from splitfl.data.convert import bundle_from
from splitfl.data.formats import ContainerOptions, load_container
from splitfl.data.lazy import LazyInputs
from splitfl.data.transforms import (
    TransformError,
    Transforms,
    check_input_shape,
    normalize_inputs,
    parse_transforms,
    with_black,
)


def read_dataset(d: DataConfig, root: str | None = None) -> DatasetBundle:
    """``d``'s dataset (from ``root`` if given, else ``d.root``), normalised per
    ``d.transforms``. Raises a one-line ``DatasetError`` (files) or ``ConfigError``."""
    root = root or d.root
    if d.format is None:  # a registered loader's labels are as it defines them
        text = {"tokenizer": d.tokenizer, "max_length": d.max_length} if d.tokenizer else {}
        bundle = load_dataset(d.dataset, root, verify=d.verify, **text)
    else:
        bundle = load_container(d.format, root, d.dataset, container_options(d))
        check_bundle(cast_labels(bundle), f"{d.dataset}: {d.format} data in {root}")
        bundle = with_targets(bundle, d)
    return with_transforms(bundle, transforms_of(d))


def from_object(obj: object, d: DataConfig) -> DatasetBundle:
    """A dataset given from Python (what ``data.dataset: pkg.mod:callable`` returns: a
    ``DatasetBundle``, a ``(train, test)`` pair of torch ``Dataset`` s, a Hugging Face
    ``DatasetDict``; :func:`~splitfl.data.convert.bundle_from`) as the run's bundle, read per
    ``d`` (``lazy``, ``label_column``, ``image_size``), checked and normalised."""
    options = {"label_column": d.label_column, "image_size": d.image_size}
    options["targets"] = d.targets or "classes"
    bundle = bundle_from(obj, d.dataset, d.lazy, **options)
    check_bundle(bundle, f"{d.dataset}: the object its callable returned")
    return with_transforms(with_targets(bundle, d), transforms_of(d))


def with_targets(bundle: DatasetBundle, d: DataConfig) -> DatasetBundle:
    """``bundle`` (the user's files or object) with integer labels as float32 targets where
    ``d.targets`` is ``values`` (a regression on whole numbers: counts, ratings), untouched
    otherwise. Registered loaders keep the labels they define."""
    if d.targets == "values":
        for part in (bundle.train, bundle.test):
            part.y = part.y.float() if not part.y.is_floating_point() else part.y
    return bundle


def transforms_of(d: DataConfig) -> Transforms:
    """``d.transforms`` parsed (a malformed entry is a ``ConfigError`` on the field)."""
    try:
        return parse_transforms(d.transforms)
    except TransformError as err:
        raise ConfigError("data.transforms", str(err)) from None


def augmentation(d: DataConfig, bundle: DatasetBundle) -> Transforms:
    """What training batches of ``bundle`` go through (``d.transforms``), crops padded with
    the bundle's black (:func:`~splitfl.data.transforms.with_black`)."""
    return with_black(transforms_of(d), bundle.black)


def with_transforms(bundle: DatasetBundle, t: Transforms) -> DatasetBundle:
    """``bundle`` with ``normalize`` applied to both splits' inputs (lazily for lazy inputs);
    the transforms checked against its input shape."""
    try:
        check_input_shape(t, bundle.input_shape)
    except TransformError as err:
        raise ConfigError("data.transforms", f"{bundle.name}: {err}") from None
    for part in (bundle.train, bundle.test):
        part.x = normalized(part.x, t)
    return bundle


def normalized(x, t: Transforms):
    """Inputs ``x`` (a tensor or lazy) with ``t``'s ``normalize`` applied (lazily for lazy
    inputs); ``x`` itself without one. A device's own data goes through this too."""
    if t.mean is None:
        return x
    if isinstance(x, LazyInputs):
        return x.map(lambda b: normalize_inputs(t, b))
    return normalize_inputs(t, x)


def container_options(d: DataConfig) -> ContainerOptions:
    """How ``d`` reads a container's files (``label_column``, ``image_size``, ``lazy``,
    ``partition: folders``)."""
    return ContainerOptions(
        d.label_column,
        d.image_size,
        d.lazy,
        d.partition == "folders",
        d.text_columns,
        d.tokenizer,
        d.max_length,
        d.text_target,
        d.targets or "classes",
    )

"""``data.transforms``: per-batch augmentation of training batches, and input normalisation.

The YAML shape is a list; each item is a name or a one-key mapping::

    transforms:
      - random_crop: 4        # pad 4 pixels on every side, crop back to H x W at random
      - hflip                 # flip left-right with probability 0.5 (or `hflip: 0.3`)
      - normalize: {mean: [0.4914, 0.4822, 0.4465], std: [0.247, 0.243, 0.261]}

This is the papers' CIFAR recipe (``RandomCrop(32, padding=4)``, ``RandomHorizontalFlip()``,
``Normalize(mean, std)``; public-implementation facts). ``random_crop`` and ``hflip`` change
**training batches only**, where a client's batch is drawn (:func:`augment_batch`, called by
:meth:`splitfl.roles.sides.Runtime.batch` and
:meth:`splitfl.executors.rowstack.RowRunner.batch` — every executor and device process); their
draws come from :func:`batch_seed` ``(round seed, client, step)``, never from execution order,
so the sequential, vectorised and networked executors see identical batches. ``normalize``
applies to train and test inputs alike, once, when they are read (:func:`normalize_inputs`);
since normalisation is per pixel and crop/flip only move pixels, normalising first and padding
a crop with the normalised value of 0 (``pad_value``) gives exactly torchvision's
pad-then-normalise. Built-in datasets are already normalised by their loaders.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from splitfl.core.seeding import derive_seed

#: Transform names: random ones (training batches) and normalize (all inputs, when read).
TRANSFORMS = ("random_crop", "hflip", "normalize")


class TransformError(ValueError):
    """A ``data.transforms`` entry is malformed (one line)."""


@dataclass(frozen=True)
class Transforms:
    """Parsed ``data.transforms``: ``augment`` = ``(name, value)`` random ops in order
    (``("random_crop", padding)``, ``("hflip", p)``); ``mean``/``std`` of ``normalize``;
    ``crop_first``: a ``random_crop`` comes before ``normalize``; ``pad_value`` per channel:
    what a padded pixel holds (see :func:`with_black`; None = 0)."""

    augment: tuple[tuple[str, float], ...] = ()
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    crop_first: bool = False
    pad_value: tuple[float, ...] | None = None

    @property
    def needs_images(self) -> bool:
        return any(name == "random_crop" for name, _ in self.augment)


def _item(entry: Any) -> tuple[str, Any]:
    if isinstance(entry, str):
        return entry, None
    if isinstance(entry, dict) and len(entry) == 1:
        return next(iter(entry.items()))
    raise TransformError(f"each entry is a name or a one-key mapping, got {entry!r:.60}")


def _number(name: str, value: Any, lo: float, hi: float, integer: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool)
    if not ok or not lo <= value <= hi or (integer and value != int(value)):
        kind = "an integer" if integer else "a number"
        raise TransformError(f"{name}: expected {kind} in [{lo:g}, {hi:g}], got {value!r:.60}")
    return float(value)


def _channels(name: str, value: Any, positive: bool) -> tuple[float, ...]:
    values = value if isinstance(value, list | tuple) else [value]
    if not values:
        raise TransformError(f"normalize: {name} is empty")
    out = tuple(_number(f"normalize.{name}", v, -1e6, 1e6) for v in values)
    if positive and min(out) <= 0:
        raise TransformError(f"normalize: std must be > 0, got {list(out)}")
    return out


def parse_transforms(entries: list[Any]) -> Transforms:
    """``data.transforms`` → :class:`Transforms`; a malformed entry raises a one-line
    :class:`TransformError` (the config layer reports it on ``data.transforms``)."""
    augment: list[tuple[str, float]] = []
    mean = std = None
    crop_before_norm = False
    for entry in entries:
        name, value = _item(entry)
        if name == "random_crop":
            augment.append((name, _number(name, value, 0, 1024, integer=True)))
            crop_before_norm = crop_before_norm or mean is None
        elif name == "hflip":
            augment.append((name, 0.5 if value is None else _number(name, value, 0, 1)))
        elif name == "normalize":
            if mean is not None or not isinstance(value, dict) or set(value) != {"mean", "std"}:
                raise TransformError("normalize: give it once, as {mean: [...], std: [...]}")
            mean, std = (
                _channels("mean", value["mean"], False),
                _channels("std", value["std"], True),
            )
            if len(mean) != len(std):
                raise TransformError(f"normalize: {len(mean)} means but {len(std)} stds")
        else:
            raise TransformError(f"unknown transform {name!r}; allowed: {', '.join(TRANSFORMS)}")
    return with_black(Transforms(tuple(augment), mean, std, crop_before_norm), None)


def with_black(t: Transforms, black: tuple[float, ...] | None) -> Transforms:
    """``t`` padding crops with a black pixel as the crop sees it: ``black`` (the stored
    value of 0, :attr:`~splitfl.data.base.DatasetBundle.black`; None = 0), normalised when
    ``normalize`` comes after the crop; 0 when the crop sees normalised inputs."""
    base = black or (0.0,)
    if t.mean is None:
        pad = black
    elif t.crop_first:
        n = max(len(base), len(t.mean))
        at = [
            (base[i % len(base)], t.mean[i % len(t.mean)], t.std[i % len(t.std)]) for i in range(n)
        ]
        pad = tuple((b - m) / s for b, m, s in at)
    else:
        pad = None
    return dataclasses.replace(t, pad_value=pad)


def check_input_shape(t: Transforms, input_shape: tuple[int, ...]) -> None:
    """Raise :class:`TransformError` where the transforms do not fit ``input_shape``."""
    if t.needs_images and len(input_shape) != 3:
        raise TransformError(
            f"random_crop needs image inputs [C, H, W], the data has {list(input_shape)}"
        )
    if len(input_shape) < 2 and any(name == "hflip" for name, _ in t.augment):
        raise TransformError(f"hflip needs inputs of >= 2 dimensions, got {list(input_shape)}")
    if t.mean is not None and len(t.mean) not in (1, input_shape[0]):
        raise TransformError(
            f"normalize has {len(t.mean)} channel values for {input_shape[0]} channels"
        )


def _per_channel(values: tuple[float, ...], x: torch.Tensor) -> torch.Tensor:
    shape = (len(values),) + (1,) * (x.dim() - 2)
    return torch.tensor(values, dtype=torch.float64, device=x.device).view(shape)


def normalize_inputs(t: Transforms, x: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / std`` per channel (dimension 1 of a batch), elementwise in ``x``'s
    dtype, so a sample gets the same values in any batch (eager and lazy data agree)."""
    if t.mean is None:
        return x
    m, s = _per_channel(t.mean, x).to(x.dtype), _per_channel(t.std, x).to(x.dtype)
    return (x - m) / s


def batch_seed(round_seed: int, client: int, step: int) -> int:
    """The seed of client ``client``'s ``step``-th training batch's augmentation."""
    return derive_seed(round_seed, "augment", client, step)


def _random_crop(x: torch.Tensor, pad: int, fill: torch.Tensor, gen: torch.Generator):
    b, c, h, w = x.shape
    off = torch.randint(0, 2 * pad + 1, (2, b), generator=gen).to(x.device)
    big = fill.to(x.dtype).expand(b, c, h + 2 * pad, w + 2 * pad).clone()
    big[:, :, pad : pad + h, pad : pad + w] = x
    rows = (off[0][:, None] + torch.arange(h, device=x.device))[:, None, :, None]
    cols = (off[1][:, None] + torch.arange(w, device=x.device))[:, None, None, :]
    n = torch.arange(b, device=x.device)[:, None, None, None]
    ch = torch.arange(c, device=x.device)[None, :, None, None]
    return big[n, ch, rows, cols]


def augment_batch(t: Transforms | None, x: torch.Tensor, seed: int) -> torch.Tensor:
    """One training batch ``x`` ``[B, ...]`` through ``t``'s random ops, drawn from ``seed``
    (a CPU generator, so every device draws the same): ``random_crop`` pads by ``p`` pixels
    (``pad_value``) and crops ``H x W`` at an offset uniform in ``[0, 2p]`` per sample;
    ``hflip`` flips the last dimension of each sample with probability ``p``."""
    if t is None or not t.augment:
        return x
    gen = torch.Generator().manual_seed(seed % (1 << 63))
    for name, value in t.augment:
        if name == "random_crop" and value > 0:
            values = t.pad_value or (0.0,) * x.shape[1]
            fill = _per_channel(values, x)[None]
            x = _random_crop(x, int(value), fill, gen)
        elif name == "hflip":
            flip = (torch.rand(len(x), generator=gen) < value).to(x.device)
            x = torch.where(flip.view(-1, *([1] * (x.dim() - 1))), x.flip(-1), x)
    return x

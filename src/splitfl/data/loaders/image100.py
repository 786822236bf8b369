"""Shape-only datasets for ``executor: timing`` at the papers' sizes: data the papers used that
splitfl cannot ship, registered by shape so that ``data.train_samples`` can time it.

IMAGE-100 (MergeSFL §V-A, ParallelSFL §5.1): 100 of ImageNet's 1,000 classes, "each sample
resized with the shape of 64 × 64 × 3" (MergeSFL). Neither paper publishes its class list,
and ImageNet is not redistributable, so splitfl ships no images: the name registers the shape
for ``executor: timing`` (``data.train_samples``, e.g. 128,117 = 100/1,000 of ImageNet's
1,281,167 training images, an estimate: the papers give no size). To train on your own copy,
use ``data.format: image_folder`` with ``data.image_size: [64, 64]``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from splitfl.data.base import DatasetBundle, DatasetNotFoundError, DatasetShape, register_dataset


@register_dataset(
    "image100",
    "IMAGE-100 shape only (3x64x64, 100 classes) for executor: timing; train on your own copy "
    "with data.format: image_folder",
    needs_root=False,
    shape=DatasetShape((3, 64, 64), 100),
)
def load_image100(root: Path | None = None) -> DatasetBundle:
    """No images ship (module docstring): always raises :class:`DatasetNotFoundError`."""
    del root
    raise DatasetNotFoundError(
        "image100 ships no images (ImageNet is not redistributable): use it with "
        "executor: timing and data.train_samples, or point data.format: image_folder at your "
        "own IMAGE-100 copy"
    )


@register_dataset(
    "image100_144",
    "IMAGE-100 at 3x144x144 (the MergeSFL authors' code), shape only, 100 classes, for "
    "executor: timing",
    needs_root=False,
    shape=DatasetShape((3, 144, 144), 100),
)
def load_image100_144(root: Path | None = None) -> DatasetBundle:
    """IMAGE-100 at the size MergeSFL's printed figures imply (issue 50 item 4): "VGG16 ...
    about 321MB ... bottom model and the features/gradients (with batch size of 64)
    separately are about 56MB and 3MB" (§V-A) are ``vgg16_image100`` at 3×144×144 (84.3M
    parameters = 321.8 MiB, the 13 convs 56.2 MiB, 512×5×5 floats × 64 = 3.3 MB), the
    released code's setting; at 64×64 the model is 153.8 MiB. Shape only, as ``image100``."""
    return load_image100(root)


#: Tokens per QNLI pair in the timing setup: 128, the common GLUE fine-tuning length (the
#: ParallelSFL paper gives none).
QNLI_TOKENS = 128


@register_dataset(
    "qnli_tokens",
    "GLUE QNLI tokenised for a Hugging Face model, shape only ([2, 128] ids + mask, 2 "
    "classes) for executor: timing; train on the GLUE files with data.format: text",
    needs_root=False,
    shape=DatasetShape((2, QNLI_TOKENS), 2, torch.int64),
)
def load_qnli_tokens(root: Path | None = None) -> DatasetBundle:
    """No data here (shape only): always raises :class:`DatasetNotFoundError`."""
    del root
    raise DatasetNotFoundError(
        "qnli_tokens is a shape for executor: timing; read the GLUE QNLI files with "
        "data.format: text, data.text_columns: [question, sentence]"
    )

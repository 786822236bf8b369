"""A model that the parallel workers of ``tests/test_parallel.py`` build by name too
(``model: parallel_models:cnn_digits_dropout``, this folder in ``import_dirs``): the workers
build the run's model from the config, never from an object sent to them."""

from torch import nn

from splitfl.models.registry import build_model


def cnn_digits_dropout(input_shape, num_classes):
    """``cnn_digits`` with dropout at the end of the first block (a device part) and of the
    second to last (a server part, or the device's with a whole-model cut)."""
    model = build_model("cnn_digits", input_shape, num_classes)
    model.blocks[0].append(nn.Dropout(0.3))
    model.blocks[model.num_blocks - 2].append(nn.Dropout(0.3))
    return model

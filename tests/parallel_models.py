"""Models that the parallel workers of ``tests/executors/test_parallel.py`` build by name too
(``model: parallel_models:cnn_digits_dropout``, this folder in ``import_dirs``): the workers
build the run's model from the config, never from an object sent to them."""

from torch import nn

from splitfl.models.registry import build_model


def _with_dropout(name: str):
    """The registered model ``name`` with dropout at the end of the first block (a device
    part) and of the second to last (a server part, or the device's with a whole-model cut)."""

    def build(input_shape, num_classes):
        model = build_model(name, input_shape, num_classes)
        model.blocks[0].append(nn.Dropout(0.3))
        model.blocks[model.num_blocks - 2].append(nn.Dropout(0.3))
        return model

    return build


cnn_digits_dropout = _with_dropout("cnn_digits")
mlp_dropout = _with_dropout("mlp")  # RingSFL's ring-sized configs

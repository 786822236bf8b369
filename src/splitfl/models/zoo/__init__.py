"""Model zoo: importing this package registers every model."""

from splitfl.models.zoo import (  # noqa: F401
    alexnet,
    lenet,
    mergesfl_models,
    mobilenet,
    resnet,
    small,
    transformer,
    vgg,
)

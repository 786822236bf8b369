"""Dataset loaders: importing this package registers every loader."""

from splitfl.data.loaders import (  # noqa: F401
    cifar,
    digits,
    femnist,
    har,
    image100,
    mnist,
    qnli,
    speech,
    synthetic,
)

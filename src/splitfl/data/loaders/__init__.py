"""Dataset loaders: importing this package registers every loader."""

from splitfl.data.loaders import cifar, digits, femnist, mnist  # noqa: F401

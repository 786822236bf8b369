"""Dataset loaders: importing this package registers every loader."""

from splitfl.data.loaders import cifar, digits, femnist, har, mnist, qnli, speech  # noqa: F401

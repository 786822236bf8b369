"""Datasets (embedded digits and standard on-disk formats) and client partitioners."""

from splitfl.data.base import (
    DATASETS,
    ArrayDataset,
    DatasetBundle,
    DatasetError,
    DatasetFileError,
    DatasetNotFoundError,
    dataset_names,
    load_dataset,
)
from splitfl.data.partition import PARTITIONERS, partition_indices

__all__ = [
    "DATASETS",
    "PARTITIONERS",
    "ArrayDataset",
    "DatasetBundle",
    "DatasetError",
    "DatasetFileError",
    "DatasetNotFoundError",
    "dataset_names",
    "load_dataset",
    "partition_indices",
]

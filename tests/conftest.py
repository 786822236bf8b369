"""Shared test setup: single-threaded torch (fast and stable on a shared 2-core machine)."""

import pytest
import torch


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    torch.set_num_threads(1)
    yield


def tiny_config(**changes):
    """A small digits config (seconds per run) used across engine and CLI tests."""
    base = {
        "algorithm": "s2fl",
        "model": "cnn_digits",
        "rounds": 4,
        "seed": 3,
        "data": {
            "dataset": "digits",
            "partition": "dirichlet",
            "alpha": 0.5,
            "num_clients": 12,
            "min_samples": 8,
        },
        "train": {"clients_per_round": 6, "batch_size": 16, "lr": 0.05},
        "output": {"progress": False, "checkpoint_every": 2},
    }
    for key, value in changes.items():
        node = base
        *path, last = key.split(".")
        for k in path:
            node = node.setdefault(k, {})
        node[last] = value
    return base

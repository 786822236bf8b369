"""Shared test setup: single-threaded torch (fast and stable on a shared 2-core machine)."""

import pytest
import torch

from splitfl.testing import tiny_config  # noqa: F401  (tests import it from here)


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    torch.set_num_threads(1)
    yield


__all__ = ["tiny_config"]

"""Shared test setup: single-threaded torch (fast and stable on a shared 2-core machine)."""

import os

import pytest
import torch

from splitfl.testing import tiny_config  # noqa: F401  (tests import it from here)


@pytest.fixture(autouse=True, scope="session")
def _single_thread():
    torch.set_num_threads(1)
    yield


@pytest.fixture(autouse=True, scope="session")
def _own_profile_cache(tmp_path_factory):
    """Model profiles cached in a folder of this test session (and its subprocesses), never
    the user's ``~/.cache/splitfl``."""
    os.environ["SPLITFL_CACHE_DIR"] = str(tmp_path_factory.mktemp("splitfl-cache"))
    yield


__all__ = ["tiny_config"]

"""Ray, where splitfl uses it: importing it with a one-line hint, and joining a cluster.

Both Ray users go through here: sweeps (one Ray task per trial,
:mod:`splitfl.sweeps.backends`) and ``executor: parallel`` with ``parallel.backend: ray``
(one Ray actor per worker, :mod:`splitfl.executors.pools`). Ray is imported only when asked
for, so the rest of splitfl starts without it.
"""

from __future__ import annotations

import os
from typing import Any

from splitfl.config import ConfigError


def import_ray(field: str = "--backend", instead: str = "--backend local") -> Any:
    """``ray``, or a one-line ConfigError on ``field`` saying how to get it (or to use
    ``instead``)."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            field, f"ray is not installed: pip install 'splitfl[ray]', or use {instead}"
        ) from None
    return ray


def join_ray(ray: Any, address: str | None, runtime_env: dict | None = None) -> bool:
    """Use the Ray instance this process already has (a sweep's trial runs inside one), else
    connect to ``address`` (``auto``, ``ray://host:10001``) or start a local instance with
    this machine's CPUs, with the job's ``runtime_env`` (the user modules a sweep ships).
    True when this call started or joined one (the caller shuts it down with
    ``ray.shutdown()``)."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address:
        kwargs["address"] = address
    else:
        kwargs["num_cpus"] = os.cpu_count()
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    ray.init(**kwargs)
    return True

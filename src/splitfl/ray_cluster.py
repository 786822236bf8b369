"""Ray, where splitfl uses it: importing it with a one-line hint, and joining a cluster.

Both Ray users go through here: sweeps (one Ray task per trial,
:mod:`splitfl.sweeps.backends`) and ``executor: parallel`` with ``parallel.backend: ray``
(one Ray actor per worker, :mod:`splitfl.executors.pools`). Ray is imported only when asked
for, so the rest of splitfl starts without it.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from splitfl.config import ConfigError, check_ray_address
from splitfl.core.extras import install_extra


class RayJoinError(ConfigError):
    """Ray could not be joined at the address given (one line, on the address's field)."""


def import_ray(field: str = "--backend", instead: str = "--backend local") -> Any:
    """``ray``, or a one-line ConfigError on ``field`` saying how to get it (or to use
    ``instead``)."""
    try:
        import ray
    except ImportError:
        raise ConfigError(
            field, f"ray is not installed: {install_extra('ray', 'ray>=2.9')}, or use {instead}"
        ) from None
    return ray


def join_ray(
    ray: Any, address: str | None, runtime_env: dict | None = None, field: str = "parallel.address"
) -> bool:
    """Use the Ray instance this process already has (a sweep's trial runs inside one), else
    connect to ``address`` (``auto``, ``ray://host:10001``) or start a local instance with
    this machine's CPUs, with the job's ``runtime_env`` (the user modules a sweep ships).
    True when this call started or joined one (the caller shuts it down with
    ``ray.shutdown()``). A malformed address is a one-line ConfigError on ``field``, one
    where nothing answers or Ray finds no cluster a :class:`RayJoinError` (Ray itself would
    wait minutes for a host:port that does not answer)."""
    if ray.is_initialized():
        return False
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
    if address:
        kwargs["address"] = address
        reachable(address, field)
    else:
        kwargs["num_cpus"] = os.cpu_count()
    if runtime_env:
        kwargs["runtime_env"] = runtime_env
    try:
        init_ray(ray, **kwargs)
    except (ConnectionError, ValueError) as err:
        if not address:
            raise
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise RayJoinError(field, f"cannot join the Ray cluster at {address}: {first}") from None
    return True


#: Seconds a local Ray start waits for its GCS server to bind its port. Ray's default is
#: 30 s (120 s with the rocksdb backend; ``ray/_private/node.py``, overridable by
#: ``RAY_gcs_server_port_wait_time_s``); on a busy 2-core machine the GCS has taken longer
#: (splitfl's CI, 2026-12-02: ``Timed out waiting for file .../gcs_server_port_...``), so
#: splitfl waits 120 s unless the user set the variable.
GCS_PORT_WAIT_S = 120


def init_ray(ray: Any, **kwargs: Any) -> None:
    """``ray.init(**kwargs)``, giving a local GCS server :data:`GCS_PORT_WAIT_S` seconds to
    come up unless ``RAY_gcs_server_port_wait_time_s`` is already set."""
    os.environ.setdefault("RAY_gcs_server_port_wait_time_s", str(GCS_PORT_WAIT_S))
    ray.init(**kwargs)


def reachable(address: str, field: str, timeout_s: float = 5.0) -> None:
    """A one-line ConfigError on ``field`` unless ``address`` is well formed, and a
    :class:`RayJoinError` unless, where it names ``host:port``, something accepts a
    connection there within ``timeout_s``."""
    where = check_ray_address(address, field)
    if where is None:
        return
    try:
        socket.create_connection(where, timeout=timeout_s).close()
    except OSError as err:
        reason = err.strerror or str(err) or type(err).__name__
        raise RayJoinError(field, f"nothing answers at {address} ({reason})") from None

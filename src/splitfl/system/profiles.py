"""A device's capabilities (:class:`DeviceProfile`) and a run's devices (:class:`Population`);
the presets that draw them are :mod:`splitfl.system.devices` and :mod:`splitfl.system.jetson`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol


@dataclass(frozen=True)
class DeviceProfile:
    """Capabilities of one device (or of the server).

    Attributes:
        flops: Compute speed in FLOP/s (``Comp_c`` in S²FL Eq. 1).
        uplink: Upload rate in bytes/s (``R``).
        downlink: Download rate in bytes/s (S²FL uses one rate ``R`` for both directions).
        d2d: Device-to-device rate in bytes/s, or ``None`` where the preset has no D2D links.
        power: Power draw while computing, in watts (for energy accounting).
        kind: Human-readable label of the preset kind (e.g. ``"flops=High,rate=Low"``).
    """

    flops: float
    uplink: float
    downlink: float
    d2d: float | None = None
    power: float = 5.0
    kind: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


class DeviceSchedule(Protocol):
    """Time-varying devices: the profile of ``client`` in round ``round_idx`` (deterministic)."""

    def __call__(self, client: int, round_idx: int) -> DeviceProfile: ...


@dataclass(frozen=True)
class Population:
    """The devices of a run (one base profile per client), the server profile and, for
    time-varying presets, a schedule giving each client's profile in a given round.

    ``shared_server``: whether the preset defines the server's bandwidth, so that the
    participants' transfers share it (``devices.contention``); ``False`` where the server
    profile stands in for compute only.
    """

    devices: tuple[DeviceProfile, ...]
    server: DeviceProfile
    schedule: DeviceSchedule | None = None
    shared_server: bool = True

    def at(self, client: int, round_idx: int) -> DeviceProfile:
        """Profile of ``client`` in round ``round_idx`` (the base profile if static)."""
        if self.schedule is None:
            return self.devices[client]
        return self.schedule(client, round_idx)


#: S²FL Table 1: three FLOPS levels and three transfer-rate levels, drawn independently.

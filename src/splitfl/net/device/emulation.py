"""Emulated heterogeneity: devices on one machine behave like the config's device profiles.

With ``network.emulate: true`` the server sends each task its client's profile for the round
(FLOPS, upload and download rates; ``devices.preset``) and the per-sample FLOPs of its device
part (and of its auxiliary model, in an auxiliary plan), and

* the device stretches its compute to the profile: after a forward (1/3 of the part's
  per-sample forward+backward FLOPs, the usual estimate), a backward or auxiliary step (2/3),
  or a whole-model step or a batch kept on the device, ``aux_step`` (all of it), it sleeps
  until ``samples × FLOPs / Comp_c`` has passed (S²FL Eq. 1's ``F_c / Comp_c``); a device
  slower than its profile is not sped up;
* the device holds each received message for ``bytes / downlink`` before using it and each
  reply for ``bytes / uplink`` before sending it (Eq. 1's ``/ R`` terms, one transfer at a
  time per device), counted as communication, not compute;
* the server stretches a group's step to ``Σ samples × server FLOPs / Comp_s``.

Not emulated: the shared server link (``devices.contention``; run validation with it off),
latency and jitter beyond the machine's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from splitfl.system.cost import FORWARD_SHARE

__all__ = ["FORWARD_SHARE", "UNSHAPED", "Profile", "stretch", "transfer"]

#: The link rate sent when links are not emulated (``network.emulate_links: false``): a
#: transfer held for bytes / 1e18 s is no hold at all.
UNSHAPED = 1e18


@dataclass(frozen=True)
class Profile:
    """What a device emulates for one client's task."""

    flops: float
    uplink: float
    downlink: float
    flops_per_sample: float

    def to_fields(self) -> dict[str, float]:
        return {
            "flops": self.flops,
            "uplink": self.uplink,
            "downlink": self.downlink,
            "flops_per_sample": self.flops_per_sample,
        }

    @classmethod
    def from_fields(cls, fields) -> Profile | None:
        """The profile sent in ``begin`` (None where absent or malformed)."""
        try:
            values = [float(fields[k]) for k in ("flops", "uplink", "downlink", "flops_per_sample")]
        except (KeyError, TypeError, ValueError):
            return None
        if not all(v > 0 for v in values[:3]) or values[3] < 0:
            return None
        return cls(*values)


def stretch(started: float, samples: int, flops_per_sample: float, flops: float) -> None:
    """Sleep until ``samples × flops_per_sample / flops`` seconds have passed since
    ``started`` (``time.perf_counter``)."""
    left = started + samples * flops_per_sample / flops - time.perf_counter()
    if left > 0:
        time.sleep(left)


def transfer(nbytes: int, rate: float) -> None:
    """Hold a message for its emulated transfer time."""
    if rate > 0 and nbytes > 0:
        time.sleep(nbytes / rate)

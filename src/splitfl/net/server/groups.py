"""The networked server's door for a topology whose groups are not the split families'
(server copy + :class:`~splitfl.net.server.remote_fleet.RemoteFleet` + ``family.schedule``).

:data:`NETWORKED_GROUPS` maps a topology payload type to a *round runner*: called once per
round, before any group starts (in the executor's thread: what it measures with torch's
random state forked cannot disturb a group's), with the round's :class:`NetRound`; it
returns the function that trains one group (a :class:`~splitfl.roles.fleet.GroupRun`) and
returns ``(updates, server state or None)``, as the split families' path does. A family
registers its runner from its own ``net/server/<family>.py`` (``net/server/ushaped.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from splitfl.core.plan import RoundPlan

#: Topology payload type → round runner (module docstring).
NETWORKED_GROUPS: dict[type, Callable[[NetRound], Callable]] = {}


@dataclass
class NetRound:
    """What a round runner gets: the run context, the round's model (global weights
    loaded), plan and runtime, each client's :class:`~splitfl.net.server.remote_fleet.Meter`,
    ``fleet(cls=RemoteFleet, **extra)`` (a new fleet of the round for one group, ``cls`` a
    subclass taking ``extra``) and whether the run emulates device profiles."""

    ctx: Any
    model: Any
    plan: RoundPlan
    runtime: Any
    meters: dict
    fleet: Callable
    emulate: bool

"""The networked server's doors for a topology: how its round runs over device processes.

The networked executor (:mod:`splitfl.net.server.executor`) looks the plan's payload type up
once per round, here, and names no payload itself:

* :data:`NETWORKED_ROUNDS`: a payload whose round is not a set of groups run from the server
  (the ring: :mod:`splitfl.net.server.ring`, the members hand the activations on themselves)
  maps to a *whole-round runner*, ``runner(NetRound) -> WholeRound``;
* :data:`NETWORKED_GROUPS`: a payload whose groups are not (all) the split families' (server
  copy + :class:`~splitfl.net.server.remote_fleet.RemoteFleet` + ``family.schedule``) maps to
  a *group runner*: called once per round, before any group starts (in the executor's thread:
  what it measures with torch's random state forked cannot disturb a group's), it returns
  :class:`Groups`, the function that trains one group (a :class:`~splitfl.roles.fleet.GroupRun`)
  and returns ``(updates, server state or None)``. Hosted clusters
  (:mod:`splitfl.net.server.clusters`) and U-shaped split learning
  (:mod:`splitfl.net.server.ushaped`) register theirs from their own module;
* any other payload's groups run through :attr:`NetRound.split_group`, the split families'
  path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from splitfl.core.plan import ClientUpdate, RoundPlan

#: One group's training → ``(updates, the group's server state or None)``.
GroupRunner = Callable[[Any], tuple[list[ClientUpdate], Any]]


@dataclass
class NetRound:
    """What a runner gets: the run context, the round's model (global weights loaded), plan
    and runtime, each client's :class:`~splitfl.net.server.remote_fleet.Meter`, whether the
    run emulates device profiles and links, and the round's device-to-device view ``d2d``
    (:class:`~splitfl.net.server.clusters.D2DRound`: hub, tag, seed, lost clients).

    For group runners also: ``fleet(cls=RemoteFleet, **extra)`` (a new fleet of the round
    for one group, ``cls`` a subclass taking ``extra``), ``expect`` (what valid device replies
    look like, :class:`~splitfl.net.trust.expect.Expect`) and ``split_group`` (a group run
    the split families' way, on the server)."""

    ctx: Any
    model: Any
    plan: RoundPlan
    runtime: Any
    meters: dict
    emulate: bool
    links: bool
    d2d: Any
    fleet: Callable | None = None
    expect: Any = None
    split_group: GroupRunner | None = None


@dataclass(frozen=True)
class Groups:
    """A round's group runner: ``run(group)`` trains one group; ``relayed``: the clients a
    device contacts for the server (a hosted cluster's members), whom the server neither
    benches nor times for lateness itself."""

    run: GroupRunner
    relayed: frozenset[int] = frozenset()


@dataclass(frozen=True)
class WholeRound:
    """What a whole-round runner returns: the updates, the server states (group → state)
    and ``late`` = ``(clients, late ones with why)`` for the lateness record."""

    updates: list[ClientUpdate]
    server_states: dict
    late: tuple[list[int], dict[int, str]]


#: Topology payload type → group runner (module docstring).
NETWORKED_GROUPS: dict[type, Callable[[NetRound], Groups]] = {}
#: Topology payload type → whole-round runner (module docstring).
NETWORKED_ROUNDS: dict[type, Callable[[NetRound], WholeRound]] = {}

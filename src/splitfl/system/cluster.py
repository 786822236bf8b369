"""Time of clusters with a top worker (ParallelSFL §3.3, §4.3-4.4, Eq. 9 and 15).

One model, used both by ParallelSFL's planner (Eq. 15-17, with its estimates) and by the
simulated clock (with the true profiles), so that a planned τ_c is judged on the time the clock
then charges. A cluster is one top worker and N_c bottom workers; per iteration each bottom
worker ``i``

1. computes its bottom submodel (``μ_b,i``),
2. sends smashed data and labels to the top worker over its D2D link,
3. waits for the top worker to run the top submodel on its batch (``μ_p``): the top worker
   serves the batches one at a time in order of arrival (FIFO, ties by member order),
4. receives the gradients over the D2D link.

Member i's iteration time ``t_i`` is the end of step 4. Where batches arrive at least ``μ_p``
apart this is Eq. (9) exactly, ``t_i = μ_b,i + β_i,c + μ_p,c``; where they pile up (Eq. 10
violated) the top worker's load approaches ``N_c·μ_p``. Members synchronise every iteration
(Eq. 11: member i waits ``t_c,o − t_i``), so an iteration of the cluster lasts
``t_c,o = max_i t_i``.

**Top-worker links** (``contention``): the top worker's D2D radio (rate ``top_d2d``) is shared
by its members' concurrent transfers — each member's rate is
``min(pair rate, max-min fair share of top_d2d)`` (:func:`~splitfl.system.cost.max_min_share`),
the same in both directions (ingress for smashed data, egress for gradients). Without
contention every member gets the full pair rate (the slower radio of the two).

**Round** (Eq. 15, ``t_c = τ_c·t_c,o + β_c``): ``β_c`` is the cluster's model traffic: the top
worker downloads the full model from the PS, sends each member its bottom submodel (D2D, all at
once: done when the slowest arrives), collects them after τ_c iterations, and uploads the full
model. The PS transfers of the clusters' top workers overlap and share the server link like any
other clients' (:func:`~splitfl.system.cost.max_min_share`) where ``server`` is given.
A member's own time is ``τ_c·t_i + β_c``; the slowest member's is the cluster's ``t_c``.
Eq. (15) as printed names only the upload to the PS; :class:`ClusterTime` keeps the three parts
apart (``model_times``) so that a planner can use either, while the clock charges all three.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from splitfl.system.cost import max_min_share
from splitfl.system.devices import DeviceProfile


@dataclass(frozen=True)
class MemberLoad:
    """One bottom worker's work per iteration, in seconds and bytes."""

    compute: float  # μ_b,i: bottom forward+backward on its batch (s)
    top_compute: float  # μ_p: the top worker's forward+backward on that batch (s)
    link: float  # D2D rate of the (member, top) pair alone: the slower radio (B/s)
    up_bytes: float  # smashed data + labels per iteration (B)
    down_bytes: float  # activation gradients per iteration (B)
    model_bytes: float  # bottom submodel, sent to and collected from the member once a round (B)


@dataclass(frozen=True)
class ClusterLoad:
    """A cluster: its members' loads and its top worker's links."""

    members: tuple[MemberLoad, ...]
    top_d2d: float  # top worker's D2D radio, shared by its members (B/s)
    top_uplink: float  # top worker → PS (B/s)
    top_downlink: float  # PS → top worker (B/s)
    model_bytes: float  # full model, down from and up to the PS once a round (B)


@dataclass(frozen=True)
class ClusterTime:
    """A cluster's per-iteration times (Eq. 9) and model traffic time ``β_c`` (Eq. 15)."""

    member_iteration: tuple[float, ...]  # t_i per member
    d2d_rates: tuple[float, ...]  # each member's (shared) D2D rate
    ps_rates: tuple[float, float]  # top worker's (shared) rates to and from the PS
    #: seconds of the model traffic: (PS → top download, bottom parts out to the members and
    #: back over D2D, top → PS upload); all 0 for a cluster without members
    model_times: tuple[float, float, float]

    @property
    def beta_c(self) -> float:
        """``β_c`` as the clock charges it: all of the cluster's model traffic (module docs)."""
        return sum(self.model_times)

    @property
    def t_co(self) -> float:
        """``t_c,o = max_i t_i``; 0 for a cluster without members."""
        return max(self.member_iteration, default=0.0)

    def round_time(self, tau: int) -> float:
        """Eq. (15): ``t_c = τ_c·t_c,o + β_c`` (0 for a cluster without members)."""
        return tau * self.t_co + self.beta_c if self.member_iteration else 0.0


def member_iteration_times(members: Sequence[MemberLoad], rates: Sequence[float]) -> list[float]:
    """Eq. (9) generalised: each member's iteration time with a FIFO top worker."""
    arrivals = [m.compute + m.up_bytes / r for m, r in zip(members, rates, strict=True)]
    done, out = 0.0, [0.0] * len(members)
    for k in sorted(range(len(members)), key=arrivals.__getitem__):  # stable: ties by k
        arrival = arrivals[k]
        done = (done if done > arrival else arrival) + members[k].top_compute
        out[k] = done + members[k].down_bytes / rates[k]
    return out


def iteration_times(
    members: Sequence[MemberLoad], top_d2d: float | None
) -> tuple[list[float], list[float]]:
    """Each member's iteration time ``t_i`` (:func:`member_iteration_times`) and D2D rate: the
    max-min fair share of the top worker's radio ``top_d2d``, or, with ``top_d2d=None`` (no
    contention), each pair's own rate."""
    links = [m.link for m in members]
    rates = max_min_share(links, top_d2d) if top_d2d is not None and links else links
    return member_iteration_times(members, rates), rates


def _ps_rates(
    clusters: Sequence[ClusterLoad], server: DeviceProfile | None
) -> list[tuple[float, float]]:
    """Each active top worker's (up, down) PS rate, shared at the server where it is given."""
    active = [k for k, c in enumerate(clusters) if c.members]
    ups = [clusters[k].top_uplink for k in active]
    downs = [clusters[k].top_downlink for k in active]
    if server is not None and active:
        ups, downs = max_min_share(ups, server.downlink), max_min_share(downs, server.uplink)
    rates = [(c.top_uplink, c.top_downlink) for c in clusters]
    for k, up, down in zip(active, ups, downs, strict=True):
        rates[k] = (up, down)
    return rates


def cluster_times(
    clusters: Sequence[ClusterLoad], server: DeviceProfile | None, contention: bool = True
) -> list[ClusterTime]:
    """Per-iteration and model traffic times of every cluster of a round (see module docs).

    Args:
        clusters: The round's clusters (those without members train nothing and take 0 s).
        server: The PS profile whose link the top workers share (its ``downlink`` is the
            ingress, ``uplink`` the egress); ``None`` = no shared server link.
        contention: Whether members share their top worker's D2D radio and top workers the
            server link; ``False`` gives every transfer its own link's rate.
    """
    ps = _ps_rates(clusters, server if contention else None)
    out = []
    for cluster, (up, down) in zip(clusters, ps, strict=True):
        top_d2d = cluster.top_d2d if contention else None
        iteration, rates = iteration_times(cluster.members, top_d2d)
        model = (0.0, 0.0, 0.0)
        if cluster.members:
            spread = max(m.model_bytes / r for m, r in zip(cluster.members, rates, strict=True))
            model = (cluster.model_bytes / down, 2 * spread, cluster.model_bytes / up)
        out.append(ClusterTime(tuple(iteration), tuple(rates), (up, down), model))
    return out

"""A ParallelSFL cluster's deadline relative to the round's other clusters
(``network.cluster_deadline_factor``).

A hosted cluster (:mod:`splitfl.net.server.clusters`) used to wait for its top worker's report
for ``timeout_s`` × (steps + 3): a top worker that sleeps before reporting held the round that
long (issue 51: rounds of 20-50 s against 1-2 s honest, every round it was elected). The
clusters of a round run concurrently on the same local steps, and ParallelSFL's clustering
(Alg. 1) balances their times, so the others' reports say when this one is due: once half
(rounded up) of the round's other hosted clusters have reported, a top worker that has not
reported by ``factor`` × their median report time (at least ``min_s``,
``network.round_deadline_min_s``) + ``slack_s`` (``network.timeout_s``: an honest top worker
waits that long on a silent member before dropping it and going on — without it, a member
still busy from the round before got its honest top worker cut, in the benchmark) after the
round's start is given up on. Its cluster is
dropped for the round naming it (``top worker <k>: ...``: ParallelSFL then keeps it out of
the next elections, :func:`~splitfl.algorithms.parallelsfl.planner.failed_tops`), so such a
round lasts at most about ``factor`` × the honest clusters' time + ``timeout_s``. A round
with one hosted cluster has no others to compare with: its deadline is the same rule over the
accepted report times of this run's earlier rounds (``earlier``: every cluster's; their
median; checkpointed, so a resumed server keeps them: ``NetworkedExecutor.state_dict``);
before any was accepted it waits ``timeout_s`` × (steps + 3) as before. splitfl's
choice (the paper has no lateness).
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass, field

from splitfl.net.transport.hub import LOST, DeviceLink

#: How often a waiting cluster looks at the others' reports (seconds).
POLL_S = 0.1


@dataclass
class ClusterClock:
    """The round's hosted clusters (``hosted``: how many), ``factor`` (0: off), ``min_s`` and
    ``slack_s``; ``reports``: the accepted reports' times after ``began`` (``time.monotonic``);
    ``earlier``: the run's accepted report times so far (the executor's list, kept across
    rounds; each accepted report is appended to it too)."""

    hosted: int
    factor: float
    min_s: float
    slack_s: float = 0.0
    began: float = field(default_factory=time.monotonic)
    reports: list[float] = field(default_factory=list)
    earlier: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reported(self) -> None:
        """A cluster's report was accepted now."""
        with self.lock:
            self.reports.append(time.monotonic() - self.began)
            self.earlier.append(self.reports[-1])

    def cut_at(self) -> tuple[float, float, str] | None:
        """(when a cluster still waiting is given up on, the median report time it rests on,
        whose times those are), or None: off, fewer than half of the other clusters reported
        yet, or a lone cluster before any earlier report."""
        with self.lock:
            others = self.hosted - 1
            times = sorted(self.reports if others >= 1 else self.earlier)
        whose = "the other clusters'" if others >= 1 else "the earlier rounds' clusters'"
        need = math.ceil(others / 2) if others >= 1 else 1
        if not self.factor or len(times) < need:
            return None
        median = times[(len(times) - 1) // 2]
        return self.began + max(self.factor * median, self.min_s) + self.slack_s, median, whose


def await_top(clock: ClusterClock | None, link: DeviceLink, host: int, seq: int, until: float):
    """The top worker's reply to ``seq`` ((message, bytes, arrival)) or why there is none: by
    ``until`` (its ``timeout_s`` deadline), or by the deadline of the other clusters
    (``clock``, :meth:`ClusterClock.cut_at`)."""
    while True:
        cut = clock.cut_at() if clock is not None else None
        end = until if cut is None else min(until, cut[0])
        got = link.reply(host, seq, max(0.0, min(POLL_S, end - time.monotonic())))
        if got is LOST:
            return f"device {link.name} lost: {link.reason}"
        if got is not None:
            return got
        now = time.monotonic()
        if now >= until:
            return "no reply within the round's deadline"
        if cut is not None and now >= cut[0]:
            return (
                f"no report {now - clock.began:.3g} s into the round, {cut[2]} "
                f"median {cut[1]:.3g} s (network.cluster_deadline_factor {clock.factor:g} x it,"
                f" at least network.round_deadline_min_s {clock.min_s:g} s, + network.timeout_s"
                f" {clock.slack_s:g} s)"
            )

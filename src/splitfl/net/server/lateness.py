"""Clients that are late round after round are benched (``network.late_bench_rounds``).

A device answering each command just inside ``network.timeout_s`` is dropped at the round
deadline (:mod:`splitfl.net.server.executor`), but each round still waits for that deadline: up to
``round_deadline_factor`` × the honest round. :class:`LateClients` remembers who was dropped
for lateness and keeps them out of the next rounds — not contacted, dropped with the reason
``benched`` — for ``late_bench_rounds`` rounds, doubled at each further late round in a row,
so a drip costs one deadline per bench period instead of every round. A client that finishes
a round on time starts again from no streak. splitfl's choice: the papers model no lateness.
The record is checkpointed with the networked executor's state (``NetworkedExecutor.
state_dict``), so a server resumed with ``splitfl server --resume`` keeps it.
"""

from __future__ import annotations

from splitfl.core.benching import SitOut
from splitfl.net.server.remote_fleet import LATE

#: the drop reasons that count as late: the round deadline, or a command unanswered for
#: ``timeout_s`` (:meth:`~splitfl.net.server.remote_fleet.RemoteFleet._await`; a drip just past
#: the timeout looks like a silent link)
#: A RingSFL member slow to start the ring (:func:`~splitfl.net.server.ring.late_starts`).
LATE_START = "late to start"
LATE_REASONS = (LATE, "no reply within", LATE_START)
BENCHED = "benched"


class LateClients:
    """Who is benched for which rounds (round indices from 0, as the plan counts them; the
    reasons count from 1, as the metrics rows): :class:`~splitfl.core.benching.SitOut`, a late
    round a failure, a finished one forgiving the row."""

    def __init__(self, bench_rounds: int):
        self.bench_rounds = bench_rounds
        self.sit_out = SitOut(bench_rounds)

    @property
    def streak(self) -> dict[int, int]:
        """Client → late rounds in a row."""
        return self.sit_out.failures

    def benched(self, round_idx: int, clients: list[int]) -> dict[int, str]:
        """The clients of ``clients`` to leave out of round ``round_idx``, with the reason."""
        return {
            c: (
                f"{BENCHED}: late in {self.streak[c]} round(s) in a row, contacted again from "
                f"round {self.sit_out.last_out[c] + 2} (network.late_bench_rounds "
                f"{self.bench_rounds})"
            )
            for c in clients
            if self.sit_out.out(c, round_idx)
        }

    def record(self, round_idx: int, clients: list[int], dropped: dict[int, str]) -> None:
        """After round ``round_idx``: bench its late clients, forgive those that finished it
        (a benched client keeps its streak)."""
        for c in clients:
            why = dropped.get(c)
            if why is not None and why.startswith(LATE_REASONS):
                self.sit_out.fail(c, round_idx)
            elif why is None:
                self.sit_out.forgive(c)

"""Clients left out of the next rounds after they failed one, for doubling periods.

One rule for the places that bench a client: RingSFL's member that broke a networked ring
round (``options.ringsfl.exclude_rounds``, :mod:`splitfl.algorithms.ringsfl`), a client
dropped for lateness (``network.late_bench_rounds``, :mod:`splitfl.net.server.lateness`) and a
ParallelSFL top worker whose failure dropped its cluster (not elected,
:mod:`splitfl.algorithms.parallelsfl.algorithm`). After its
n-th failure in a row a client sits out ``rounds`` × 2^(n − 1) rounds (the exponent capped at
20); :meth:`SitOut.forgive` ends the row (a round finished on time). splitfl's choice: no
paper models clients that fail (RingSFL §3.1 assumes they all stay).
"""

from __future__ import annotations

#: The last round of a client benched for the rest of the run (:meth:`SitOut.for_good`): past
#: any run's rounds, and an int JSON and a checkpoint keep exactly.
FOR_GOOD = 2**31 - 1


class SitOut:
    """``failures``: client → failures in a row; ``last_out``: client → the last round (from 0)
    it sits out."""

    def __init__(self, rounds: int):
        self.rounds = rounds
        self.failures: dict[int, int] = {}
        self.last_out: dict[int, int] = {}

    def fail(self, client: int, round_idx: int) -> None:
        """``client`` failed round ``round_idx``: it sits out the rounds after it (none with
        ``rounds`` 0)."""
        if self.rounds <= 0:
            return
        n = self.failures[client] = self.failures.get(client, 0) + 1
        self.last_out[client] = round_idx + self.rounds * 2 ** min(n - 1, 20)

    def for_good(self, client: int) -> None:
        """``client`` sits out every later round (:data:`FOR_GOOD`), whatever ``rounds``."""
        self.failures[client] = self.failures.get(client, 0) + 1
        self.last_out[client] = FOR_GOOD

    def forgive(self, client: int) -> None:
        """``client`` finished a round: its next failure counts as the first."""
        self.failures.pop(client, None)

    def out(self, client: int, round_idx: int) -> bool:
        """Whether ``client`` sits out round ``round_idx``."""
        return round_idx <= self.last_out.get(client, -1)

    def state_dict(self) -> dict[str, dict[int, int]]:
        """``benched``: client → the last round it sits out; ``failures``: in a row."""
        return {"benched": dict(self.last_out), "failures": dict(self.failures)}

    def load_state_dict(self, state: dict) -> None:
        """What :meth:`state_dict` returned (keys may be strings, as JSON writes them)."""
        self.last_out = {int(c): int(r) for c, r in state.get("benched", {}).items()}
        self.failures = {int(c): int(n) for c, n in state.get("failures", {}).items()}

    def sitting_out(self, round_idx: int) -> frozenset[int]:
        """The clients that sit out round ``round_idx``."""
        return frozenset(c for c in self.last_out if self.out(c, round_idx))

"""When a RingSFL round really ends: a schedule of the ring's steps (``papers/ringsfl.md``
§3.2–3.3, Alg. 2), for the simulated clock.

RingSFL's time analysis (§3.3, Fig. 2–3) takes a mini-batch step to last as long as the most
loaded member's work, max_i p_i·M·N / C_i — the members' segments pipelined without a gap.
In a ring they are not: the segment of batch i on member j can start only when hop j−1's
activation has arrived, the loss needs the logits back at u_i, the gradient runs the whole ring
in reverse, and a member starts step t+1 only when every batch of step t has come back through
its segment (Alg. 2 updates after the step). Measured on emulated devices, rounds took
1.5–4× the pipelined prediction (``benchmarks/README.md``).

:func:`ring_makespan` is a discrete-event schedule of exactly that protocol (the one the
networked ring runs, :mod:`splitfl.net.device.ring`): every member is one worker serving its
jobs in a fixed order (``pipeline: schedule``, :func:`job_rank`) or in arrival order
(``pipeline: arrival``, as the networked member, :mod:`splitfl.net.device.ring`); a job is a
segment's forward (compute + sending the output to the
successor), the loss at the batch's own member (sending ∂loss/∂logits to the predecessor) or
a segment's backward (compute + sending the input gradient to the predecessor); at the start
of a step a member runs its own batch's first segment first; jobs of a later step wait for the
member's step to end. Job durations are the cost model's terms (``ring_client_cost``), so each
member's busy time is unchanged; only the waiting between jobs is added.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Mapping, Sequence

#: job kinds: a segment's forward, the loss at the batch's own member, a segment's backward
FORWARD, LOSS, BACKWARD = "forward", "loss", "backward"

JobTime = Callable[[str, int, int], float]


def ring_makespan(
    order: Sequence[int],
    steps: Mapping[int, int],
    job_time: JobTime,
    ready_at: Mapping[int, float],
    fixed_order: bool = True,
) -> dict[int, float]:
    """When each member finishes its last step.

    Args:
        order: The ring (member ids in ring order).
        steps: Local steps per member; member c's batch takes part in steps ``0..steps[c]-1``.
        job_time: ``(kind, start, hop) -> seconds`` on the member that runs hop ``hop`` of
            ``start``'s batch (:data:`FORWARD` hops 0..N−1, :data:`LOSS` hop N at ``start``,
            :data:`BACKWARD` hops N−1..0).
        ready_at: When each member can begin (e.g. after downloading the model).
        fixed_order: Each member runs a step's jobs in :func:`job_rank` order (monotone:
            no job getting shorter lengthens the round); ``False``: in arrival order, as the
            networked member serves them (``pipeline: arrival``), which is not monotone.
    """
    sim = _Ring(order, steps, job_time, fixed_order)
    for c in order:
        sim.begin_step(c, float(ready_at[c]))
    sim.run()
    return sim.finished


class _Ring:
    def __init__(
        self,
        order: Sequence[int],
        steps: Mapping[int, int],
        job_time: JobTime,
        fixed_order: bool = True,
    ):
        self.order, self.steps, self.job_time = list(order), dict(steps), job_time
        self.fixed_order = fixed_order
        self.n = len(self.order)
        self.pos = {c: i for i, c in enumerate(self.order)}
        self.total_steps = max(self.steps.values(), default=0)
        self.step = {c: 0 for c in self.order}
        self.remaining = {c: 0 for c in self.order}  # backward jobs left in its current step
        self.free = {c: 0.0 for c in self.order}
        self.deferred: dict[int, list[tuple]] = {c: [] for c in self.order}
        #: per member: the current step's jobs that arrived, by rank; the step's ranks in
        #: order and how many of them ran
        self.arrived: dict[int, dict[tuple, tuple]] = {c: {} for c in self.order}
        self.expected: dict[int, list[tuple]] = {c: [] for c in self.order}
        self.cursor = {c: 0 for c in self.order}
        self.finished: dict[int, float] = {}
        self.heap: list[tuple] = []
        self.tie = itertools.count()

    def owner(self, start: int, hop: int) -> int:
        return self.order[(self.pos[start] + hop) % self.n]

    def active(self, s: int) -> list[int]:
        return [c for c in self.order if s < self.steps[c]]

    def push(self, at: float, member: int, job: tuple) -> None:
        heapq.heappush(self.heap, (at, next(self.tie), member, job))

    def begin_step(self, c: int, at: float) -> None:
        """Member ``c`` starts its step ``self.step[c]`` at ``at``: its own batch first, then
        the jobs of this step that arrived early, in arrival order."""
        s = self.step[c]
        if s >= self.total_steps:
            self.finished[c] = at
            return
        active = self.active(s)
        self.remaining[c] = len(active)
        self.free[c] = max(self.free[c], at)
        self.expected[c] = self.step_ranks(c, s, active)
        self.cursor[c] = 0
        if s < self.steps[c]:
            self.push(at, c, (FORWARD, c, 0, s))
        early = [job for job in self.deferred[c] if job[3] == s]
        self.deferred[c] = [job for job in self.deferred[c] if job[3] != s]
        for job in early:
            self.push(at, c, job)

    def run(self) -> None:
        """Each member runs its step's jobs in the fixed order of :func:`job_rank` (a job that
        arrives before the member's next one in that order waits for its turn), or, without
        ``fixed_order``, in arrival order."""
        while self.heap:
            at, _, member, job = heapq.heappop(self.heap)
            kind, start, hop, s = job
            if s > self.step[member]:
                self.deferred[member].append(job)
                continue
            if not self.fixed_order:  # serve in arrival order
                begin = max(at, self.free[member])
                end = begin + self.job_time(kind, start, hop)
                self.free[member] = end
                self.after(member, job, end)
                continue
            self.arrived[member][job_rank(job)] = (at, job)
            self.serve(member)

    def step_ranks(self, c: int, s: int, active: list[int]) -> list[tuple]:
        """The ranks of member ``c``'s jobs in step ``s``, in the order it runs them."""
        ranks = []
        for start in active:
            hop = (self.pos[c] - self.pos[start]) % self.n
            ranks += [job_rank((FORWARD, start, hop, s)), job_rank((BACKWARD, start, hop, s))]
        if c in active:
            ranks.append(job_rank((LOSS, c, self.n, s)))
        return sorted(ranks)

    def serve(self, member: int) -> None:
        """Run ``member``'s next jobs in rank order while they have arrived."""
        queue = self.arrived[member]
        while self.cursor[member] < len(self.expected[member]):
            rank = self.expected[member][self.cursor[member]]
            if rank not in queue:
                return
            at, job = queue.pop(rank)
            self.cursor[member] += 1
            begin = max(at, self.free[member])
            end = begin + self.job_time(job[0], job[1], job[2])
            self.free[member] = end
            self.after(member, job, end)

    def after(self, member: int, job: tuple, end: float) -> None:
        kind, start, hop, s = job
        if kind == FORWARD:
            if hop + 1 < self.n:
                self.push(end, self.owner(start, hop + 1), (FORWARD, start, hop + 1, s))
            else:
                self.push(end, start, (LOSS, start, self.n, s))
        elif kind == LOSS:
            self.push(end, self.owner(start, self.n - 1), (BACKWARD, start, self.n - 1, s))
        else:
            if hop > 0:
                self.push(end, self.owner(start, hop - 1), (BACKWARD, start, hop - 1, s))
            self.remaining[member] -= 1
            if self.remaining[member] == 0:
                self.step[member] += 1
                self.begin_step(member, end)


def job_rank(job: tuple) -> tuple[int, int]:
    """A member's fixed order within a step: forwards by hop (its own batch first), its own
    batch's loss, backwards by descending hop. A fixed order keeps the makespan the longest
    path of one precedence graph, so it never grows when a job gets shorter (serving in
    arrival order did: a faster link reordered the jobs and lengthened the round, RingSFL
    ResNet-18 at 45 vs 42 Mb/s, issue 32 item 4)."""
    kind, _, hop, _ = job
    if kind == FORWARD:
        return (0, hop)
    if kind == LOSS:
        return (1, 0)
    return (2, -hop)

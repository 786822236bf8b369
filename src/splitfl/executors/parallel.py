"""``executor: parallel``: a round's independent units on persistent workers.

The units of a round are its groups (:meth:`~splitfl.core.plan.RoundPlan.groups`): a SplitFed V1
or FedAvg client, an S²FL group, a ParallelSFL cluster. Each trains from the global model with
its own server copy, its members' own mini-batch streams (``derive_seed(round_seed, client)``)
and its own torch stream (``derive_seed(round_seed, "unit", group)``,
:func:`~splitfl.executors.sequential.run_unit`), so what it computes does not depend on where
or after what it runs: the result equals :class:`~splitfl.executors.SequentialExecutor`'s bit
for bit. The driver (this process) draws what the round's torch stream draws (fresh aux heads,
in group order, as the sequential executor does), deals the units, and gathers the updates
and server states in group order for the algorithm to aggregate.

A round that is one coupled unit — a ring (RingSFL), one group (MergeSFL's merged batch,
SplitFed V2's and vanilla SL's server serving clients in turn, LocFedMix-SL) or mixup pairs
drawn from one stream across groups — runs in the driver, as the sequential executor runs it
(``splitfl list`` shows which algorithms do).

Dealing: units longest first (members × steps × batch) to whichever worker is free, each
preferring the first unit whose clients' data it already holds. Worker ``w`` is sent the
data of clients ``c ≡ w (mod N)`` when it starts, any other client's with the first unit that
needs it, and keeps what it was sent; the global model goes once per round to each worker
that trains a unit of it. :attr:`ParallelExecutor.stats` counts units, seconds and bytes.

A lost worker (killed, exited, closed its connection, or silent past ``timeout_s``) is
replaced by a fresh one, sent the run's config and every partition its predecessor held, and
its units are dealt again: units are deterministic, so the round's result is the one it would
have been. Each loss is an event (a ``warning:`` line, and the round's ``executor_events``);
a unit lost more than ``max_retries`` times, or a worker that fails to start that often, stops
the run with :class:`WorkersLostError`.
"""

from __future__ import annotations

import itertools
import sys
from collections import deque
from typing import Any

import torch

from splitfl.config import ParallelConfig
from splitfl.core.framing import Message
from splitfl.core.plan import ClientUpdate, RoundPlan, RoundResult
from splitfl.executors import channel
from splitfl.executors.pools import (
    LocalPool,
    RayPool,
    WorkerError,
    WorkerLost,
    WorkersLostError,
)
from splitfl.executors.sequential import SequentialExecutor
from splitfl.executors.workers import peak_rss
from splitfl.roles.common import NonFiniteLossError
from splitfl.roles.cut_record import tap_of
from splitfl.roles.fleet import GroupRun, State
from splitfl.topologies import family_of

#: A unit's answer: its members' updates and its server copy's state.
Trained = tuple[list[ClientUpdate], State | None]
#: Largest unit message queued behind a worker's running unit (below a socket's buffer).
PIPELINE_BYTES = 64 * 1024


def coupled(plan: RoundPlan) -> str:
    """Why ``plan``'s round is one coupled unit (it then runs in the driver), or "": its
    topology family says (:meth:`~splitfl.topologies.base.Family.dealable`)."""
    return family_of(plan).dealable(plan)


class ParallelExecutor:
    """Deals each round's units to ``parallel.workers`` workers; :meth:`open` starts them,
    :meth:`close` stops them."""

    def __init__(
        self,
        device: str = "cpu",
        precision: str = "fp32",
        channels_last: bool = False,
        parallel: ParallelConfig | None = None,
    ):
        self.config = parallel or ParallelConfig()
        self.device, self.precision, self.channels_last = device, precision, channels_last
        self.sequential = SequentialExecutor(device, precision, channels_last)
        self.pool: LocalPool | RayPool | None = None
        self.held: list[set[int]] = []
        self._rounds = itertools.count()
        self.stats: dict[str, Any] = new_stats()
        self.fresh: set[int] = set()  # workers started anew since they were last sent init
        self.events: list[str] = []  # lost workers since the last round's result
        self._tap = None  # the round's RoundTap (privacy.record), None: not recorded

    def open(self, ctx, run_dir=None) -> None:  # noqa: ANN001 - the experiment's RunContext
        """Start the workers; send each the run's config (it builds the model from it and
        checks it against ``ctx.model``) and the data of its home clients; wait until all
        have answered (a worker lost meanwhile is replaced, at most ``max_retries`` times)."""
        c = self.config
        if c.backend == "ray":
            self.pool = RayPool(c.workers, c.threads, c.gpus_per_worker, c.address, c.timeout_s)
        else:
            self.pool = LocalPool(c.workers, c.threads, c.timeout_s)
        self.held = [set(range(w, ctx.num_clients, c.workers)) for w in range(c.workers)]
        try:
            self._start(ctx)
        except BaseException:
            self.close()
            raise

    def _start(self, ctx) -> None:  # noqa: ANN001 - the RunContext
        """Send every worker its start (``init`` and its data) and wait for all answers; a
        worker lost meanwhile is replaced and sent its start again."""
        unsent, busy = list(range(self.config.workers)), {}
        losses = dict.fromkeys(unsent, 0)
        while unsent or busy:
            try:
                while unsent:
                    self._send(unsent[0], self._start_ops(ctx, unsent[0]), "data")
                    busy[unsent.pop(0)] = "starting"
                error = self._next(busy)[2]
            except WorkerLost as lost:
                for w, why in lost.reasons.items():
                    losses[w] += 1
                    self._replace(w, why, losses[w], "starting")
                    busy.pop(w, None)
                    unsent += [] if w in unsent else [w]
                continue
            if error is not None:
                raise error

    def _start_ops(self, ctx, w: int) -> list:  # noqa: ANN001 - the RunContext
        """What a new worker ``w`` needs first: ``init`` and the partitions it holds."""
        self.fresh.discard(w)
        init = channel.init_message(self._init(ctx, w))
        return [init, channel.data_message(partitions(ctx, self.held[w]))]

    def _replace(self, w: int, why: str, losses: int, what: str) -> None:
        """Worker ``w`` is lost (``why``) for the ``losses``-th time while ``what``: a fresh
        worker takes its place, or :class:`WorkersLostError` past ``max_retries``."""
        limit = self.config.max_retries
        if losses > limit:
            raise WorkersLostError(
                f"{why}; lost {losses} times while {what} (parallel.max_retries={limit})"
            )
        self.pool.respawn(w)
        self.fresh.add(w)
        self.stats["restarts"] += 1
        event = f"{why}; replaced by {self.pool.describe(w)} ({losses} of {limit} retries)"
        self.events.append(event)
        print(f"warning: {event}", file=sys.stderr, flush=True)

    def _init(self, ctx, w: int) -> channel.Init:  # noqa: ANN001 - the RunContext
        return channel.Init(
            config=ctx.config,
            input_shape=tuple(ctx.bundle.input_shape),
            num_classes=ctx.bundle.num_classes,
            dtype=next(ctx.model.parameters()).dtype,
            architecture=repr(ctx.model),
            device=self._worker_device(w),
            precision=self.precision,
            channels_last=self.channels_last,
            threads=self.config.threads,
            augment=ctx.augment,
        )

    def _worker_device(self, w: int) -> str:
        """Ray gives an actor the GPUs it asked for as ``cuda``; local workers share this
        machine's GPUs round-robin."""
        if not self.device.startswith("cuda"):
            return "cpu"
        if self.config.backend == "ray":
            return "cuda"
        return f"cuda:{w % torch.cuda.device_count()}"

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def run_round(
        self, ctx, global_state: dict[str, torch.Tensor], plan: RoundPlan, round_seed: int
    ) -> RoundResult:
        if coupled(plan):
            self.stats["coupled_rounds"] += 1
            result = self.sequential.run_round(ctx, global_state, plan, round_seed)
            result.events, self.events = self.events, []
            return result
        if self.pool is None:
            raise RuntimeError("ParallelExecutor.open() was not called")
        runs = family_of(plan).units(ctx.model, plan)  # the round's torch draws, in order
        setup = channel.setup_message(global_state, plan, round_seed)
        count = next(self._rounds)
        self._expect = (channel.specs_of(global_state), ctx.num_blocks, plan)
        self._tap = tap_of(ctx, plan)  # privacy.record: the workers send back what they receive
        answers = self._deal(ctx, runs, setup, count if plan.round_idx is None else plan.round_idx)
        updates: list[ClientUpdate] = []
        server_states: dict[int, dict[str, torch.Tensor]] = {}
        for run, (done, server_state) in zip(runs, answers, strict=True):
            updates += done
            if server_state is not None:
                server_states[run.group] = server_state
        self.stats["driver_peak_rss"] = peak_rss()
        events, self.events = self.events, []
        return RoundResult(updates=updates, server_states=server_states, events=events)

    def _deal(self, ctx, runs: list[GroupRun], setup, round_idx: int) -> list[Trained]:
        """Every unit to a worker (longest first, data already there preferred); the answers
        (updates, server state) in ``runs`` order, each checked against its unit. A unit's
        error is raised once the units before it (in ``runs`` order) have answered — the
        error the sequential executor raises. A lost worker's units are dealt again."""
        deal = Deal(runs, round_idx, self.config.workers)
        answers: dict[int, Trained] = {}
        errors: dict[int, BaseException] = {}
        while deal.queue or deal.busy():
            try:
                for depth in (0, 1):  # every idle worker first, then one queued behind the running
                    for w in [w for w, units in deal.inflight.items() if len(units) == depth]:
                        if deal.queue and (depth == 0 or len(deal.queue) > len(deal.inflight)):
                            self._hand(ctx, w, deal, setup, depth)
                w, answer, error = self._next(deal.busy())
            except WorkerLost as lost:
                self._redeal(lost, deal)
                continue
            i = deal.inflight[w].popleft()
            if error is None:
                error = self._trained(w, answer, runs[i], answers, i)
            if error is not None:
                errors[i] = error
                deal.queue[:] = [j for j in deal.queue if j < min(errors)]
        if errors:
            raise errors[min(errors)]
        return [answers[i] for i in range(len(runs))]

    def _redeal(self, lost: WorkerLost, deal: Deal) -> None:
        """Replace each lost worker; its units go back to the queue (the one it was training
        counts a loss: past ``max_retries`` the round stops)."""
        for w, why in lost.reasons.items():
            units, losses, what = list(deal.inflight[w]), 1, "idle"
            if units:
                deal.losses[units[0]] += 1
                losses, what = deal.losses[units[0]], deal.doing(w)
            self._replace(w, why, losses, what)
            deal.inflight[w].clear()
            deal.set_up.discard(w)
            deal.queue[:] = sorted([*deal.queue, *units], key=lambda i: -work(deal.runs[i]))

    def _hand(self, ctx, w: int, deal: Deal, setup, depth: int) -> None:  # noqa: ANN001
        """Send worker ``w`` the first unit of the queue whose clients' data it holds (else
        the first), with the round's setup and missing data where needed (and ``init`` first
        to a worker started anew). Behind a running unit (``depth`` 1) only a small message
        without setup or data is queued: the worker reads it only when it is free, and a
        large one would hold up the driver meanwhile."""
        queue, runs = deal.queue, deal.runs
        i = next((i for i in queue if clients(runs[i]) <= self.held[w]), queue[0])
        missing = clients(runs[i]) - self.held[w]
        tap = self._tap
        unit = channel.unit_message(runs[i], None if tap is None else (tap.batches, [*tap.tasks]))
        if depth and (missing or w not in deal.set_up or len(unit) > PIPELINE_BYTES):
            return
        ops = self._start_ops(ctx, w) if w in self.fresh else []
        if w not in deal.set_up:
            ops.append(setup)
        if missing:
            ops.append(channel.data_message(partitions(ctx, missing)))
            self.held[w] |= missing
        deal.set_up.add(w)
        queue.remove(i)
        deal.inflight[w].append(i)
        self._send(w, [*ops, unit], "units")

    def _send(self, w: int, ops: list, kind: str) -> None:
        self.stats["bytes_to_workers"][kind] += sum(len(b) for b in ops)
        self.pool.submit(w, ops)

    def _next(self, busy: dict[int, str]) -> tuple[int, Message | None, BaseException | None]:
        """The next answer of one of the ``busy`` workers (removed from it), and the error it
        reports (a NaN loss as :class:`NonFiniteLossError`, as the sequential executor; a
        malformed answer as :class:`WorkerError`)."""
        w, blob = self.pool.wait_any(busy)
        what = busy.pop(w)
        self.stats["bytes_from_workers"] += len(blob)
        try:
            answer = channel.read(blob, channel.ANSWERS)
            self.stats["worker_peak_rss"][w] = channel.peak_rss_of(answer)
            if answer.type != "error":
                return w, answer, None
            return w, answer, worker_error(self.pool.describe(w), what, channel.read_error(answer))
        except channel.ChannelError as err:
            return w, None, WorkerError(f"{self.pool.describe(w)} while {what}: {err}")

    def _trained(self, w: int, answer: Message, run: GroupRun, answers: dict, i: int):
        """Store a unit's answer (checked against ``run``); the error if it is malformed."""
        try:
            specs, n, plan = self._expect
            blocks = family_of(plan).server_blocks(run.tasks, plan, n)
            updates, server_state, seconds = channel.read_trained(answer, run, specs, blocks)
            recorded = channel.read_recorded(answer, run)
        except channel.ChannelError as err:
            return WorkerError(f"{self.pool.describe(w)} answered unit {run.group}: {err}")
        answers[i] = (updates, server_state)
        for kind, client, step, value in recorded:  # what the worker's loops received
            self._tap.put(kind, client, step, value)
        self.stats["unit_seconds"].append(seconds)
        return None


class Deal:
    """One round's dealing: the units waiting (longest first), those on each worker (the
    running one, then at most one queued behind it), the workers sent the round's setup, and
    how often each unit was lost with its worker."""

    def __init__(self, runs: list[GroupRun], round_idx: int, workers: int) -> None:
        self.runs, self.round_idx = runs, round_idx
        self.queue = sorted(range(len(runs)), key=lambda i: -work(runs[i]))
        self.inflight: dict[int, deque[int]] = {w: deque() for w in range(workers)}
        self.set_up: set[int] = set()
        self.losses = dict.fromkeys(range(len(runs)), 0)

    def doing(self, w: int) -> str:
        """What worker ``w`` is doing: training its running unit."""
        group = self.runs[self.inflight[w][0]].group
        return f"training group {group} of round {self.round_idx + 1}"

    def busy(self) -> dict[int, str]:
        """The workers with units, and what each is doing."""
        return {w: self.doing(w) for w, units in self.inflight.items() if units}


def new_stats() -> dict[str, Any]:
    """Counters of a parallel run: bytes each way (to the workers by kind: ``data`` and
    start-up, the rounds' ``units`` including the global model), each unit's training
    seconds on its worker, peak resident memory per worker and of the driver."""
    return {
        "bytes_to_workers": {"data": 0, "units": 0},
        "bytes_from_workers": 0,
        "unit_seconds": [],
        "worker_peak_rss": {},
        "driver_peak_rss": 0,
        "coupled_rounds": 0,
        "restarts": 0,
    }


def work(run: GroupRun) -> int:
    """A unit's size for dealing: samples its members process."""
    return sum(t.steps * t.batch_size for t in run.tasks)


def clients(run: GroupRun) -> set[int]:
    return {t.client for t in run.tasks}


def partitions(ctx, which: set[int]) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:  # noqa: ANN001
    """The samples ``(x, y)`` of the clients ``which``, for a worker to keep."""
    x, y = ctx.bundle.train.x, ctx.bundle.train.y
    out = {}
    for c in sorted(which):
        idx = torch.as_tensor(ctx.client_indices[c], dtype=torch.long)
        out[c] = (x[idx], y[idx])
    return out


def worker_error(who: str, what: str, error: tuple[str, str, str]) -> BaseException:
    """The exception a worker's error answer (type, message, traceback) stands for."""
    kind, message, trace = error
    if kind == NonFiniteLossError.__name__:
        return NonFiniteLossError(message)
    err = WorkerError(f"{who} failed while {what}: {kind}: {message}")
    err.add_note(trace)
    return err

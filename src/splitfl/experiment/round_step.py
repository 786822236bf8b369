"""One round of a run: select → plan → execute → cost → observe → aggregate → evaluate.

:func:`play_round` is the whole round step; :func:`measure` is the simulated clock's view of
the executed plan (shared cost model or the algorithm's topology, seeded jitter, waiting),
and :func:`round_row` the round's metrics row. Every random stream is derived from
``(seed, purpose, round)`` (:mod:`splitfl.core.seeding`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import torch

from splitfl.algorithms import Algorithm
from splitfl.config import ExperimentConfig
from splitfl.core.plan import RoundPlan, RoundReport, RoundResult
from splitfl.core.seeding import derive_seed, rng_for, seed_torch
from splitfl.executors import NonFiniteLossError, evaluate
from splitfl.experiment.client_eval import client_keys, evaluate_clients
from splitfl.experiment.context import RunContext
from splitfl.roles.dp_sgd import dp_active, dp_round, epsilon_fields
from splitfl.roles.parts import load_state
from splitfl.system import LINKS, ClientCost, SimClock, Traffic, jitter_factors
from splitfl.system.cost import server_bytes
from splitfl.topologies import family_of
from splitfl.training import row_key, server_step

if TYPE_CHECKING:
    from splitfl.experiment.context import Prepared


@dataclass
class LoopState:
    """What the round loop carries from round to round (a checkpoint stores it):
    ``server_opt`` is ``train.server_optimizer``'s state (m, v; ``{}`` before its first step
    and without one)."""

    global_state: dict[str, torch.Tensor]
    clock: SimClock
    cum: Traffic
    initial_loss: float | None
    server_opt: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    #: DP-SGD's steps per client (``train.defence.dp_noise``; rebuilt from the rows on resume)
    dp_history: dict[int, list[tuple[float, int]]] = field(default_factory=dict)
    #: the executor's run-spanning state after the last recorded round (its ``state_dict``:
    #: the networked server's deadlines and benched clients), None where it keeps none
    executor: dict | None = None


def measure(
    config: ExperimentConfig, algorithm: Algorithm, plan: RoundPlan, result: RoundResult, r: int
) -> tuple[RoundReport, dict[int, float]]:
    """The simulated clock's view of a round: each client's cost (the plan's topology family's
    price: the shared cost model with each task's charge, a ring's segments, a cluster's
    times), seeded jitter, round time and waiting times (of the participants).
    Non-participants' transfers (``RoundPlan.idle``, priced by the family) run
    in parallel with the round: they share the server link with the participants' and bound
    the round time. The executor's measured time and bytes, where it has them, are passed on
    to the report unchanged."""
    family, view = family_of(plan), algorithm.ctx
    samples = {u.client: u.samples for u in result.updates}
    train = family.price(view, plan, samples, r)
    idle = family.idle(view, plan, r)  # e.g. LocFedMix-SL's deferred uploads
    costs = family.share_links(view, {**train, **idle}, plan, r)
    losses = {u.client: u.loss_sum / max(u.loss_samples, 1) for u in result.updates}
    sigma = config.devices.jitter  # no draw (and no generator to build) without jitter
    rng = rng_for(config.seed, "jitter", r) if sigma > 0 else None
    jitter = jitter_factors(sorted(train), sigma, rng)
    if idle:
        rng = rng_for(config.seed, "jitter-idle", r) if sigma > 0 else None
        jitter.update(jitter_factors(sorted(idle), sigma, rng))
    times = {c: cost.time * jitter[c] for c, cost in costs.items()}
    if config.clock == "measured" and result.measured is not None:
        costs, times, jitter = measured_view(costs, result.measured)
        round_time = result.measured_round_time or 0.0
        waits = {c: max(round_time - times[c], 0.0) for c in train}
    else:
        round_time, all_waits = family.round_time(view, plan, r, train, samples, times)
        waits = {c: all_waits[c] for c in train}
    report = RoundReport(times, costs, jitter, samples, losses, round_time)
    report.measured_time, report.measured_bytes = result.measured_time, result.measured_bytes
    return report, waits


def measured_view(costs: dict[int, ClientCost], measured: dict[int, dict[str, float]]):
    """``clock: measured``: (costs, times, jitter) with each measured client's times from its
    device (:func:`measured_cost`), no jitter. A client without a meter — a non-participant's
    transfer such as LocFedMix-SL's deferred upload, which a networked device makes when its
    client trains, not in a later round — keeps the cost model's cost: its traffic is charged,
    and its time is not part of the measured round."""
    costs = {
        c: measured_cost(cost, measured[c]) if c in measured else cost for c, cost in costs.items()
    }
    return costs, {c: cost.time for c, cost in costs.items()}, {c: 1.0 for c in costs}


def measured_cost(cost: ClientCost, measured: dict[str, float]) -> ClientCost:
    """``clock: measured``: the cost model's traffic with the times measured on the devices
    (compute → ``device_time``, upload + download → ``comm_time``, server compute →
    ``server_time``), so the algorithms' state estimates see the real devices; the rate at
    which the server received the client's bytes is measured too (``server_in_rate`` =
    ingress bytes / upload time, as the clock's shared-link rate; MergeSFL's B^h uses it)."""
    extra = dict(cost.extra)
    ingress = server_bytes(cost.traffic)[0]
    if ingress > 0 and measured["upload_s"] > 0:
        extra["server_in_rate"] = ingress / measured["upload_s"]
    return replace(
        cost,
        comm_time=measured["upload_s"] + measured["download_s"],
        device_time=measured["compute_s"],
        server_time=measured["server_s"],
        extra=extra,
    )


def measured_row(plan: RoundPlan, result: RoundResult) -> dict[str, Any]:
    """The executor's measurements as metrics (lists aligned with ``clients``; None for a
    client lost before it was measured)."""
    row: dict[str, Any] = {
        "dropped_clients": sorted(result.dropped),
        "dropped_reasons": {str(c): why for c, why in result.dropped.items()},
        "executor_events": list(result.events),
    }
    if result.measured is None:
        return row
    m = result.measured
    for key in ("busy_s", "compute_s", "upload_s", "download_s", "server_s", "wait_s"):
        row[f"measured_{key}"] = [m.get(t.client, {}).get(key) for t in plan.tasks]
    row["measured_round_time"] = result.measured_round_time
    if result.devices is not None:  # who trained which client (a takeover shows here)
        row["measured_device"] = [result.devices.get(t.client) for t in plan.tasks]
    row["wire_bytes_up"] = sum(v.get("wire_up", 0) for v in m.values())
    row["wire_bytes_down"] = sum(v.get("wire_down", 0) for v in m.values())
    for link in LINKS:
        row[f"payload_{link}"] = sum(v.get(f"payload_{link}", 0) for v in m.values())
    return row


def lower_median(values: list[float]) -> float | None:
    """The lower median (the ⌈n/2⌉-th smallest; None for none): with two values the smaller,
    so no single client's report raises it."""
    if not values:
        return None
    return sorted(values)[(len(values) - 1) // 2]


def loss_fields(config, result: RoundResult, losses: dict[int, float]) -> dict[str, Any]:
    """A round's training-loss fields: ``train_loss`` (null when no client completed the
    round: nothing was trained), ``train_loss_median``, the lower median of the clients' mean
    losses (what the explosion check reads: one device's reports cannot move it;
    ``guards.check_explosion``). Networked with ``network.trust: untrusted`` every reported
    figure is a device's word: ``train_loss`` is that lower median too, the weighted mean is
    ``train_loss_mean``, and ``train_loss_outliers`` lists the clients whose mean loss is above
    ``network.bounds.peer_loss_factor`` × the lower median (issue 51: one device reporting
    maximal losses read 1282 in every round's mean, honest ≈ 0.2)."""
    median = lower_median(list(losses.values()))
    mean = result.train_loss if result.updates else None
    if config.executor != "networked" or config.network.trust == "trusted":
        return {"train_loss": mean, "train_loss_median": median}
    top = None if median is None else config.network.bounds.peer_loss_factor * median
    outliers = sorted(c for c, v in losses.items() if top is not None and v > top)
    return {
        "train_loss": median if result.updates else None,
        "train_loss_median": median,
        "train_loss_mean": mean,
        "train_loss_outliers": outliers,
    }


def round_row(ctx, plan, result, report: RoundReport, waits, traffic: Traffic, r: int) -> dict:
    """Per-round metrics (test accuracy is filled in by the caller when evaluated). Energy:
    busy device compute time × power per client (jitter applied), plus helpers' compute
    energy (``ClientCost.helper_energy``: a ParallelSFL top worker serving the client)."""
    energy = {
        k: c.device_time * report.jitter[k] * ctx.population.at(k, r).power
        for k, c in report.costs.items()
    }
    helpers = sum(c.helper_energy for c in report.costs.values())
    return {
        "round_time": report.round_time,
        **loss_fields(ctx.config, result, report.losses),
        "test_acc": None,
        "test_loss": None,
        "avg_waiting": sum(waits.values()) / len(waits) if waits else 0.0,
        # device compute of the participants plus that of helpers (ParallelSFL's top workers)
        "energy_j": sum(energy.values()) + helpers,
        # per participant, aligned with "clients" (RingSFL Fig. 14); idle transfers use none
        "energy_j_by_client": [energy.get(t.client, 0.0) for t in plan.tasks],
        "energy_j_helpers": helpers,
        **{f"bytes_{link}": getattr(traffic, link) for link in LINKS},
        "traffic_total": traffic.total,
        # training samples processed this round (each sample once per local pass, every
        # client that trained): the work the round bought, for equal-work comparisons
        "samples": sum(u.samples for u in result.updates),
        "clients": [t.client for t in plan.tasks],
        "cuts": [t.cut for t in plan.tasks],
        "groups": [t.group for t in plan.tasks],
        "client_times": [report.times.get(t.client) for t in plan.tasks],
        **measured_row(plan, result),
    }


def play_round(prep: Prepared, executor, st: LoopState, r: int, eval_model, t0: float) -> dict:
    """One round: select → plan → execute → cost → observe → aggregate → evaluate; returns
    its metrics row (``st`` holds the new model, clock and traffic)."""
    config, ctx, algorithm = prep.config, prep.ctx, prep.algorithm
    seed_torch(derive_seed(config.seed, "torch", r))
    clients = algorithm.select_clients(r, rng_for(config.seed, "select", r))
    plan = algorithm.plan_round(r, clients, rng_for(config.seed, "plan", r))
    plan.round_idx = r
    round_seed = derive_seed(config.seed, "b", r)
    if ctx.cut_record is not None:  # privacy.record: the round's tap, for the executors
        ctx.cut_record.open_round(plan, st.global_state, round_seed)
    result = executor.run_round(ctx, st.global_state, plan, round_seed)
    if ctx.cut_record is not None:
        ctx.cut_record.close_round()
    # the algorithm hears of the clients that completed only (a networked device may be lost)
    done = plan
    if result.dropped:
        done = replace(plan, tasks=[t for t in plan.tasks if t.client not in result.dropped])
    report, waits = measure(config, algorithm, done, result, r)
    algorithm.lost(r, plan, result.dropped)
    if result.updates:
        algorithm.observe(r, done, report)
        algorithm.server_move = result.server_move  # fltrust's g_0 (Algorithm.aggregation)
        aggregated = algorithm.aggregate(st.global_state, done, result)
        before = st.global_state
        st.global_state, st.server_opt = server_step(
            config.train.server_optimizer, st.global_state, aggregated, st.server_opt
        )
        check_finite_state(st.global_state, before)
    st.clock.advance(report.round_time)
    traffic = Traffic()
    for cost in report.costs.values():
        traffic.add(cost.traffic)
    st.cum.add(traffic)
    row: dict[str, Any] = {
        "round": r + 1,
        "sim_time": st.clock.now,
        "wall_time": time.perf_counter() - t0,
        **round_row(ctx, plan, result, report, waits, traffic, r),
        "traffic_total_cum": st.cum.total,
        **{f"plan_{k}": v for k, v in plan.info.items()},
    }
    defence = config.train.defence
    if dp_active(defence) and trains(executor):  # DP-SGD's accountant (roles/dp_sgd.py)
        row.update(dp_round(st.dp_history, plan, result, [len(i) for i in ctx.client_indices]))
        row.update(epsilon_fields(defence, st.dp_history, row["clients"]))
    if config.eval.on != "server":
        row.update(dict.fromkeys(client_keys(config.eval.metrics)))
    if not trains(executor):  # executor: timing — nothing trained, nothing to evaluate
        row["train_loss"] = row["train_loss_median"] = None
    elif (r + 1) % config.eval.every == 0 or r + 1 == config.rounds:
        row.update(evaluation_row(ctx, eval_model, st.global_state))
    return row


def evaluation_row(ctx: RunContext, eval_model, state: dict[str, torch.Tensor]) -> dict:
    """An evaluated round's metrics (``eval.on``): the server's test set (``test_*``), the
    clients' held-out splits (``clients_*``, :mod:`splitfl.experiment.client_eval`) or both."""
    row: dict[str, Any] = {}
    if ctx.config.eval.on in ("server", "both"):
        values = evaluate_state(ctx, eval_model, state)
        row.update({row_key(name): value for name, value in values.items()})
    if ctx.config.eval.on in ("clients", "both"):
        row.update(evaluate_clients(ctx, eval_model, state))
    return row


def check_finite_state(
    state: dict[str, torch.Tensor], before: dict[str, torch.Tensor] | None = None
) -> None:
    """A NaN in the aggregated model ends the run as diverged (exit code 3) instead of being
    trained, evaluated and saved as ``ok``. An infinity alone (a BatchNorm variance that
    overflowed while the losses stay finite) is left to the explosion check
    (``train.explode_*``), which judges the losses. A tensor that is ``before``'s own (the
    round left it unchanged: a LoRA model's frozen base) was checked when it became global."""
    before = before or {}
    for name, t in state.items():
        if before.get(name) is t:
            continue
        if t.is_floating_point() and bool(torch.isnan(t).any()):
            raise NonFiniteLossError(f"NaN in the aggregated model ({name})")


def trains(executor) -> bool:
    """Whether ``executor`` trains (every executor but ``executor: timing``)."""
    return getattr(executor, "trains", True)


def evaluate_state(ctx: RunContext, eval_model, state: dict[str, torch.Tensor]) -> dict:
    """Mean test loss (``loss``) and ``eval.metrics`` of ``state`` on the test split."""
    load_state(eval_model, state)
    test, config = ctx.bundle.test, ctx.config
    return evaluate(
        eval_model,
        test.x,
        test.y,
        config.eval.batch_size,
        config.train.loss,
        config.eval.metrics,
    )

"""RingSFL on the simulated clock: each member's cost over the round's segments
(:func:`ring_client_cost`) and the round time — ``pipeline: ideal``, the
§3.3 analysis (the most loaded member's busy time), or the ring's makespan
(:func:`~splitfl.topologies.ring.schedule.ring_makespan`) with each member's job times scaled by
its jitter (``schedule``: jobs in a fixed order; ``arrival``: as they arrive)."""

from __future__ import annotations

from splitfl.core.plan import ClientTask, RoundPlan
from splitfl.models.profile import ModelProfile
from splitfl.system.cost import FORWARD_SHARE, ClientCost, Traffic, d2d_rate, round_times
from splitfl.system.devices import DeviceProfile
from splitfl.topologies.ring.schedule import FORWARD, LOSS, ring_makespan


def member_costs(view, plan: RoundPlan, r: int) -> dict[int, ClientCost]:
    """Every member's segments over the round (samples of every start that passes it)."""
    ring = plan.topology.spec
    done = {t.client: view.round_samples(t.client, t.batch_size, t.steps) for t in plan.tasks}
    steps = {t.client: t.steps for t in plan.tasks}
    latency = view.config.devices.exchange_latency_s
    out = {}
    for task in plan.tasks:
        work, messages = [], 0
        for start in ring.order:
            for client, lo, hi in ring.segments(start):
                if client == task.client:
                    work.append((lo, hi, done[start], start == client))
                    # per step: the output forward, the input gradient back, own: logits grad
                    messages += steps[start] * (1 + (lo > 0) + (start == client))
        device, nxt, prv = neighbours(view, task.client, plan, r)
        out[task.client] = ring_client_cost(
            view.profile, work, device, nxt, prv, messages=messages, exchange_latency=latency
        )
    return out


def neighbours(view, client: int, plan: RoundPlan, r: int):
    """Profiles of ``client``, its successor and its predecessor in the round's ring."""
    order, pop = plan.topology.spec.order, view.population
    pos = order.index(client)
    return (
        pop.at(client, r),
        pop.at(order[(pos + 1) % len(order)], r),
        pop.at(order[pos - 1], r),
    )


def ring_round_time(view, plan: RoundPlan, r: int, times: dict[int, float]):
    """Round time and waiting (module docstring); waiting = round − own busy time. A ring that
    did not complete has no schedule: the slowest member's time."""
    ring, pipeline = plan.topology.spec, plan.topology.pipeline
    if pipeline == "ideal" or not times or set(times) != set(ring.order):
        return round_times(times)
    tasks: dict[int, ClientTask] = {t.client: t for t in plan.tasks}
    busy = {c: cost.time for c, cost in member_costs(view, plan, r).items() if c in times}
    scale = {c: times[c] / busy[c] if busy[c] > 0 else 1.0 for c in times}
    job_time, model_in, model_out = ring_jobs(view, plan, r)
    finish = ring_makespan(
        ring.order,
        {c: t.steps for c, t in tasks.items()},
        lambda kind, start, hop: job_time(kind, start, hop) * scale[ring.member(start, hop)],
        {c: model_in[c] * scale[c] for c in times},
        fixed_order=pipeline == "schedule",
    )
    end = {c: finish[c] + model_out[c] * scale[c] for c in times}
    total = max(end.values())
    return total, {c: max(total - t, 0.0) for c, t in times.items()}


def ring_jobs(view, plan: RoundPlan, r: int):
    """(job time function, model download time, model upload time) on the round's
    profiles, with ``ring_client_cost``'s terms: segment compute (forward 1/3 of its
    FLOPs, backward 2/3) plus the message it sends, per mini-batch of the batch's owner."""
    prof, ring = view.profile, plan.topology.spec
    per = {
        t.client: view.round_samples(t.client, t.batch_size, t.steps) / max(t.steps, 1)
        for t in plan.tasks
    }
    peers = {c: neighbours(view, c, plan, r) for c in ring.order}
    n = prof.num_blocks
    latency = view.config.devices.exchange_latency_s  # per message sent

    def job_time(kind: str, start: int, hop: int) -> float:
        if kind == LOSS:
            device, _, prv = peers[start]
            return per[start] * prof.blocks[n - 1].out_bytes / d2d_rate(device, prv) + latency
        member, lo, hi = ring.segments(start)[hop]
        device, nxt, prv = peers[member]
        flops = per[start] * prof.part_flops(lo, hi) / device.flops
        if kind == FORWARD:
            send = per[start] * prof.blocks[hi - 1].out_bytes / d2d_rate(device, nxt)
            return FORWARD_SHARE * flops + send + latency
        if not lo:
            return (1 - FORWARD_SHARE) * flops
        send = per[start] * prof.blocks[lo - 1].out_bytes / d2d_rate(device, prv)
        return (1 - FORWARD_SHARE) * flops + send + latency

    model = prof.total_bytes
    down = {c: model / peers[c][0].downlink + latency for c in ring.order}
    up = {c: model / peers[c][0].uplink + latency for c in ring.order}
    return job_time, down, up


def ring_client_cost(
    profile: ModelProfile,
    work: list[tuple[int, int, int, bool]],
    device: DeviceProfile,
    next_device: DeviceProfile,
    prev_device: DeviceProfile,
    messages: int = 0,
    exchange_latency: float = 0.0,
) -> ClientCost:
    """Cost of one RingSFL client in a round (``papers/ringsfl.md`` §3.3, Alg. 2).

    ``work`` lists the client's segments over the round as (first block, stop block, samples,
    own batch): it computes forward+backward of blocks [first, stop) for ``samples`` samples
    (p_i·M·N/C_i per mini-batch step in the paper's notation), sends the segment's output
    forward to the next client, sends the gradient of the segment's input back to the previous
    client (unless first == 0), and — for its own batches — sends the gradient of the logits
    back to the client that computed them. The full model is downloaded from and uploaded to
    the server once per round. The ring hops use the device-to-device rate of the link.
    With ``exchange_latency`` (``devices.exchange_latency_s``, default 0) each of the
    ``messages`` the client sends on the ring and each of its two model transfers costs that
    much more (as :func:`~splitfl.system.cost.split_client_cost`'s per-exchange term).
    """
    n = profile.num_blocks
    flops = sum(samples * profile.part_flops(lo, hi) for lo, hi, samples, _ in work)
    forward = sum(samples * profile.blocks[hi - 1].out_bytes for lo, hi, samples, _ in work)
    backward = sum(samples * profile.blocks[lo - 1].grad_bytes for lo, hi, samples, _ in work if lo)
    backward += sum(
        samples * profile.blocks[n - 1].grad_bytes for _, _, samples, own in work if own
    )
    model = profile.total_bytes
    traffic = Traffic(
        model_down=model, model_up=model, d2d_activations=forward, d2d_gradients=backward
    )
    comm = model / device.downlink + model / device.uplink
    comm += forward / d2d_rate(device, next_device) + backward / d2d_rate(device, prev_device)
    comm += (messages + 2) * exchange_latency
    return ClientCost(
        traffic=traffic,
        device_flops=flops,
        server_flops=0.0,
        comm_time=comm,
        device_time=flops / device.flops,
        server_time=0.0,
        server_link=(device.uplink, device.downlink),
    )

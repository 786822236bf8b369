"""The server's side of a networked RingSFL round (see :mod:`splitfl.net.d2d` for the rules and
:mod:`splitfl.net.ring_device` for the members' side)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from splitfl.models import BlockModel
from splitfl.net.auth import new_token, token_hash
from splitfl.net.d2d import D2DRound, send_command
from splitfl.net.fleet import Meter
from splitfl.net.hub import LOST, DeviceLink
from splitfl.net.trust import MAX_BYTES, bounded, check_state, loss_problem, state_specs
from splitfl.net.wire import Message, payload_bytes, state_from, state_tensors
from splitfl.plan import ClientUpdate, RoundPlan


@dataclass(frozen=True)
class RingEmulation:
    """Emulated profiles of the ring: each member's ``emulate`` fields (FLOPS, server link
    rates, D2D rates to its successor ``d2d_next`` and predecessor ``d2d_prev``) and every
    block's per-sample forward+backward FLOPs."""

    members: dict[int, dict[str, float]]
    block_flops: list[float]


def run_ring(
    rnd: D2DRound, plan: RoundPlan, model: BlockModel, emulation: RingEmulation | None
) -> list[ClientUpdate]:
    """One ring round: every member's blended model, or none (round abandoned)."""
    ring, order = plan.ring, plan.ring.order
    links = {c: rnd.hub.link_of(c) for c in order}
    missing = [c for c in order if links[c] is None or not links[c].peer_address]
    if missing:
        _abandon(rnd, order, f"client {missing[0]} not connected (or not listening for peers)")
        return []
    for c in order:
        rnd.meters[c].device = links[c].name
    tokens = {c: new_token() for c in order}  # the token of the edge *into* c
    names = {c: f"{rnd.tag}-ring-into-{c}" for c in order}
    global_state = state_tensors("model", model.state_dict())
    tasks = {t.client: t for t in plan.tasks}
    sent = {}
    for pos, c in enumerate(order):
        succ = order[(pos + 1) % len(order)]
        fields = {
            "order": order,
            "starts": [t.client for t in plan.tasks],  # the reference's order of batches
            "lengths": {str(k): v for k, v in ring.lengths.items()},
            "weights": {str(k): v for k, v in ring.weights.items()},
            "dynamic_lr": ring.dynamic_lr,
            "steps": {str(k): t.steps for k, t in tasks.items()},
            "batch_size": tasks[c].batch_size,
            "lr": tasks[c].lr,
            "round_seed": rnd.round_seed,
            "timeout_s": rnd.timeout_s,
            "expect": {"name": names[c], "token_hash": token_hash(tokens[c])},
            "next": {
                "address": links[succ].peer_address,
                "cert": links[succ].peer_cert,
                "name": names[succ],
                "token": tokens[succ],
            },
        }
        if emulation is not None:
            fields["emulate"] = emulation.members[c]
            fields["block_flops"] = emulation.block_flops
        msg = Message("ring", fields, dict(global_state))
        sent[c] = (*send_command(links[c], c, msg), payload_bytes(msg))
    replies, failure = _collect(rnd, links, sent, max(t.steps for t in plan.tasks))
    if failure is None:
        failure = _check(replies, model, tasks, rnd.bounds, {c: v[2] for c, v in sent.items()})
    if failure is not None:
        _abandon(rnd, order, failure)
        return []
    updates = []
    for group, c in enumerate(order):
        reply, up, arrived = replies[c]
        _, down, sent_at, down_payload = sent[c]
        _meter(rnd.meters[c], reply, arrived - sent_at, up, down, down_payload)
        f = reply.fields
        state = state_from("model", reply.tensors)
        updates.append(
            ClientUpdate(
                c,
                model.num_blocks,
                group,
                f["samples"],
                tasks[c].steps,
                state,
                float(f["loss_sum"]),
            )
        )
    return updates


def _collect(rnd: D2DRound, links: dict[int, DeviceLink], sent: dict, steps: int):
    """Every member's reply; on the first failure the others are told to abort. Returns
    (replies, the failure's root cause or None): the members next to a failure report a lost
    link or the abort, so a reason that is neither is preferred."""
    deadline = time.monotonic() + rnd.timeout_s * (steps + 3)
    replies, failures = {}, []
    pending = dict(sent)
    while pending:
        for c in list(pending):
            seq = pending[c][0]
            got = links[c].reply(c, seq, 0.05)
            if got is None and time.monotonic() < deadline:
                continue  # still running
            if got is None:
                got = "no reply within the round's deadline"
            elif got is LOST:
                got = f"device {links[c].name} lost: {links[c].reason}"
            del pending[c]
            if isinstance(got, str) or got[0].type != "ring_done":
                why = got if isinstance(got, str) else got[0].fields.get("reason", got[0].type)
                failures.append(f"client {c}: {why}" if isinstance(got, str) else str(why))
                if len(failures) == 1:
                    for other, (other_seq, *_rest) in pending.items():
                        links[other].send(Message("abort", {"session": other_seq}))
                continue
            replies[c] = got
    if not failures:
        return replies, None
    causes = [f for f in failures if " lost (" not in f and "aborted" not in f]
    return replies, (causes or failures)[0]


def _check(replies, model: BlockModel, tasks, bounds, sent_at: dict[int, float]) -> str | None:
    """What is wrong with a member's report, or None: its loss, times (at most its round
    trip), byte counts and blended model (against the global model, :mod:`splitfl.net.trust`)."""
    state = model.state_dict()
    specs, steps = state_specs(state), sum(t.steps for t in tasks.values()) * len(tasks)
    for c, (reply, _, arrived) in replies.items():
        f, t = reply.fields, tasks[c]
        most = t.steps * t.batch_size
        problem = loss_problem(f.get("loss_sum"), f.get("samples"), most, bounds)
        times = ("compute_s", "d2d_s", "session_s")
        if problem or not all(bounded(f.get(k), arrived - sent_at[c]) for k in times):
            return f"client {c}: bad ring report: {problem or 'times'}"
        payload = f.get("payload")
        counts = [f.get("d2d_wire")] + list((payload or {}).values())
        if not isinstance(payload, dict) or not all(bounded(v, MAX_BYTES) for v in counts):
            return f"client {c}: bad payload counts"
        problem = check_state(state_from("model", reply.tensors), specs, state, bounds, steps)
        if problem:
            return f"client {c}: rejected model: {problem}"
    return None


def _meter(meter: Meter, reply: Message, rtt: float, up: int, down: int, down_payload) -> None:
    """Compute and ring hops as the member measured them; the model's trip to and from the
    server = round trip − the session, split by bytes."""
    f = reply.fields
    session = min(float(f["session_s"]), rtt)
    comm = rtt - session
    meter.compute_s += float(f["compute_s"])
    meter.upload_s += float(f["d2d_s"]) + comm * up / max(up + down, 1)
    meter.download_s += comm * down / max(up + down, 1)
    meter.wire_up += up + int(f["d2d_wire"])
    meter.wire_down += down
    meter.count("model_down", down_payload)
    meter.count("model_up", payload_bytes(reply))
    for kind, nbytes in f["payload"].items():
        meter.count(str(kind), int(nbytes))


def _abandon(rnd: D2DRound, order, reason: str) -> None:
    """RingSFL's step needs every member: the round is abandoned for all of them."""
    for c in order:
        rnd.lost[c] = f"ring round abandoned: {reason}"

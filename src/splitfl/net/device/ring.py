"""A RingSFL ring member on a device (``papers/ringsfl.md`` §3.2–3.5, Alg. 2 over real links).

The server sends every member the ring (order, propagation lengths L_i, weights a_i, v2's
dynamic rate), the round's steps and the global model, plus two device-to-device links: the
member *dials* its successor's peer listener (with a one-round token) and *accepts* its
predecessor's. Activations travel forward (to the successor) and gradients backward (to the
predecessor) as :class:`~splitfl.topologies.ring.member.RingMember` hops; labels never leave their
client. A step ends when every active batch has come back through this member's segment; then
the member updates (Eq. 5–7) and starts the next step (messages of a later step that arrive
early wait). At the end it replies ``ring_done`` with its blended model and its tally.

A broken link, a timeout (``timeout_s`` without a message), the server's ``abort`` or an
invalid tensor ends the session with ``ring_failed``: Alg. 2 needs every member in every
step, so the server abandons the round (:mod:`splitfl.net.server.ring`). Where a neighbour
sent what was refused (a header, a tensor's shape, dtype, values or magnitude), the reply
names it (``blame``): the server records that member, not this one, as the one that failed.
"""

from __future__ import annotations

import copy
import queue
import threading
import time

import torch

from splitfl.core.activations import batch_size, count_of, differentiable, leaves, pack, unpack
from splitfl.core.plan import ClientTask
from splitfl.core.topology import RingSpec
from splitfl.net.device.emulation import FORWARD_SHARE, stretch, transfer
from splitfl.net.server.remote_fleet import Meter
from splitfl.net.transport.hub import LOST
from splitfl.net.transport.peer import PeerChannel, PeerError, dial
from splitfl.net.transport.wire import Message, all_finite, payload_bytes, state_from, state_tensors
from splitfl.net.trust.ring_bounds import (
    REFERENCE_SAMPLES,
    activation_problem,
    gradient_problem,
    hop_scales,
)
from splitfl.roles.sides import DeviceRole
from splitfl.topologies.ring.member import RingMember


class RingBroken(RuntimeError):
    """The ring cannot complete the round (the reason is reported to the server); ``blame``:
    the neighbour whose message was refused, where one was."""

    def __init__(self, reason: str, blame: int | None = None):
        super().__init__(reason)
        self.blame = blame


def ring_session(agent, c: int, msg: Message, abort: threading.Event) -> Message:
    """Run client ``c``'s part of the ring round; ``ring_done`` or ``ring_failed``."""
    f = msg.fields
    edge_in = f["expect"]["name"]
    agent.peer.hub.expect({edge_in: f["expect"]["token_hash"]})
    out: PeerChannel | None = None
    started = time.perf_counter()
    try:
        member = _Member(agent, c, msg, abort)
        out = member.connect()
        member.run()
    except (RingBroken, PeerError, ValueError, KeyError) as err:
        fields = {"reason": f"client {c}: {err}"}
        if getattr(err, "blame", None) is not None:
            fields["blame"] = err.blame
        return Message("ring_failed", fields)
    finally:
        agent.peer.hub.forget([edge_in])
        if out is not None:
            out.close()
    m = member.meter  # ring sends are its upload: time held, bytes
    fields = {
        "samples": member.samples,
        "loss_sum": member.loss_sum,
        "compute_s": m.compute_s,
        "d2d_s": m.upload_s,
        "d2d_wire": m.wire_up,
        "payload": m.payload,
        "session_s": time.perf_counter() - started,
    }
    return Message("ring_done", fields, state_tensors("model", member.model.state_dict()))


class _Member:
    """The session's state: links, model, batches, shapes to check against."""

    def __init__(self, agent, c: int, msg: Message, abort: threading.Event):
        f = msg.fields
        self.agent, self.c, self.abort = agent, c, abort
        self.fields = f
        order = [int(k) for k in f["order"]]
        self.ring = RingSpec(
            order,
            {int(k): int(v) for k, v in f["lengths"].items()},
            {int(k): float(v) for k, v in f["weights"].items()},
            bool(f["dynamic_lr"]),
        )
        self.steps = {int(k): int(v) for k, v in f["steps"].items()}
        # the batches in the sequential ring's order (task order): BatchNorm statistics follow it
        self.starts = [int(k) for k in f["starts"]]
        if sorted(self.starts) != sorted(order) or set(self.steps) != set(order):
            raise RingBroken("the ring's starts and steps must name its members")
        self.n = len(order)
        pos = order.index(c)
        self.succ, self.pred = order[(pos + 1) % self.n], order[pos - 1]
        self.timeout = float(f["timeout_s"])
        self.model = copy.deepcopy(agent.model)
        self.model.load_state_dict(state_from("model", msg.tensors))
        self.model.train()
        self.member = RingMember(c, self.model, self.ring, agent.config.train.loss)
        n_blocks = self.model.num_blocks
        task = ClientTask(c, n_blocks, 0, int(f["batch_size"]), self.steps[c], float(f["lr"]))
        data = agent.data.samples[c]
        self.role = DeviceRole(
            task, self.model, None, agent.config.train, data, f["round_seed"], agent.runtime
        )
        self.inputs = _block_inputs(self.model, data[0][:1])
        own = (data[0][:REFERENCE_SAMPLES], data[1][:REFERENCE_SAMPLES])
        self.scales = hop_scales(self.model, *own, self.member.criterion)
        self.bounds = agent.config.network.bounds
        self.dtype = next(self.model.parameters()).dtype
        self.batch_size = int(f["batch_size"])
        self.num_classes = agent.data.num_classes
        self.profile = agent.profiles.get(c)
        emulate = f.get("emulate") or {}
        self.block_flops = [float(x) for x in f.get("block_flops") or []]
        self.rates = (float(emulate.get("d2d_next", 0)), float(emulate.get("d2d_prev", 0)))
        self.events: queue.Queue = queue.Queue()
        self.meter = Meter()
        self.samples, self.loss_sum = 0, 0.0
        self.deferred: list[tuple[str, Message]] = []
        self.labels: torch.Tensor | None = None
        self.ended = {"fwd": False, "bwd": False}  # the neighbour on that side has finished

    # -- links -------------------------------------------------------------------------------
    def connect(self) -> PeerChannel:
        """Dial the successor, wait for the predecessor; both feed one event queue."""
        nxt = self.fields["next"]
        if not nxt.get("address"):
            raise RingBroken(f"successor {self.succ} has no peer listener")
        opts = self.agent.options
        limit = opts.max_message_bytes if opts else 256 << 20
        self.out = dial(
            nxt["address"],
            nxt["name"],
            nxt["token"],
            self.c,
            nxt.get("cert", ""),
            limit,
            self.timeout,
            self.abort,
        )
        hub = self.agent.peer.hub
        if self.pred not in hub.wait_clients([self.pred], self.timeout, self.abort):
            raise RingBroken(f"predecessor {self.pred} did not connect")
        self.inbound = hub.link_of(self.pred)
        _pump(self.out.inbox, "bwd", self.events)
        _pump(self.inbound.inbox[self.pred], "fwd", self.events)
        return self.out

    def _send(self, direction: str, message: Message, kind: str) -> None:
        """Send over the link (emulated: held for payload bytes / the D2D rate first)."""
        t0 = time.perf_counter()
        rate = self.rates[0] if direction == "next" else self.rates[1]
        nbytes = payload_bytes(message)
        transfer(nbytes, rate)
        if direction == "next":
            message.fields["client"] = self.c  # the listener routes by the client it expects
            size = self.out.send(message)
        else:
            size = self.inbound.send(message)
        self.meter.count(kind, nbytes)
        self.meter.wire_up += size
        self.meter.upload_s += time.perf_counter() - t0

    # -- the round -----------------------------------------------------------------------------
    def run(self) -> None:
        lr = float(self.fields["lr"])
        for step in range(max(self.steps.values())):
            active = [k for k in self.starts if step < self.steps[k]]
            self.member.begin_step()
            if self.c in active:
                x, self.labels = self.role.batch(step)
                lo, hi = self.member.segment(self.c, 0)
                out = self._compute(self.member.forward, (self.c, 0, x), lo, hi, True)
                self._forward_on(step, self.c, 1, out)
            while self.member.backward_done < len(active):
                kind, msg = self._next(step)
                if kind == "fwd":
                    self._on_forward(step, msg)
                else:
                    self._on_backward(step, msg)
            self.member.end_step(active, lr)
        # tell both neighbours we are done: a link that closes after this is not a failure
        self.out.send(Message("ring_end", {"client": self.c}))
        self.inbound.send(Message("ring_end"))

    def _next(self, step: int) -> tuple[str, Message]:
        for i, (_, msg) in enumerate(self.deferred):
            if msg.fields.get("step") == step:
                return self.deferred.pop(i)
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                kind, got = self.events.get(timeout=0.2)
            except queue.Empty:
                if self.abort.is_set():
                    raise RingBroken("aborted by the server") from None
                if time.monotonic() > deadline:
                    raise RingBroken(f"no message within {self.timeout:g} s") from None
                continue
            if got is LOST and self.ended[kind]:
                continue
            if got is LOST:
                who = self.succ if kind == "bwd" else self.pred
                why = self.out.error if kind == "bwd" else self.inbound.reason
                raise RingBroken(f"link to client {who} lost ({why or 'closed'})")
            msg = got[0]
            if msg.type == "ring_end":
                self.ended[kind] = True
                continue
            s = msg.fields.get("step")
            if not isinstance(s, int) or s < step:
                sender = self.pred if kind == "fwd" else self.succ
                raise RingBroken(f"message for step {s!r} during step {step}", sender)
            if s > step:
                self.deferred.append((kind, msg))
                continue
            return kind, msg

    def _on_forward(self, step: int, msg: Message) -> None:
        start, hop = msg.fields.get("start"), msg.fields.get("hop")
        if start not in self.steps or not isinstance(hop, int) or not 1 <= hop <= self.n:
            raise RingBroken(f"bad forward header {start!r}/{hop!r}", self.pred)
        if hop == self.n:  # the logits of our own batch are back: loss, gradient goes back
            if start != self.c:
                raise RingBroken(f"logits of client {start}'s batch arrived", self.pred)
            h = msg.tensors.get("h")
            self._check(self.pred, h, (len(self.labels), self.num_classes))
            self._blame(self.pred, activation_problem(h, self.scales[-1], 0, self.bounds))
            grad, loss = self.member.loss(h, self.labels)
            self.samples += len(self.labels)
            self.loss_sum += loss * len(self.labels)
            self._backward_on(step, start, hop - 1, grad)
            return
        lo, hi = self.member.segment(start, hop)
        specs = self.inputs[lo]
        h = unpack("h", msg.tensors, None if len(specs) == 1 else len(specs))
        for i, (t, (shape, dtype)) in enumerate(zip(leaves(h), specs, strict=True)):
            self._check(self.pred, t, None, shape, dtype)
            self._blame(self.pred, activation_problem(t, self.scales[lo], i, self.bounds))
        if len({t.shape[0] for t in leaves(h)}) != 1:
            raise RingBroken("activation tensors of different batch sizes", self.pred)
        out = self._compute(self.member.forward, (start, hop, h), lo, hi, True)
        self._forward_on(step, start, hop + 1, out)

    def _on_backward(self, step: int, msg: Message) -> None:
        start, hop = msg.fields.get("start"), msg.fields.get("hop")
        if (start, hop) not in self.member.saved:
            raise RingBroken(f"unexpected gradient for {start!r}/{hop!r}", self.succ)
        out = self.member.saved[(start, hop)][1]
        g = unpack("g", msg.tensors, count_of(out))
        lo, hi = self.member.segment(start, hop)
        for i, (o, t) in enumerate(zip(leaves(out), leaves(g), strict=True)):
            if differentiable(o):
                self._check(self.succ, t, tuple(o.shape))
                self._blame(self.succ, gradient_problem(t, self.scales[hi], i, self.bounds))
            elif t is not None:
                raise RingBroken("a gradient for a tensor that takes none", self.succ)
        grad_in = self._compute(self.member.backward, (start, hop, g), lo, hi, False)
        if grad_in is not None:
            self._backward_on(step, start, hop - 1, grad_in)

    def _forward_on(self, step, start, hop, h) -> None:
        fields = {"start": start, "hop": hop, "step": step}
        self._send("next", Message("ring_fwd", fields, pack("h", h)), "d2d_activations")

    def _backward_on(self, step, start, hop, g) -> None:
        fields = {"start": start, "hop": hop, "step": step}
        self._send("prev", Message("ring_bwd", fields, pack("g", g)), "d2d_gradients")

    def _compute(self, work, args: tuple, lo: int, hi: int, forward: bool):
        """``work(*args)`` (its last argument is the tensor: the batch is its first dimension);
        with emulation, stretched to the profile's FLOPS for blocks [lo, hi) (forward 1/3 of
        their FLOPs, backward 2/3)."""
        t0 = time.perf_counter()
        result = work(*args)
        samples = batch_size(args[-1])
        if self.profile is not None and self.block_flops:
            share = FORWARD_SHARE if forward else 1 - FORWARD_SHARE
            per_sample = share * sum(self.block_flops[lo:hi])
            stretch(t0, samples, per_sample, self.profile.flops)
        self.meter.compute_s += time.perf_counter() - t0
        return result

    def _blame(self, sender: int, problem: str | None) -> None:
        """End the round naming the neighbour whose hop was refused."""
        if problem:
            raise RingBroken(f"rejected hop from client {sender}: {problem}", sender)

    def _check(self, sender: int, t, shape, per_sample=None, dtype=None) -> None:
        """``t`` (from neighbour ``sender``) has ``shape`` (or per-sample ``per_sample`` and a
        batch within the batch size) and the model's dtype (or ``dtype``), with finite
        values; else the round ends naming ``sender``."""
        problem = None
        if t is None or t.dtype != (dtype or self.dtype):
            problem = "missing tensor or wrong dtype"
        elif shape is None:
            if t.dim() != len(per_sample) + 1 or tuple(t.shape[1:]) != per_sample:
                problem = f"activation shape {tuple(t.shape)}"
            elif not 1 <= t.shape[0] <= self.batch_size:
                problem = f"batch of {t.shape[0]}"
        elif tuple(t.shape) != tuple(shape):
            problem = f"tensor shape {tuple(t.shape)}, expected {tuple(shape)}"
        if problem is None and t.dtype != torch.bool and not all_finite(t):
            problem = "non-finite values"
        self._blame(sender, problem)


def _block_inputs(model, sample: torch.Tensor) -> list[list[tuple[tuple[int, ...], torch.dtype]]]:
    """What every block takes: per tensor, its per-sample shape and dtype (a one-sample dry
    run; several tensors where a graph-split model's cut carries several)."""
    dtype = next(model.parameters()).dtype
    h = sample.to(dtype) if sample.is_floating_point() else sample
    inputs = []
    with torch.no_grad():
        was = model.training
        model.eval()
        for k in range(model.num_blocks):
            inputs.append([(tuple(t.shape[1:]), t.dtype) for t in leaves(h)])
            h = model(h, k, k + 1)
        model.train(was)
    return inputs


def _pump(source: queue.Queue, kind: str, sink: queue.Queue) -> None:
    """Move ``source``'s items into ``sink`` tagged ``kind`` until the link is lost."""

    def move() -> None:
        while True:
            item = source.get()
            sink.put((kind, item))
            if item is LOST:
                return

    threading.Thread(target=move, daemon=True).start()

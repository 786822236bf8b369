"""The networked fleet: :class:`~splitfl.roles.fleet.Fleet` calls sent to device processes.

Every call goes to all the devices it names first and then collects the replies, so devices
compute in parallel. A reply that does not come within ``timeout_s`` (the device stalled), a
closed link (the process died) or a reply that fails validation drops the client for the
rest of the round (``lost`` names why); the server's models are never touched by a rejected
tensor.

What is measured per client (:class:`Meter`): device compute (reported by the device with
each reply), communication = round trip − the device's compute for the exchange (a device
process serves each hosted client in its own thread), split into upload and download in
proportion to the bytes each way (one-way times need synchronised clocks, which devices do
not have), the server's compute for the client's iterations, and bytes: the tensor payload
per link (as the cost model counts it) and the
encoded messages on the wire.

Over 400 lines as one concept: the fleet's calls and what each call measures and drops are
one job (the :class:`Meter`'s held time and the deadline on the client's clock are read
where each reply is awaited); the peer checks and the stall clock live in
:mod:`splitfl.net.trust` and :mod:`splitfl.net.server.stalls`.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from splitfl.core.activations import leaves, names, pack, unpack
from splitfl.core.plan import AUX_LOSSES, ClientTask
from splitfl.core.topology import AuxSpec
from splitfl.net.device.emulation import Profile, stretch
from splitfl.net.transport.hub import LOST, DeviceLink, Hub
from splitfl.net.transport.wire import Message, payload_bytes, state_from, state_tensors
from splitfl.net.trust.checks import (
    PeerScale,
    check_state,
    is_number,
    loss_problem,
    rms,
    samples_problem,
    smashed_problem,
    state_specs,
)
from splitfl.net.trust.expect import Expect
from splitfl.net.trust.spread import RoundMoves
from splitfl.roles.aux_numerics import aux_module, returned_names
from splitfl.roles.sides import ServerRole

if TYPE_CHECKING:  # a type only: a device process imports this module, not the server's clock
    from splitfl.net.server.stalls import StallClock

State = dict[str, torch.Tensor]
#: The drop reason of a client still working at the round deadline.
LATE = "still working at the round deadline"


@dataclass
class Meter:
    """One client's measured round."""

    compute_s: float = 0.0
    upload_s: float = 0.0
    download_s: float = 0.0
    server_s: float = 0.0
    payload: dict[str, int] = field(default_factory=dict)
    wire_up: int = 0
    wire_down: int = 0
    #: when (``time.monotonic()``) the client's finished update arrived; None before
    finished_at: float | None = None
    #: the device (link name) that trained the client this round
    device: str | None = None
    #: seconds of the round the server held the client up: before its first command, and
    #: from each reply's arrival to the next command (the server's own work, its waits on
    #: other clients, its sleeps); excluded from the client's lateness (issue 51 item 3)
    held_s: float = 0.0
    #: when (``time.perf_counter()``) the client's last reply arrived, until its next command
    replied_at: float | None = None
    #: whether the server sent the client a command this round
    contacted: bool = False

    @property
    def busy_s(self) -> float:
        """The client's own time (its Eq. 1 analogue): compute, transfers, server compute."""
        return self.compute_s + self.upload_s + self.download_s + self.server_s

    def count(self, link: str, nbytes: int) -> None:
        self.payload[link] = self.payload.get(link, 0) + nbytes


class RemoteFleet:
    """Fleet calls over the hub's device links (one instance per group and round)."""

    _seq = itertools.count()

    def __init__(
        self,
        hub: Hub,
        round_seed: int,
        timeout_s: float,
        expect: Expect,
        meters: dict[int, Meter],
        lost: dict[int, str],
        profiles: dict[int, Profile] | None = None,
        moves: RoundMoves | None = None,
        round_deadline: float | None = None,
        peers: PeerScale | None = None,
        aux: AuxSpec | None = None,
        device_loss: str = "server",
        stalls: StallClock | None = None,
        began: float | None = None,
    ):
        self.hub, self.round_seed, self.timeout_s, self.expect = hub, round_seed, timeout_s, expect
        self.meters, self.lost, self.profiles = meters, lost, profiles
        #: each accepted update's move from the part it was sent per local step (the round's
        #: peer checks: :func:`~splitfl.net.trust.checks.peer_outliers` and the spread check)
        self.moves = RoundMoves() if moves is None else moves
        #: when (``time.monotonic()``) the round's clients must be done (None: no deadline
        #: but ``timeout_s`` per command); see ``network.round_deadline_factor``
        self.round_deadline = round_deadline
        #: the server process's stalls and when (``time.monotonic()``) the round began: the
        #: deadlines move by the time the server itself stood still (:mod:`.stalls`)
        self.stalls, self.began = stalls, began
        #: the round's accepted smashed data, shared by its groups (the peer RMS check)
        b = expect.bounds
        self.peers = peers or PeerScale(b.activation_rms_factor, b.activation_rms_abs)
        self.dropped: set[int] = set()
        #: where what arrives is recorded (``privacy.record``: the executor sets the round's
        #: :class:`~splitfl.roles.cut_record.RoundTap`; None: nothing is)
        self.tap = None
        self.tasks: dict[int, ClientTask] = {}
        #: bytes sent without a reply of their own (gradients): the next exchange carries them
        self.unanswered: dict[int, int] = {}
        #: each client's link, looked up once per round (not under the hub's lock per batch)
        self.links: dict[int, DeviceLink | None] = {}
        #: what each client was sent at ``begin`` (device part, auxiliary model; an aligned
        #: one replaces it): updates are checked against it (``trust.update_problem``)
        self.sent: dict[int, tuple[State, State | None]] = {}
        #: auxiliary plans: the auxiliary model devices build
        #: (:class:`~splitfl.core.plan.AuxSpec`) and how they update (``local``/``estimate``,
        #: :attr:`~splitfl.core.plan.RoundPlan.device_loss`)
        self.aux, self.device_loss = aux, device_loss

    # -- Fleet -------------------------------------------------------------------------------
    def begin(self, tasks, parts, aux):
        requests = {}
        for t in tasks:
            self.tasks[t.client] = t
            self.sent[t.client] = (parts[t.client], aux.get(t.client))
            fields = self.task_fields(t)
            if self.profiles is not None:
                fields["emulate"] = self.profiles[t.client].to_fields()
            moving = self.expect.part_specs[t.cut]  # the frozen base stays on the device
            part = {k: v for k, v in parts[t.client].items() if k in moving}
            if aux.get(t.client) is not None:
                fields["aux"] = self._aux_fields()
            tensors = {**state_tensors("part", part), **state_tensors("aux", aux.get(t.client))}
            requests[t.client] = (Message("begin", fields, tensors), "model_down")
        self._call(requests, "ack")

    def task_fields(self, t: ClientTask) -> dict:
        """What a device is told of its task when the round begins."""
        return {
            "cut": t.cut,
            "group": t.group,
            "batch_size": t.batch_size,
            "steps": t.steps,
            "lr": t.lr,
            "round_seed": self.round_seed,
        }

    def forward(self, steps):
        requests = {c: (Message("forward", {"step": s}), None) for c, s in steps.items()}
        out = {}
        for c, msg in self._call(requests, "forwarded").items():
            count = self.expect.count(self.tasks[c].cut)
            fx, y = unpack("fx", msg.tensors, count), msg.tensors.get("y")
            problem = self._check_smashed(c, fx, y, steps[c])
            if not problem and set(msg.tensors) != names("fx", count) | {"y"}:
                problem = "unexpected tensors"
            if problem:
                self._drop(c, f"rejected smashed data: {problem}")
                continue
            self.meters[c].count("activations_up", sum(_nbytes(t) for t in leaves(fx)))
            self.meters[c].count("labels_up", _nbytes(y))
            out[c] = (fx, y)
        return out

    def backward(self, grads):
        for c, grad in grads.items():
            self._post(c, Message("backward", {}, pack("grad", grad)), "gradients_down")

    def local_server_update(self, grads):
        """The gradients down as ``backward``: the device's ``begin`` named the mode
        (``local+server``), so it adds its auxiliary loss."""
        self.backward(grads)

    def head_update(self, clients):
        for c in clients:
            self._post(c, Message("head_update"), None)

    def estimate_update(self, clients):
        for c in clients:
            self._post(c, Message("estimate_update"), None)

    def load_aux(self, states):
        """The aligned auxiliary models down (no reply); each is now what its device holds."""
        for c, state in states.items():
            if c in self.sent:
                self.sent[c] = (self.sent[c][0], state)
            self._post(c, Message("load_aux", {}, state_tensors("aux", state)), "model_down")

    def aux_step(self, steps, device_loss):
        """``aux_step`` → ``aux_done`` (samples trained): the device's ``begin`` named its
        ``device_loss``; nothing but the sample count comes back."""
        del device_loss  # sent once, with ``begin``
        requests = {c: (Message("aux_step", {"step": s}), None) for c, s in steps.items()}
        out = {}
        for c, msg in self._call(requests, "aux_done").items():
            samples = msg.fields.get("samples")
            problem = samples_problem(samples, self.tasks[c].batch_size)
            if problem:
                self._drop(c, f"rejected auxiliary step report: {problem}")
                continue
            out[c] = samples
        return out

    def _post(self, c: int, msg: Message, link_name: str | None) -> None:
        """Send without waiting for a reply (the device's next reply follows its work)."""
        handle = self._send(c, msg, link_name)
        if handle is not None:
            self.unanswered[c] = self.unanswered.get(c, 0) + handle[3]

    def local_step(self, steps):
        requests = {c: (Message("local_step", {"step": s}), None) for c, s in steps.items()}
        out = {}
        for c, msg in self._call(requests, "local_done").items():
            loss_sum, samples = msg.fields.get("loss_sum"), msg.fields.get("samples")
            problem = loss_problem(loss_sum, samples, self.tasks[c].batch_size, self.expect.bounds)
            if problem:
                self._drop(c, f"rejected local step report: {problem}")
                continue
            out[c] = (float(loss_sum), samples)
        return out

    def finish(self, clients):
        requests = {c: (Message("finish"), None) for c in clients}
        out = {}
        for c, msg in self._call(requests, "finished").items():
            self.meters[c].finished_at = time.monotonic()
            part, aux = state_from("part", msg.tensors), state_from("aux", msg.tensors)
            problem = self._check_part(c, part, aux)
            if problem:
                self._drop(c, f"rejected model update: {problem}")
                continue
            self.meters[c].count("model_up", payload_bytes(msg))
            steps = max(self.tasks[c].steps, 1)  # a client with more steps moves further
            self.moves.add(c, part, self.sent[c][0], steps)
            frozen = {k: v for k, v in self.sent[c][0].items() if k not in part}
            sent_aux = self.sent[c][1]
            out[c] = ({**frozen, **part}, {**sent_aux, **aux} if sent_aux else None)
        return out

    # -- transport -----------------------------------------------------------------------------
    def _send(self, c: int, msg: Message, link_name: str | None):
        """Send ``msg`` to client ``c``'s device; (link, seq, sent at, bytes) or None."""
        if c in self.dropped or c in self.lost:  # lost: benched before the round began
            return None
        if c not in self.links:
            self.links[c] = self.hub.link_of(c)
        link = self.links[c]
        if link is None or not link.alive:
            self._drop(c, "device not connected" if link is None else f"lost: {link.reason}")
            return None
        self.meters[c].device = link.name
        seq = next(self._seq)
        msg.fields.update(client=c, seq=seq)
        sent_at = time.perf_counter()
        self._hold(c, sent_at)
        size = link.send(msg)
        self.meters[c].wire_down += size
        if link_name:
            self.meters[c].count(link_name, payload_bytes(msg))
        return link, seq, sent_at, size

    def _hold(self, c: int, sent_at: float) -> None:
        """Count the time since client ``c``'s last reply (since the round began before its
        first command) as the server's: ``Meter.held_s``."""
        meter = self.meters[c]
        if meter.replied_at is not None:
            meter.held_s += max(sent_at - meter.replied_at, 0.0)
        elif not meter.contacted and self.began is not None:
            began = time.perf_counter() - (time.monotonic() - self.began)  # on perf_counter
            meter.held_s += max(sent_at - began, 0.0)
        meter.replied_at, meter.contacted = None, True

    def _call(
        self, requests: dict[int, tuple[Message, str | None]], reply: str
    ) -> dict[int, Message]:
        """Send every request, then collect each reply (deadline ``timeout_s``)."""
        sent = {c: self._send(c, msg, name) for c, (msg, name) in requests.items()}
        deadline = time.monotonic() + self.timeout_s
        out = {}
        for c, handle in sent.items():
            if handle is None:
                continue
            link, seq, sent_at, down = handle
            down += self.unanswered.pop(c, 0)
            got = self._await(link, c, seq, deadline)
            if got is None:
                continue
            msg, up, arrived = got
            self.meters[c].replied_at = arrived
            if msg.type == "error":
                self._drop(c, f"device refused: {str(msg.fields.get('error'))[:200]}")
                continue
            if msg.type != reply:
                self._drop(c, f"expected {reply!r}, got {msg.type[:40]!r}")
                continue
            self._measure(c, msg, arrived - sent_at, up, down)
            out[c] = msg
        return out

    def _await(self, link: DeviceLink, c: int, seq: int, deadline: float):
        """Client ``c``'s reply to command ``seq``, or None (dropped: late at the round
        deadline, silent for ``timeout_s`` or lost). The round deadline is on the client's
        clock: it moves by the time the server held the client up (``Meter.held_s``) and by
        the server process's own stalls (issue 51 item 3: honest devices benched as late
        because the server was)."""
        while True:
            stalled = self._stalled()
            late = self.round_deadline is not None
            end = self.round_deadline + self.meters[c].held_s + stalled if late else deadline
            late = late and end < deadline + stalled
            end = end if late else deadline + stalled
            got = link.reply(c, seq, end - time.monotonic())
            if got is not None or self._stalled() == stalled:
                break
        if got is None and late:  # the link stays: the device's late replies are dropped
            self._drop(c, f"{LATE} (network.round_deadline_factor)")
        elif got is None:
            self._drop(c, f"no reply within {self.timeout_s:g} s")
            link.close(f"stalled (no reply within {self.timeout_s:g} s)")
        elif got is LOST:
            self._drop(c, f"device {link.name} lost: {link.reason}")
        else:
            return got
        return None

    def _stalled(self) -> float:
        """Seconds the server process stood still since the round began (0 without a stall
        clock)."""
        return 0.0 if self.stalls is None or self.began is None else self.stalls.since(self.began)

    def _measure(self, c, msg, rtt, up, down) -> None:
        compute = msg.fields.get("compute_s")
        compute = min(max(float(compute), 0.0), rtt) if is_number(compute) else 0.0
        comm = rtt - compute  # the device serves each client in its own thread
        meter = self.meters[c]
        meter.compute_s += compute
        meter.wire_up += up
        meter.upload_s += comm * up / max(up + down, 1)
        meter.download_s += comm * down / max(up + down, 1)

    def _drop(self, c: int, reason: str) -> None:
        if c not in self.dropped:
            self.dropped.add(c)
            self.lost.setdefault(c, reason)

    # -- validation ------------------------------------------------------------------------------
    def _check_smashed(self, c: int, fx, y, step: int) -> str | None:
        task, ex = self.tasks[c], self.expect
        target = (ex.target_dtype, ex.target_shape)
        problem = smashed_problem(
            fx, y, ex.features[task.cut], task.batch_size, ex.num_classes, target
        )
        for i, t in enumerate(leaves(fx) if problem is None else []):
            if t.is_floating_point() and t.numel():
                problem = problem or self.peers.problem((task.cut, i), step, c, rms(t))
        return problem

    def _aux_fields(self) -> dict:
        """``begin``'s ``aux`` field: the auxiliary model the device builds and how it updates."""
        if self.aux is None or self.device_loss not in AUX_LOSSES:
            raise ValueError("an auxiliary model sent without an auxiliary plan")
        spec = self.aux
        return {
            "model": spec.model,
            "input_shape": list(spec.input_shape),
            "num_classes": spec.num_classes,
            "loss": self.device_loss,
        }

    def _check_part(self, c: int, part: State, aux: State) -> str | None:
        """The device part (and the auxiliary model's entries the device returns,
        :func:`~splitfl.roles.aux_numerics.returned_names`) against what was sent."""
        task, (sent_part, sent_aux) = self.tasks[c], self.sent[c]
        bounds = self.expect.bounds
        problem = check_state(part, self.expect.part_specs[task.cut], sent_part, bounds, task.steps)
        if problem or (not aux and not sent_aux):
            return problem
        if not sent_aux:
            return "auxiliary model sent but none was given"
        names_back = returned_names(aux_module(self.aux, sent_aux), self.device_loss)
        sent_back = {k: v for k, v in sent_aux.items() if k in names_back}
        problem = check_state(aux, state_specs(sent_back), sent_back, bounds, task.steps)
        return f"auxiliary model: {problem}" if problem else None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class TimedServer:
    """A :class:`ServerRole` whose step time is charged to every member it served; with
    ``emulate`` (per-sample server FLOPs by cut, server FLOPS) the step is stretched to
    ``Σ samples × FLOPs / Comp_s`` (S²FL Eq. 1's ``F_s / Comp_s``)."""

    def __init__(self, server: ServerRole, meters: dict[int, Meter], emulate=None):
        self.server, self.meters, self.stop = server, meters, server.stop
        self.emulate = emulate

    def step(self, sent):
        start = time.perf_counter()
        out = self.server.step(sent)
        if self.emulate is not None:
            per_cut, flops = self.emulate
            work = sum(len(s.labels) * per_cut(s.cut) for s in sent)
            stretch(start, 1, work, flops)
        spent = time.perf_counter() - start
        for s in sent:
            self.meters[s.client].server_s += spent
        return out

    def align(self, task: ClientTask, aux_state: State, memory) -> State:
        """FSL-SAGE's alignment (:meth:`ServerRole.align`), its time charged to ``task``'s
        client (measured, not stretched by the emulation)."""
        start = time.perf_counter()
        out = self.server.align(task, aux_state, memory)
        self.meters[task.client].server_s += time.perf_counter() - start
        return out

"""U-shaped split learning on the networked server: the family's
:func:`~splitfl.topologies.ushaped.schedule.run_group` over device processes.

:class:`RemoteUFleet` is the :class:`~splitfl.topologies.ushaped.schedule.UFleet` over
:class:`~splitfl.net.server.remote_fleet.RemoteFleet`'s transport, drops and meters; the device side
is :mod:`splitfl.net.device.ushaped`. Commands (no label ever travels):

* ``u_begin`` (task fields, ``tail``, the front's and head's tensors ``part.*``) → ``ack``;
* ``u_forward`` (step) → ``u_forwarded``: the smashed data ``fx.*`` only, checked as
  ``forward``'s (:func:`~splitfl.net.trust.checks.smashed_problem` on the rows, the peer RMS);
* ``u_head`` (the middle's output ``out.*``) → ``u_headed``: ∂loss/∂out ``grad.*`` (shape and
  dtype of what was sent, finite, RMS at most ``network.bounds.activation_factor`` × the
  server's own at the tail, :func:`~splitfl.net.trust.ring_bounds.gradient_problem`), the
  batch's loss sum and samples (:func:`~splitfl.net.trust.checks.loss_problem`);
* ``backward`` (∂loss/∂fx) → no reply, as a split round's;
* ``u_finish`` → ``u_finished``: the trained front and head, checked against what was sent
  (:func:`~splitfl.net.trust.checks.check_state`, the norm and peer checks).

On the meters (the cost model's links, :mod:`splitfl.topologies.ushaped.price`): the smashed
data and the head gradient are ``activations_up``, the middle's output and the front's
gradient ``gradients_down``; ``labels_up`` stays 0. The middle's time is charged to every
member it served, as :class:`~splitfl.net.server.remote_fleet.TimedServer` charges a server step.
"""

from __future__ import annotations

import time

import torch

from splitfl.core.activations import (
    count_of,
    differentiable,
    leaves,
    names,
    pack,
    rebuild,
    unpack,
)
from splitfl.core.topology import UShaped
from splitfl.models import ModelPart
from splitfl.models.base import moving_state
from splitfl.net.device.emulation import FORWARD_SHARE, stretch
from splitfl.net.server.groups import NETWORKED_GROUPS, Groups, NetRound
from splitfl.net.server.remote_fleet import RemoteFleet
from splitfl.net.transport.wire import Message, all_finite, payload_bytes, state_from, state_tensors
from splitfl.net.trust.checks import REFERENCE_SAMPLES, check_state, loss_problem, state_specs
from splitfl.net.trust.ring_bounds import HopScale, gradient_problem, hop_scales
from splitfl.topologies.ushaped.schedule import middle_of, run_group, tail_of
from splitfl.training import loss_fn


class RemoteUFleet(RemoteFleet):
    """A U-shaped group's devices over the hub (module docstring). ``scale``: the server's
    own loss-gradient RMS at each tensor entering the tail block, on ``reference_rows``
    reference samples (:func:`~splitfl.net.trust.ring_bounds.hop_scales`)."""

    def __init__(
        self,
        *args,
        tails: dict[int, int],
        scale: HopScale,
        reference_rows: int,
        head_flops: dict[int, float],
        moving: dict[int, set[str]],
        **kw,
    ):
        super().__init__(*args, **kw)
        self.tails, self.scale, self.reference_rows = tails, scale, reference_rows
        self.head_flops, self.moving = head_flops, moving
        self.full: dict[int, dict] = {}  # what each device's front and head started from

    def begin(self, tasks, parts):
        requests = {}
        for t in tasks:
            self.tasks[t.client] = t
            self.full[t.client] = parts[t.client]
            moving = self.moving[t.client]  # a LoRA model's frozen base stays on the device
            self.sent[t.client] = ({k: v for k, v in parts[t.client].items() if k in moving}, None)
            fields = {**self.task_fields(t), "tail": self.tails[t.client]}
            if self.profiles is not None:  # emulated: the front's profile, the head's FLOPs
                fields["emulate"] = self.profiles[t.client].to_fields()
                fields["head_flops"] = self.head_flops[t.client]
            tensors = state_tensors("part", self.sent[t.client][0])
            requests[t.client] = (Message("u_begin", fields, tensors), "model_down")
        self._call(requests, "ack")

    def forward(self, steps):
        requests = {c: (Message("u_forward", {"step": s}), None) for c, s in steps.items()}
        out = {}
        for c, msg in self._call(requests, "u_forwarded").items():
            count = self.expect.count(self.tasks[c].cut)
            fx = unpack("fx", msg.tensors, count)
            problem = None if set(msg.tensors) == names("fx", count) else "unexpected tensors"
            problem = problem or self._check_smashed(c, fx, self._stand_in(fx), steps[c])
            if problem:
                self._drop(c, f"rejected smashed data: {problem}")
                continue
            self.meters[c].count("activations_up", _bytes(fx))
            out[c] = fx
        return out

    def head(self, outs):
        down = "gradients_down"  # the cost model's link for what the device receives
        requests = {c: (Message("u_head", {}, pack("out", o)), down) for c, o in outs.items()}
        back = {}
        for c, msg in self._call(requests, "u_headed").items():
            grad = unpack("grad", msg.tensors, count_of(outs[c]))
            loss_sum, samples = msg.fields.get("loss_sum"), msg.fields.get("samples")
            problem = self._check_head(c, outs[c], grad, msg) or loss_problem(
                loss_sum, samples, self.tasks[c].batch_size, self.expect.bounds
            )
            rows = leaves(outs[c])[0].shape[0]
            if not problem and samples != rows:
                problem = f"{samples} samples for a batch of {rows}"
            if problem:
                self._drop(c, f"rejected head gradient: {problem}")
                continue
            self.meters[c].count("activations_up", _bytes(grad))
            back[c] = (grad, float(loss_sum), samples)
        return back

    def finish(self, clients):
        requests = {c: (Message("u_finish"), None) for c in clients}
        out = {}
        for c, msg in self._call(requests, "u_finished").items():
            self.meters[c].finished_at = time.monotonic()
            task, sent = self.tasks[c], self.sent[c][0]
            state = state_from("part", msg.tensors)
            problem = None if len(state) == len(msg.tensors) else "unexpected tensors"
            bounds = self.expect.bounds
            problem = problem or check_state(state, state_specs(sent), sent, bounds, task.steps)
            if problem:
                self._drop(c, f"rejected model update: {problem}")
                continue
            self.meters[c].count("model_up", payload_bytes(msg))
            self.moves.add(c, state, sent, max(task.steps, 1))
            frozen = {k: v for k, v in self.full[c].items() if k not in state}
            out[c] = {**frozen, **state}
        return out

    def _stand_in(self, fx) -> torch.Tensor:
        """Zero targets of the batch's row count: :meth:`RemoteFleet._check_smashed` holds the
        smashed data's rows to the targets'; a U-shaped device sends none."""
        first = leaves(fx)[0] if fx is not None else None
        rows = first.shape[0] if isinstance(first, torch.Tensor) and first.dim() else 0
        ex = self.expect
        return torch.zeros((rows, *ex.target_shape), dtype=ex.target_dtype)

    def _check_head(self, c: int, sent, grad, msg: Message) -> str | None:
        """What is wrong with the head's gradient of the middle output ``sent``, or None."""
        wanted = [t if differentiable(t) else None for t in leaves(sent)]
        expected = pack("grad", rebuild(sent, wanted))
        if set(msg.tensors) != set(expected):
            return "tensor names differ from the middle output's"
        rows = leaves(sent)[0].shape[0]
        # the device's loss is the mean over its batch: the gradient scales as 1 / rows
        ref = tuple(g * self.reference_rows / max(rows, 1) for g in self.scale.grad_rms)
        scale = HopScale(self.scale.peaks, ref)
        for i, (t, g) in enumerate(zip(leaves(sent), leaves(grad), strict=True)):
            if g is None:
                continue
            if tuple(g.shape) != tuple(t.shape) or g.dtype != t.dtype:
                return f"shape {tuple(g.shape)} {g.dtype} for {tuple(t.shape)} {t.dtype}"
            if not all_finite(g):
                return "non-finite values"
            problem = gradient_problem(g, scale, i, self.expect.bounds)
            if problem:
                return problem
        return None


class TimedMiddle:
    """A group's :class:`~splitfl.topologies.ushaped.roles.Middle` whose forward and
    backward time is charged to every member they served (as
    :class:`~splitfl.net.server.remote_fleet.TimedServer` charges a server step); with
    ``emulate`` (each client's per-sample middle FLOPs, the server's FLOPS) the forward is
    stretched to ``Σ samples × FORWARD_SHARE × FLOPs / Comp_s`` and the backward to the rest
    (S²FL Eq. 1's ``F_s / Comp_s``, the middle's blocks ``[cut, tail)``)."""

    def __init__(self, middle, meters, emulate: tuple[dict[int, float], float] | None = None):
        self.middle, self.meters, self.emulate = middle, meters, emulate
        self._samples: dict[int, int] = {}

    def forward(self, sent):
        start = time.perf_counter()
        out = self.middle.forward(sent)
        self._samples = {s.client: s.samples for s in sent}
        self._hold(start, list(self._samples), FORWARD_SHARE)
        self._charge([s.client for s in sent], start)
        return out

    def backward(self, grads):
        start = time.perf_counter()
        back = self.middle.backward(grads)
        self._hold(start, list(grads), 1 - FORWARD_SHARE)
        self._charge(list(grads), start)
        return back

    def _hold(self, start: float, clients: list[int], share: float) -> None:
        if self.emulate is not None:
            per_client, flops = self.emulate
            work = sum(self._samples.get(c, 0) * share * per_client[c] for c in clients)
            stretch(start, 1, work, flops)

    def state(self):
        return self.middle.state()

    def _charge(self, clients: list[int], start: float) -> None:
        spent = time.perf_counter() - start
        for c in clients:
            self.meters[c].server_s += spent


def ushaped_round(net: NetRound) -> Groups:
    """The round runner of U-shaped plans (:data:`~splitfl.net.server.groups.NETWORKED_GROUPS`):
    the server's own gradient scale at the tail, measured once, then one group at a time
    ``run_group(RemoteUFleet, TimedMiddle, run)``."""
    plan, model, train = net.plan, net.model, net.ctx.config.train
    test, where = net.ctx.bundle.test, next(model.parameters()).device
    x, y = test.x[:REFERENCE_SAMPLES].to(where), test.y[:REFERENCE_SAMPLES].to(where)
    scales = hop_scales(model, x, y, loss_fn(train.loss))
    tails = {t.client: tail_of(plan, t) for t in plan.tasks}
    profile, n = net.ctx.profile, model.num_blocks
    head = {t.client: profile.part_flops(tails[t.client], n) for t in plan.tasks}
    mid = {t.client: profile.part_flops(t.cut, tails[t.client]) for t in plan.tasks}
    emulate = (mid, net.ctx.population.server.flops) if net.emulate else None
    moving = {t.client: _moving_keys(model, t.cut, tails[t.client]) for t in plan.tasks}

    def group(run):
        tail = tails[run.tasks[0].client]
        scale, rows = scales[tail], len(y)
        fleet = net.fleet(
            RemoteUFleet,
            tails=tails,
            scale=scale,
            reference_rows=rows,
            head_flops=head,
            moving=moving,
        )
        middle = middle_of(model, run, plan, train, net.runtime)
        middle = TimedMiddle(middle, net.meters, emulate)
        return run_group(fleet, middle, run), middle.state()

    return Groups(group)


def _moving_keys(model, cut: int, tail: int) -> set[str]:
    """The front's and head's tensors that travel: all but a LoRA model's frozen base
    (:func:`~splitfl.models.base.moving_state`)."""
    n = model.num_blocks
    front, head = ModelPart(model, 0, cut), ModelPart(model, tail, n)
    return set(moving_state(front, model)) | set(moving_state(head, model))


def _bytes(x) -> int:
    return sum(t.numel() * t.element_size() for t in leaves(x) if t is not None)


NETWORKED_GROUPS[UShaped] = ushaped_round

"""U-shaped split learning on a device process: the front, the head, the loss and the labels
stay here (:class:`~splitfl.topologies.ushaped.roles.UDevice`, the in-process executors'
code); the server's side is :mod:`splitfl.net.server.ushaped`. Commands
(:data:`~splitfl.net.device.agent.EXTRA_COMMANDS`):

* ``u_begin`` (task fields as ``begin``'s, ``tail``, with emulation the profile and the
  head's per-sample FLOPs ``head_flops``; ``part.*``: exactly the model's front
  ``[0, cut)`` and head ``[tail, n)`` tensors) → ``ack``;
* ``u_forward`` (step) → ``u_forwarded``: the smashed data ``fx.*`` and nothing else;
* ``u_head`` (the middle's output ``out.*``, finite, the batch's rows) → ``u_headed``: the
  gradient ``grad.*`` of the head's mean loss w.r.t. it, the loss sum and the samples;
* ``backward`` (the front's gradient): the agent's own, on :meth:`DeviceU.pending_output`;
* ``u_finish`` → ``u_finished``: the trained front and head ``part.*``.

With ``train.lora`` the front's and head's frozen base weights never travel (each device
builds them from its own model files), as a split round's ``begin``/``finish``.

A U-shaped client's role in ``agent.roles`` is a :class:`DeviceU`: the agent's split commands
that would send labels or train something it does not have (``forward``, ``local_step``,
``head_update``, the auxiliary model's) are refused.
"""

from __future__ import annotations

import copy

from splitfl.core.activations import leaves, pack
from splitfl.core.plan import ClientTask
from splitfl.core.seeding import derive_seed, seed_torch
from splitfl.models import ModelPart
from splitfl.models.base import moving_state
from splitfl.net.device.agent import EXTRA_COMMANDS, Command, CommandError, _check_begin
from splitfl.net.device.aux_commands import step_of
from splitfl.net.device.emulation import FORWARD_SHARE, Profile
from splitfl.net.transport.wire import Message, all_finite, state_from, state_tensors
from splitfl.roles.sides import DeviceRole
from splitfl.topologies.ushaped.roles import UDevice


class DeviceU(UDevice):
    """A U-shaped client's device in ``agent.roles`` (module docstring); ``head_flops``: the
    head's per-sample FLOPs under emulation (``u_head`` is stretched to them)."""

    head_flops: float = 0.0

    def forward(self, step: int):
        raise CommandError("a U-shaped client's labels stay on its device: 'u_forward'")

    def smashed(self, step: int):
        """The front's smashed data of mini-batch ``step`` (no labels)."""
        return UDevice.forward(self, step)

    def pending_output(self):
        """The front's smashed data awaiting its gradient (the agent's ``backward``)."""
        return self.front.pending_output()


def _role(agent, c: int, command: str) -> DeviceU:
    role = agent.roles.get(c)
    if not isinstance(role, DeviceU):
        raise CommandError(f"{command!r} for a client not in a U-shaped round")
    return role


def u_begin(agent, c: int, msg: Message) -> Message:
    f, n = msg.fields, agent.model.num_blocks
    _check_begin(f, n)
    tail = f.get("tail")
    if type(tail) is not int or not f["cut"] < tail < n:
        raise CommandError(f"'u_begin' field tail: {str(tail)[:40]} not in ({f['cut']}, {n})")
    task = ClientTask(c, f["cut"], f["group"], f["batch_size"], f["steps"], f["lr"])
    front = copy.deepcopy(ModelPart(agent.model, 0, task.cut))
    head = copy.deepcopy(ModelPart(agent.model, tail, n))
    received = state_from("part", msg.tensors)
    # what travels: all of the front and head but a LoRA model's frozen base (it stays here)
    keys = {"front": moving_keys(front, agent.model), "head": moving_keys(head, agent.model)}
    if set(received) != keys["front"] | keys["head"] or len(received) != len(msg.tensors):
        raise CommandError("u_begin: the tensors differ from this model's front and head")
    front.load_state_dict({k: v for k, v in received.items() if k in keys["front"]}, strict=False)
    head.load_state_dict({k: v for k, v in received.items() if k in keys["head"]}, strict=False)
    agent.refusals.pop(c, None)
    agent.aux_losses.pop(c, None)
    seed_torch(derive_seed(f["round_seed"], "device-rng", c))  # dropout masks
    train, data = agent.config.train, agent.data.samples[c]
    role = DeviceRole(task, front, None, train, data, f["round_seed"], agent.runtime)
    agent.roles[c] = DeviceU(role, head, tail, train)
    agent.roles[c].head_flops = _head_flops(f)
    return Message("ack")


def _head_flops(fields: dict) -> float:
    """``head_flops``: the head's per-sample forward+backward FLOPs, sent with an emulated
    profile (0 without one)."""
    v = fields.get("head_flops", 0.0)
    if isinstance(v, bool) or not isinstance(v, int | float) or not 0 <= v < 1e18:
        raise CommandError(f"'u_begin' field head_flops: {str(v)[:40]}")
    return float(v)


def u_forward(agent, c: int, msg: Message) -> Message:
    role = _role(agent, c, "u_forward")
    fx = role.smashed(step_of(msg, role))
    agent.last_batch[c] = int(leaves(fx)[0].shape[0])
    return Message("u_forwarded", {"step": msg.fields["step"]}, pack("fx", fx))


def u_head(agent, c: int, msg: Message) -> Message:
    role = _role(agent, c, "u_head")
    rows = agent.last_batch.get(c)
    got = [(k, t) for k, t in msg.tensors.items() if k == "out" or k.startswith("out.")]
    if not got or len(got) != len(msg.tensors):
        raise CommandError("u_head: no middle output 'out' / 'out.<i>'")
    if "out" in msg.tensors:
        out = msg.tensors["out"]
    else:
        out = tuple(msg.tensors[f"out.{i}"] for i in range(len(got)))  # KeyError: refused
    for t in leaves(out):
        if t.dim() == 0 or t.shape[0] != rows:
            raise CommandError(f"u_head: middle output {tuple(t.shape)} for a batch of {rows}")
        if t.is_floating_point() and not all_finite(t):
            raise CommandError("u_head: non-finite middle output")
    grad, loss_sum, samples = role.head_step(out)
    return Message("u_headed", {"loss_sum": loss_sum, "samples": samples}, pack("grad", grad))


def u_finish(agent, c: int, msg: Message) -> Message:
    role = _role(agent, c, "u_finish")
    state, _ = role.states()
    moving = moving_keys(role.front.part, agent.model) | moving_keys(role.head, agent.model)
    agent.roles.pop(c)
    return Message("u_finished", {}, state_tensors("part", {k: state[k] for k in moving}))


def moving_keys(part, model) -> set[str]:
    """The tensors of ``part`` that travel (:func:`~splitfl.models.base.moving_state`)."""
    return set(moving_state(part, model))


def _front_forward_flops(agent, c: int, profile: Profile) -> float:
    """``u_forward``'s emulated work: the front's forward share of its per-sample FLOPs (the
    profile's, as a split ``forward``'s; its ``backward`` takes the rest)."""
    del agent, c
    return FORWARD_SHARE * profile.flops_per_sample


def _head_step_flops(agent, c: int, profile: Profile) -> float:
    """``u_head``'s emulated work: the head's forward and backward, all of it."""
    del profile
    return agent.roles[c].head_flops


EXTRA_COMMANDS.update(
    u_begin=Command(u_begin, begins=True),
    u_forward=Command(u_forward, flops=_front_forward_flops),
    u_head=Command(u_head, flops=_head_step_flops),
    u_finish=Command(u_finish),
)

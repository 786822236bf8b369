"""U-shaped split learning on a device process: the front, the head, the loss and the labels
stay here (:class:`~splitfl.topologies.ushaped.roles.UDevice`, the in-process executors'
code); the server's side is :mod:`splitfl.net.server.ushaped`. Commands
(:data:`~splitfl.net.device.agent.EXTRA_COMMANDS`):

* ``u_begin`` (task fields as ``begin``'s, ``tail``; ``part.*``: exactly the model's front
  ``[0, cut)`` and head ``[tail, n)`` tensors) → ``ack``;
* ``u_forward`` (step) → ``u_forwarded``: the smashed data ``fx.*`` and nothing else;
* ``u_head`` (the middle's output ``out.*``, finite, the batch's rows) → ``u_headed``: the
  gradient ``grad.*`` of the head's mean loss w.r.t. it, the loss sum and the samples;
* ``backward`` (the front's gradient): the agent's own, on :meth:`DeviceU.pending_output`;
* ``u_finish`` → ``u_finished``: the trained front and head ``part.*``.

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
from splitfl.net.device.agent import EXTRA_COMMANDS, Command, CommandError, _check_begin
from splitfl.net.device.aux_commands import step_of
from splitfl.net.transport.wire import Message, all_finite, state_from, state_tensors
from splitfl.roles.sides import DeviceRole
from splitfl.topologies.ushaped.roles import UDevice


class DeviceU(UDevice):
    """A U-shaped client's device in ``agent.roles`` (module docstring)."""

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
    keys = {"front": set(front.state_dict()), "head": set(head.state_dict())}
    if set(received) != keys["front"] | keys["head"] or len(received) != len(msg.tensors):
        raise CommandError("u_begin: the tensors differ from this model's front and head")
    front.load_state_dict({k: v for k, v in received.items() if k in keys["front"]})
    head.load_state_dict({k: v for k, v in received.items() if k in keys["head"]})
    agent.refusals.pop(c, None)
    agent.aux_losses.pop(c, None)
    seed_torch(derive_seed(f["round_seed"], "device-rng", c))  # dropout masks
    train, data = agent.config.train, agent.data.samples[c]
    role = DeviceRole(task, front, None, train, data, f["round_seed"], agent.runtime)
    agent.roles[c] = DeviceU(role, head, tail, train)
    return Message("ack")


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
    state, _ = _role(agent, c, "u_finish").states()
    agent.roles.pop(c)
    return Message("u_finished", {}, state_tensors("part", state))


EXTRA_COMMANDS.update(
    u_begin=Command(u_begin, begins=True),
    u_forward=Command(u_forward),
    u_head=Command(u_head),
    u_finish=Command(u_finish),
)

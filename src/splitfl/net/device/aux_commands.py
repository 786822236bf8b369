"""A device's auxiliary model in the networked runtime (LocFedMix-SL, CSE-FSL, FSL-SAGE).

The auxiliary model lives on the device: ``begin`` names it (``aux`` field: the model, the
smashed data's per-sample shape, the classes, and how the device updates — ``local``: steps
it on its own loss; ``estimate``: steps the part with its gradient estimate) and carries its
state (``aux.*`` tensors); the device builds it with
:func:`~splitfl.roles.aux_numerics.device_aux`, as the in-process executors do, and the
arithmetic is :class:`~splitfl.roles.sides.DeviceRole`'s. Commands (:class:`AuxCommands`):

* ``aux_step`` (step) → ``aux_done`` (samples): a batch off the upload period — forward and
  auxiliary update on the device, its smashed data never leave it (CSE-FSL/FSL-SAGE's ``h``);
* ``estimate_update`` → no reply: FSL-SAGE's update after an upload (``head_update`` is
  ``local``'s, in :mod:`splitfl.net.device.agent`);
* ``load_aux`` (``aux.*``) → no reply: FSL-SAGE's aligned auxiliary model from the server.

At ``finish`` the device returns what of its auxiliary model the server needs
(:func:`~splitfl.roles.aux_numerics.returned_names`). The server's config names every import
path the device may build an auxiliary model from (``options.<algorithm>.aux_model``); any
other name but a built-in one is refused, as is a state that is not finite or does not fit.
"""

from __future__ import annotations

import torch
from torch import nn

from splitfl.config import ExperimentConfig
from splitfl.core.plan import AUX_LOSSES  # how a device of an auxiliary plan updates
from splitfl.core.topology import AuxSpec
from splitfl.models.aux_heads import AUX_MODELS
from splitfl.net.transport.wire import Message, WireError, all_finite, state_from
from splitfl.roles.aux_numerics import device_aux, returned_names

State = dict[str, torch.Tensor]
#: Most dimensions and largest dimension of the smashed data's per-sample shape.
_MOST_DIMS, _MOST_SIZE = 8, 1 << 24


def allowed_aux_models(config: ExperimentConfig) -> set[str]:
    """The auxiliary models a device builds: the built-ins and what the server's config names
    (``options.<algorithm>.aux_model``: an import path resolved in the device's environment,
    as the config's ``model:``)."""
    named = {o.get("aux_model") for o in config.options.values() if isinstance(o, dict)}
    return set(AUX_MODELS) | {n for n in named if isinstance(n, str)}


def aux_spec(field, config: ExperimentConfig, num_classes: int) -> tuple[AuxSpec, str]:
    """``begin``'s ``aux`` field checked: the :class:`~splitfl.core.plan.AuxSpec` and the update
    mode (one :class:`WireError` naming what is wrong)."""
    if not isinstance(field, dict) or set(field) != {"model", "input_shape", "num_classes", "loss"}:
        raise WireError("begin: 'aux' must name model, input_shape, num_classes and loss")
    model, shape, loss = field["model"], field["input_shape"], field["loss"]
    if not isinstance(model, str) or model not in allowed_aux_models(config):
        raise WireError(f"begin: auxiliary model {str(model)[:60]!r} is not the config's")
    ok = isinstance(shape, list) and 1 <= len(shape) <= _MOST_DIMS
    if not ok or not all(type(d) is int and 1 <= d <= _MOST_SIZE for d in shape):
        raise WireError(f"begin: auxiliary input_shape {str(shape)[:60]}")
    if field["num_classes"] != num_classes or type(field["num_classes"]) is not int:
        raise WireError(f"begin: auxiliary num_classes {str(field['num_classes'])[:20]}")
    if loss not in AUX_LOSSES:
        raise WireError(f"begin: auxiliary loss {str(loss)[:20]!r} not in {AUX_LOSSES}")
    return AuxSpec(model, tuple(shape), num_classes), loss


def step_of(msg: Message, role) -> int:
    """The command's mini-batch index, checked against the task's steps."""
    step = msg.fields.get("step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step < role.task.steps:
        raise WireError(f"step {str(step)[:40]} not in [0, {role.task.steps})")
    return step


def finite_state(state: State, what: str) -> State:
    """``state`` if all its tensors are finite (a :class:`WireError` otherwise)."""
    for name, t in state.items():
        if not all_finite(t):
            raise WireError(f"{what}: {name[:60]} has non-finite values")
    return state


class AuxCommands:
    """The auxiliary-model commands of :class:`~splitfl.net.device.agent.DeviceAgent` (a mixin: it
    uses the agent's ``roles``, ``config``, ``data`` and ``last_batch``)."""

    #: each client's update mode this round (``begin``'s ``aux.loss``)
    aux_losses: dict[int, str]

    def begin_aux(self, c: int, msg: Message) -> nn.Module | None:
        """The auxiliary model ``begin`` sends (None without one); its mode is kept."""
        state = state_from("aux", msg.tensors)
        field = msg.fields.get("aux")
        self.aux_losses.pop(c, None)
        if not state and field is None:
            return None
        spec, loss = aux_spec(field, self.config, self.data.num_classes)
        aux = device_aux(spec, finite_state(state, "begin: auxiliary model"))
        self.aux_losses[c] = loss
        return aux

    def aux_back(self, c: int, aux: State | None) -> State | None:
        """What of the client's auxiliary model goes back at ``finish``."""
        role, loss = self.roles[c], self.aux_losses.pop(c, None)
        if aux is None or loss is None:
            return aux
        keep = returned_names(role.aux, loss)
        return {k: v for k, v in aux.items() if k in keep}

    def _aux_role(self, c: int, command: str, loss: str | None = None):
        role = self.roles[c]
        if role.aux is None or c not in self.aux_losses:
            raise WireError(f"{command!r} without an auxiliary model")
        if loss is not None and self.aux_losses[c] != loss:
            raise WireError(f"{command!r} in a round whose device update is {self.aux_losses[c]}")
        return role

    def _on_aux_step(self, c: int, msg: Message) -> Message:
        role = self._aux_role(c, "aux_step")
        samples = role.aux_step(step_of(msg, role), self.aux_losses[c])
        self.last_batch[c] = samples
        return Message("aux_done", {"samples": samples})

    def _on_estimate_update(self, c: int, msg: Message) -> None:
        role = self._aux_role(c, "estimate_update", "estimate")
        role.pending_output()
        role.estimate_update()

    def _on_load_aux(self, c: int, msg: Message) -> None:
        role = self._aux_role(c, "load_aux")
        state = finite_state(state_from("aux", msg.tensors), "load_aux")
        if set(state) != set(role.aux.state_dict()):
            raise WireError("load_aux: the tensors differ from the auxiliary model's")
        role.load_aux(state)

"""Working copies of model parts, reused across clients and rounds.

A split round trains one copy of a device part per client and one server copy per group.
Deep-copying a part for every client costs several times what loading a state into an
existing copy does (Python objects, hooks, parameter wrappers), and on small models it was the
largest part of the framework's per-round overhead. :class:`PartPool` keeps copies once made
and hands them out again with new weights loaded: a run's result is unchanged, because every
trained state leaves the pool as a clone before its copy is reused.

Weights go in and out of a pooled copy through its :class:`StateView` (the tensors its
``state_dict`` names, found once) rather than ``load_state_dict``/``state_dict``, which walk
every submodule on each call: ~50 µs against ~5 µs for a small CNN, twice per client and
round (issue 39's per-round overhead).
"""

from __future__ import annotations

import copy
import weakref

import torch
from torch import nn
from torch.nn.modules.batchnorm import _NormBase

from splitfl.models import BlockModel, ModelPart
from splitfl.roles.common import local_optimizer

State = dict[str, torch.Tensor]


class PartPool:
    """Free copies of ``[start, stop)`` parts of one working model, by block range."""

    def __init__(self) -> None:
        self._model_id: int | None = None
        self._free: dict[tuple[int, int], list[ModelPart]] = {}
        self._views: dict[int, StateView] = {}  # by id() of a part this pool made
        self._optimizers: dict[int, tuple[tuple, torch.optim.Optimizer]] = {}
        #: the round's global state, set by the executor (None: every read copies)
        self.reference: State | None = None

    def take(self, model: BlockModel, start: int, stop: int, state: State) -> ModelPart:
        """A copy of ``model``'s blocks ``[start, stop)`` holding ``state`` (its own tensors,
        independent of ``model`` and of every other copy handed out)."""
        if self._model_id != id(model):  # another working model: copies of it only
            self._model_id, self._free, self._views = id(model), {}, {}
            self._optimizers = {}
        free = self._free.get((start, stop))
        if free:
            part = free.pop()
        else:
            part = copy.deepcopy(ModelPart(model, start, stop))
            self._views[id(part)] = StateView(part)
        self._views[id(part)].load(state)
        return part

    def optimizer(self, part: ModelPart, lr: float, train) -> torch.optim.Optimizer:
        """``local_optimizer(part, lr, train)`` for a part this pool handed out: the one made
        for it before, its state emptied and its learning rate set — what a new one holds
        (SGD's momentum buffers, Adam's moments and step count start empty; the optimiser
        lives for one client's round, ``training/optim.py``) — else a new one (~40 µs a
        client less inside a run)."""
        key = (train.optimizer, train.momentum, train.weight_decay)
        key += (train.beta1, train.beta2, train.eps)
        kept = self._optimizers.get(id(part))
        if kept is None or kept[0] != key:
            kept = self._optimizers[id(part)] = (key, local_optimizer(part, lr, train))
        optimizer = kept[1]
        optimizer.state.clear()
        for group in optimizer.param_groups:
            group["lr"] = lr
        return optimizer

    def read(self, part: ModelPart) -> State:
        """The state of ``part`` (one this pool handed out) as :func:`cloned` copies, but for
        frozen parameters equal to :attr:`reference`'s (:meth:`StateView.read`)."""
        return self._views[id(part)].read(self.reference)

    def release(self, part: ModelPart) -> None:
        """Give ``part`` back; nothing may use it (or tensors of its ``state_dict``) after."""
        self._free.setdefault((part.start, part.stop), []).append(part)


def cloned(state: State) -> State:
    """``state``'s tensors detached and copied to the CPU (a trained state that outlives its
    part; :func:`~splitfl.roles.common.detached` without aliasing on the CPU)."""
    return {
        k: v.detach().clone() if v.device.type == "cpu" else v.detach().to("cpu")
        for k, v in state.items()
    }


class StateView:
    """The tensors ``module.state_dict()`` names, found once: :meth:`load` copies a state into
    them and :meth:`read` copies them out, as ``load_state_dict`` (strict) and
    :func:`cloned` of ``state_dict()`` do, without walking the submodules on every call. The
    module must keep its parameter and buffer objects (a pool's private copy does; ``.to()``
    replaces buffers). A module whose state is not just its parameters and persistent buffers
    (state-dict hooks, its own ``_save_to_state_dict``/``_load_from_state_dict``, extra state)
    goes through torch's functions every time."""

    def __init__(self, module: nn.Module):
        self.module = module
        self.tensors = module.state_dict(keep_vars=True) if plain_state(module) else None
        self._slots = [  # where each tensor lives: (its module's dict, name, tensor)
            (getattr(m, kind), name, t)
            for m in module.modules()
            for kind in ("_parameters", "_buffers")
            for name, t in getattr(m, kind).items()
        ]

    def current(self) -> bool:
        """Whether every parameter and buffer found at construction is still the module's
        (``.to()`` or an assignment replaces them; a view then needs making again)."""
        return all(where.get(name) is t for where, name, t in self._slots)

    def load(self, state: State) -> None:
        """``module.load_state_dict(state)``: the same copies, the same errors."""
        mine = self.tensors
        if (
            mine is None
            or state.keys() != mine.keys()
            or any(
                not isinstance(state[k], torch.Tensor) or state[k].shape != t.shape
                for k, t in mine.items()
            )
        ):
            self.module.load_state_dict(state)  # torch's checks and messages
            return
        with torch.no_grad():
            for k, t in mine.items():
                t.copy_(state[k])

    def read(self, reference: State | None = None) -> State:
        """``cloned(module.state_dict())``; with ``reference`` (a state nothing writes in
        place: the round's global model), a frozen parameter equal to its tensor there is read
        as that tensor, not a copy (a LoRA model's base: one comparison instead of a copy, and
        aggregation then finds it unchanged by identity)."""
        if self.tensors is None:
            return cloned(self.module.state_dict())
        out = cloned({k: t for k, t in self.tensors.items() if not _same(t, reference, k)})
        return {k: out[k] if k in out else reference[k] for k in self.tensors}


def _same(t: torch.Tensor, reference: State | None, key: str) -> bool:
    """Whether ``t`` is a frozen parameter equal to ``reference[key]`` (same shape, dtype and
    device)."""
    if reference is None or not isinstance(t, nn.Parameter) or t.requires_grad:
        return False
    r = reference.get(key)
    return (
        isinstance(r, torch.Tensor)
        and (r.shape, r.dtype, r.device) == (t.shape, t.dtype, t.device)
        and torch.equal(t, r)
    )


def plain_state(module: nn.Module) -> bool:
    """Whether ``module``'s ``state_dict`` is just its parameters and persistent buffers,
    saved and loaded by ``nn.Module``'s own code (BatchNorm's loader only adds a missing
    ``num_batches_tracked`` of old checkpoints): no hooks, no extra state."""
    base, loaders = nn.Module, (nn.Module._load_from_state_dict, _NormBase._load_from_state_dict)
    for m in module.modules():
        kind = type(m)
        if (
            m._state_dict_hooks
            or m._state_dict_pre_hooks
            or m._load_state_dict_pre_hooks
            or m._load_state_dict_post_hooks
            or kind.state_dict is not base.state_dict
            or kind.load_state_dict is not base.load_state_dict
            or kind._save_to_state_dict is not base._save_to_state_dict
            or kind.get_extra_state is not base.get_extra_state
            or kind._load_from_state_dict not in loaders
        ):
            return False
    return True


#: :func:`load_state`'s views, one per module, dropped with the module.
_VIEWS: weakref.WeakKeyDictionary[nn.Module, StateView] = weakref.WeakKeyDictionary()


def load_state(module: nn.Module, state: State) -> None:
    """``module.load_state_dict(state)`` through a :class:`StateView` kept for ``module`` and
    made again when its parameters or buffers were replaced (a model loaded every round: the
    run's evaluation model)."""
    view = _VIEWS.get(module)
    if view is None or not view.current():
        view = _VIEWS[module] = StateView(module)
    view.load(state)

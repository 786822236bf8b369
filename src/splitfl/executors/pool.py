"""Working copies of model parts, reused across clients and rounds.

A split round trains one copy of a device part per client and one server copy per group.
Deep-copying a part for every client costs several times what loading a state into an
existing copy does (Python objects, hooks, parameter wrappers), and on small models it was the
largest part of the framework's per-round overhead. :class:`PartPool` keeps copies once made
and hands them out again with new weights loaded: a run's result is unchanged, because every
trained state leaves the pool as a clone before its copy is reused.
"""

from __future__ import annotations

import copy

import torch

from splitfl.models import BlockModel, ModelPart

State = dict[str, torch.Tensor]


class PartPool:
    """Free copies of ``[start, stop)`` parts of one working model, by block range."""

    def __init__(self) -> None:
        self._model_id: int | None = None
        self._free: dict[tuple[int, int], list[ModelPart]] = {}

    def take(self, model: BlockModel, start: int, stop: int, state: State) -> ModelPart:
        """A copy of ``model``'s blocks ``[start, stop)`` holding ``state`` (its own tensors,
        independent of ``model`` and of every other copy handed out)."""
        if self._model_id != id(model):  # another working model: copies of it only
            self._model_id, self._free = id(model), {}
        free = self._free.get((start, stop))
        part = free.pop() if free else copy.deepcopy(ModelPart(model, start, stop))
        part.load_state_dict(state)
        return part

    def release(self, part: ModelPart) -> None:
        """Give ``part`` back; nothing may use it (or tensors of its ``state_dict``) after."""
        self._free.setdefault((part.start, part.stop), []).append(part)


def cloned(state: State) -> State:
    """``state``'s tensors detached and copied to the CPU (a trained state that outlives its
    part; :func:`~splitfl.executors.common.detached` without aliasing on the CPU)."""
    return {k: v.detach().to("cpu", copy=True) for k, v in state.items()}

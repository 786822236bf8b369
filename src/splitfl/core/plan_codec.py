"""The round plan as message data: one encoder for the dataclasses of :mod:`splitfl.core.plan`.

A plan crosses processes in two places, and both carry it whole with this module: to
``executor: parallel``'s workers (:mod:`splitfl.executors.channel`: a round's setup is the plan
without its tasks, each unit its tasks) and to a ParallelSFL top worker over the network
(:mod:`splitfl.net.server.clusters`: the hosted group's plan). :func:`encode` turns a plan
object into a JSON
value and named tensors, the fields and tensors of a :mod:`splitfl.core.framing` message (a
strict-JSON header and raw tensor bytes: nothing is ever pickled). The encoding follows each
dataclass's own fields and type hints, recursively:

* a registered dataclass (:data:`PLAN_TYPES`): ``{"@type": its name, field: value, ...}``, every
  field but those whose metadata is :data:`~splitfl.core.plan.NOT_CARRIED` (``RoundPlan.info``,
  the planner's own: the receiver has the default);
* ``int``, ``float``, ``bool``, ``str`` and ``None`` as themselves (a numpy scalar as the Python
  number of the same value), lists and tuples as arrays, ``dict[int, ...]`` as an object keyed by
  the decimal ints;
* a ``torch.Tensor`` as ``{"@tensor": n}`` (the tensor named ``"n"``), a state dict
  (``dict[str, torch.Tensor]``) as ``{"@state": n}`` (its tensors named ``"n/<key>"``).

:func:`decode` reads what another process sent, which may be hostile: it builds only the
registered types, each where a type hint allows it, with every field present, known and of its
declared type; every tensor sent must be referenced exactly once; containers hold at most
:data:`MAX_ITEMS` items, strings at most :data:`MAX_CHARS` characters, ints fit 64 bits and
floats are finite. Anything else is one line of :class:`PlanCodecError`. It checks types, not
meaning: the receiver checks tensors against its model, cuts and groups against its run.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from abc import ABC, abstractmethod
from typing import Any, TypeVar

import numpy as np
import torch

from splitfl.core.plan import Charge, ClientTask, IdleUpload, RoundPlan
from splitfl.core.topology import PAYLOADS, SPECS, DeviceUpdate, Topology

#: The dataclasses a plan is made of, the only types :func:`decode` builds (the registry;
#: ``tests/executors/test_plan_codec.py`` finds every dataclass a :class:`RoundPlan` reaches
#: through its type hints and fails on one missing here). A payload defined outside the tree
#: joins it through :func:`register_plan_type` (:func:`splitfl.topologies.register` calls it).
PLAN_TYPES: list[type] = [RoundPlan, ClientTask, Charge, IdleUpload, *PAYLOADS, *SPECS]
#: Bases a field may be hinted with: it then holds any registered subclass, by its tag.
OPEN_BASES: tuple[type, ...] = (Topology, DeviceUpdate)
#: Most items of one list, tuple or dict (a round's participants are far fewer).
MAX_ITEMS = 1 << 16
#: Longest string (mode names, an auxiliary model's import path).
MAX_CHARS = 1 << 12
TAG, TENSOR, STATE = "@type", "@tensor", "@state"
_INT64 = 1 << 63

_T = TypeVar("_T")
#: A type hint compiled: ``(kind, *arguments)``.
Node = tuple


class PlanCodecError(ValueError):
    """Plan data that is not an encoding of the registered plan types (one line)."""


def _node(hint: Any) -> Node:
    """``hint`` as a :data:`Node`; a hint without an encoding is a TypeError."""
    if hint is type(None):
        return ("none",)
    if hint in (int, float, bool, str):
        return (hint.__name__,)
    if hint is torch.Tensor:
        return ("tensor",)
    if hint in OPEN_BASES:
        return ("open", hint)
    if dataclasses.is_dataclass(hint):
        if hint not in PLAN_TYPES:
            raise TypeError(f"plan codec: dataclass {hint.__name__} is not in PLAN_TYPES")
        return ("class", hint)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return ("union", *(_node(a) for a in args))
    if origin is list:
        return ("list", _node(args[0]))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return ("tuple", _node(args[0]))
    if origin is tuple:
        return ("fixed", *(_node(a) for a in args))
    if origin is dict and args == (str, torch.Tensor):
        return ("state",)
    if origin is dict and args[0] is int:
        return ("intdict", _node(args[1]))
    raise TypeError(f"plan codec: no encoding for the type hint {hint!r}")


@functools.cache
def carried(cls: type) -> dict[str, Node]:
    """The fields of ``cls`` (a :data:`PLAN_TYPES` type) that are carried, name → node; found
    on first use, so a field of an unregistered type fails its test, not every import."""
    hints = typing.get_type_hints(cls)
    out = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            raise TypeError(f"plan codec: {cls.__name__}.{f.name} is not an __init__ field")
        if f.metadata.get("carried", True):
            out[f.name] = _node(hints[f.name])
    return out


#: The registered types by tag.
_BY_TAG: dict[str, type] = {cls.__name__: cls for cls in PLAN_TYPES}


def register_plan_type(cls: type) -> None:
    """Let plans carry ``cls`` (a dataclass; a payload subclasses an :data:`OPEN_BASES` base).
    Its tag is its class name, which must not name another registered type."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"plan codec: {cls.__name__} is not a dataclass")
    known = _BY_TAG.get(cls.__name__)
    if known is cls:
        return
    if known is not None:
        raise TypeError(f"plan codec: the tag {cls.__name__!r} is taken by {known.__module__}")
    PLAN_TYPES.append(cls)
    _BY_TAG[cls.__name__] = cls


def describe(node: Node) -> str:
    """The type a node stands for, as a hint reads."""
    kind, args = node[0], node[1:]
    if kind in ("class", "open"):
        return args[0].__name__
    if kind == "union":
        return " | ".join(describe(a) for a in args)
    if kind in ("list", "tuple"):
        return f"{kind}[{describe(args[0])}{', ...' * (kind == 'tuple')}]"
    if kind == "fixed":
        return f"tuple[{', '.join(describe(a) for a in args)}]"
    if kind == "intdict":
        return f"dict[int, {describe(args[0])}]"
    return {"none": "None", "state": "dict[str, Tensor]", "tensor": "Tensor"}.get(kind, kind)


def _kind(value: Any) -> str:
    """A JSON value's kind, for errors (never the value: it may be hostile)."""
    names = {type(None): "null", dict: "object", list: "array"}
    return names.get(type(value), type(value).__name__)


# -- encoding ----------------------------------------------------------------------------------
def encode(obj: Any) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``obj``, an instance of a :data:`PLAN_TYPES` type, as (JSON value, tensors by name).
    A value its field's hint does not allow is a TypeError (a planner's bug)."""
    if type(obj) not in PLAN_TYPES:
        raise TypeError(f"plan codec: {type(obj).__name__} is not a registered plan type")
    writer = _Writer()
    return writer.step(obj, ("class", type(obj)), type(obj).__name__), writer.tensors


class _Walk(ABC):
    """An encoding or a decoding: :meth:`step` turns one value of a node; a union's arms are
    tried in order (None first where allowed), a failed arm's work undone (:meth:`save`,
    :meth:`restore`), and the last arm's error is the union's (the only arm's, in X | None).
    The two directions are :class:`_Writer` and :class:`_Reader`."""

    failure: type[Exception]

    @abstractmethod
    def step(self, value: Any, node: Node, where: str) -> Any:
        """``value`` turned by ``node`` (``where`` names it in errors)."""

    @abstractmethod
    def save(self) -> Any:
        """What :meth:`restore` needs to undo a failed union arm's work."""

    @abstractmethod
    def restore(self, saved: Any) -> None:
        """Undo the work done since :meth:`save` returned ``saved``."""

    def union(self, value: Any, arms: tuple[Node, ...], where: str) -> Any:
        if value is None and ("none",) in arms:
            return None
        arms = tuple(a for a in arms if a != ("none",))
        for arm in arms[:-1]:
            saved = self.save()
            try:
                return self.step(value, arm, where)
            except self.failure:
                self.restore(saved)
        return self.step(value, arms[-1], where)


class _Writer(_Walk):
    """One encoding: the tensors named so far and the next tensor index."""

    failure = TypeError

    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self.count = 0

    def save(self) -> Any:
        return dict(self.tensors), self.count

    def restore(self, saved: Any) -> None:
        self.tensors, self.count = saved

    def step(self, value: Any, node: Node, where: str) -> Any:
        kind, args = node[0], node[1:]
        if kind == "union":
            return self.union(value, args, where)
        if kind in ("int", "float") and _number(value, kind):
            return value.item() if isinstance(value, np.generic) else value
        if kind == "bool" and isinstance(value, bool | np.bool_):
            return bool(value)
        if (kind == "str" and isinstance(value, str)) or (kind == "none" and value is None):
            return value
        if (kind == "tensor" and isinstance(value, torch.Tensor)) or (
            kind == "state" and _is_state(value)
        ):
            n, self.count = self.count, self.count + 1
            if kind == "tensor":
                self.tensors[str(n)] = value
                return {TENSOR: n}
            self.tensors.update({f"{n}/{k}": v for k, v in value.items()})
            return {STATE: n}
        if kind in ("list", "tuple", "fixed") and isinstance(value, list | tuple):
            if kind != "fixed" or len(value) == len(args):
                return [self.step(v, a, f"{where}[{i}]") for i, v, a in _items(value, node)]
        if kind == "intdict" and isinstance(value, dict) and all(_number(k, "int") for k in value):
            return {str(int(k)): self.step(v, args[0], f"{where}[{k}]") for k, v in value.items()}
        if kind == "open" and isinstance(value, args[0]) and type(value) in PLAN_TYPES:
            kind, args = "class", (type(value),)
        if kind == "class" and type(value) is args[0]:
            out = {TAG: args[0].__name__}
            for name, field_node in carried(args[0]).items():
                out[name] = self.step(getattr(value, name), field_node, f"{where}.{name}")
            return out
        raise TypeError(f"plan codec: {where} is {type(value).__name__}, not {describe(node)}")


def _items(value: list | tuple, node: Node) -> list[tuple[int, Any, Node]]:
    """(position, item, its node) of a list, tuple (one node for all) or fixed tuple."""
    nodes = node[1:] * len(value) if node[0] != "fixed" else node[1:]
    return [(i, v, n) for i, (v, n) in enumerate(zip(value, nodes, strict=True))]


def _number(value: Any, kind: str) -> bool:
    """An int (``kind`` int) or a number (float), numpy's included; never a bool."""
    allowed = (int, np.integer) if kind == "int" else (int, float, np.integer, np.floating)
    return isinstance(value, allowed) and not isinstance(value, bool | np.bool_)


def _is_state(value: Any) -> bool:
    return isinstance(value, dict) and all(
        type(k) is str and isinstance(v, torch.Tensor) for k, v in value.items()
    )


# -- decoding ----------------------------------------------------------------------------------
def decode(value: Any, tensors: dict[str, torch.Tensor], cls: type[_T]) -> _T:
    """The ``cls`` (a :data:`PLAN_TYPES` type) that ``value`` and ``tensors`` encode (see the
    module docstring for what is refused, as :class:`PlanCodecError`)."""
    if cls not in PLAN_TYPES:
        raise TypeError(f"plan codec: {cls.__name__} is not a registered plan type")
    reader = _Reader(tensors)
    out = reader.step(value, ("class", cls), cls.__name__)
    unused = sorted((reader.bare.keys() | reader.states.keys()) - reader.used)
    if unused:
        raise PlanCodecError(f"{cls.__name__}: tensors {unused[:3]} are not referenced")
    return out


def _index(text: str) -> int | None:
    """A non-negative decimal integer as written by :func:`encode` (at most 18 digits: it fits
    64 bits), else None."""
    ok = text.isascii() and text.isdigit() and len(text) <= 18 and str(int(text)) == text
    return int(text) if ok else None


class _Reader(_Walk):
    """One decoding: the tensors sent, grouped by index, and the indices referenced so far."""

    failure = PlanCodecError

    def __init__(self, tensors: dict[str, torch.Tensor]):
        self.bare: dict[int, torch.Tensor] = {}
        self.states: dict[int, dict[str, torch.Tensor]] = {}
        self.used: set[int] = set()
        for name, t in tensors.items():
            head, sep, key = name.partition("/")
            n = _index(head)
            if n is None or (sep and not key) or (n in self.bare if sep else n in self.states):
                raise PlanCodecError(f"bad plan tensor name {name[:40]!r}")
            if sep:
                self.states.setdefault(n, {})[key] = t
            else:
                self.bare[n] = t

    def save(self) -> Any:
        return set(self.used)

    def restore(self, saved: Any) -> None:
        self.used = saved

    def step(self, value: Any, node: Node, where: str) -> Any:
        kind, args = node[0], node[1:]
        if kind == "union":
            return self.union(value, args, where)
        if kind in ("class", "open"):
            return self._object(value, args[0], where, open_=kind == "open")
        if kind in ("tensor", "state"):
            return self._tensors(value, kind, where)
        if kind in ("list", "tuple", "fixed") and type(value) is list:
            if len(value) > MAX_ITEMS or (kind == "fixed" and len(value) != len(args)):
                raise PlanCodecError(f"{where}: {len(value)} items for {describe(node)}")
            out = [self.step(v, a, f"{where}[{i}]") for i, v, a in _items(value, node)]
            return out if kind == "list" else tuple(out)
        if kind == "intdict" and type(value) is dict:
            if len(value) > MAX_ITEMS:
                raise PlanCodecError(f"{where}: {len(value)} items, at most {MAX_ITEMS}")
            keys = {k: _int_key(k, where) for k in value}
            return {keys[k]: self.step(v, args[0], f"{where}[{keys[k]}]") for k, v in value.items()}
        if _scalar(value, kind):
            return value
        raise PlanCodecError(f"{where}: expected {describe(node)}, got {_kind(value)}")

    def _object(self, value: Any, cls: type, where: str, open_: bool = False) -> Any:
        if type(value) is not dict:
            raise PlanCodecError(f"{where}: expected {cls.__name__}, got {_kind(value)}")
        if type(value.get(TAG)) is not str:
            raise PlanCodecError(f"{where}: no type tag {TAG!r} (expected {cls.__name__})")
        tag = value[TAG]
        if tag not in _BY_TAG:
            raise PlanCodecError(f"{where}: unknown type tag {tag[:40]!r}")
        if open_ and issubclass(_BY_TAG[tag], cls):
            cls = _BY_TAG[tag]
        if _BY_TAG[tag] is not cls:
            raise PlanCodecError(f"{where}: expected {cls.__name__}, got {tag}")
        fields, sent = carried(cls), value.keys() - {TAG}
        extra, missing = sorted(sent - fields.keys()), sorted(fields.keys() - sent)
        if extra:
            raise PlanCodecError(f"{where}: unknown fields {[str(k)[:40] for k in extra[:3]]}")
        if missing:
            raise PlanCodecError(f"{where}: missing fields {missing[:3]}")
        kwargs = {k: self.step(value[k], n, f"{where}.{k}") for k, n in fields.items()}
        try:
            return cls(**kwargs)
        except (TypeError, ValueError) as err:  # a check of the class's own (__post_init__)
            raise PlanCodecError(f"{where}: {str(err).splitlines()[0][:200]}") from None

    def _tensors(self, value: Any, kind: str, where: str) -> Any:
        key = TENSOR if kind == "tensor" else STATE
        n = value.get(key) if type(value) is dict and len(value) == 1 else None
        if type(n) is not int or n < 0:
            raise PlanCodecError(f"{where}: expected {{{key!r}: index}}, got {_kind(value)}")
        if n in self.used:
            raise PlanCodecError(f"{where}: tensor index {n} referenced twice")
        if kind == "tensor" and n not in self.bare:
            raise PlanCodecError(f"{where}: tensor {n} was not sent")
        if kind == "state" and n in self.bare:
            raise PlanCodecError(f"{where}: tensor {n} is not a state dict")
        self.used.add(n)
        return self.bare[n] if kind == "tensor" else dict(self.states.get(n, {}))


def _int_key(key: str, where: str) -> int:
    n = _index(key.removeprefix("-"))
    if n is None or key == "-0":
        raise PlanCodecError(f"{where}: key {key[:20]!r} is not an int")
    return -n if key.startswith("-") else n


def _scalar(value: Any, kind: str) -> bool:
    """``value`` (JSON) is a valid ``kind``: an int of 64 bits; for a float, a finite number
    (an int too: a float field may hold one, as a Python one may); a bool; a string of at most
    :data:`MAX_CHARS`; null."""
    if kind == "int":
        return type(value) is int and -_INT64 <= value < _INT64
    if kind == "float":
        return _scalar(value, "int") or (type(value) is float and math.isfinite(value))
    if kind == "str":
        return type(value) is str and len(value) <= MAX_CHARS
    return (kind == "bool" and type(value) is bool) or (kind == "none" and value is None)

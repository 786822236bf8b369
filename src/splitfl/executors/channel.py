"""The messages between ``executor: parallel``'s driver and its workers, without pickle.

Every message is a :mod:`splitfl.core.framing` message, as on the network wire: a strict-JSON
header and raw tensor bytes; nothing is unpickled and the sizes must add up exactly. Each kind
has a builder and a reader. A reader checks every field's type and every tensor's name, shape
and dtype against what the receiver expects; anything else — a truncated message, a pickle, a
wrong shape, a missing field — is a one-line :class:`ChannelError`, raised before any of it is
used.

Driver → worker (the message type is the operation):

* ``init`` — the run's config (``config.to_dict()``): the worker builds ``config.model`` for
  the data's input shape and classes in the driver's dtype and checks its architecture
  against the driver's model (:class:`Init`); where and how to train; the training batches'
  augmentation (``data.transforms``);
* ``data`` — clients' samples ``(x, y)``;
* ``setup`` — a round: the global model and the plan without its tasks;
* ``unit`` — one group: its tasks (with ``init_state`` where a task has one) and aux heads.

The plan and its tasks travel whole, in the one encoding of the plan's dataclasses
(:mod:`splitfl.core.plan_codec`: a type tag and every field, checked against the dataclasses'
own type hints when read).

Worker → driver: ``ok`` (``pid`` after ``init``), ``trained`` (a unit's updates, its server
copy's state and the seconds it took) or ``error`` (the exception's type, message and
traceback); each carries the worker's ``peak_rss``.

Over 400 lines as one concept: the channel's message format, each builder next to the reader
that checks it, so that what is sent and what is accepted are read side by side.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from splitfl.config import ExperimentConfig, from_dict
from splitfl.core import plan_codec
from splitfl.core.framing import DTYPES, Frame, Message, WireError, decode, encode, state_tensors
from splitfl.core.plan import ClientTask, ClientUpdate, RoundPlan
from splitfl.core.plan_codec import PlanCodecError
from splitfl.core.topology import Ring
from splitfl.data.transforms import Transforms
from splitfl.models import block_index
from splitfl.roles.fleet import GroupRun, State

#: What a state's tensors must be: name → (shape, dtype).
Specs = dict[str, tuple[tuple[int, ...], torch.dtype]]
#: Message types each side accepts.
OPERATIONS = ("init", "data", "setup", "unit")
ANSWERS = ("ok", "trained", "error")
UPDATE_FIELDS = {"client": "int", "cut": "int", "group": "int", "samples": "int",
                 "steps": "int", "loss_sum": "number", "aux": "bool"}  # fmt: skip


class ChannelError(ValueError):
    """A message of the parallel channel that is malformed or not what was expected."""


_KINDS = {
    "int": lambda v: type(v) is int,
    "number": lambda v: type(v) in (int, float),
    "bool": lambda v: type(v) is bool,
    "str": lambda v: type(v) is str,
    "ints": lambda v: type(v) is list and all(type(i) is int for i in v),
    "list": lambda v: type(v) is list,
    "dict": lambda v: type(v) is dict,
}


def field(fields: dict[str, Any], name: str, kind: str, where: str) -> Any:
    """``fields[name]``, which must be of ``kind`` (a key of ``_KINDS``; ``kind?``: or null)."""
    value = fields.get(name)
    if value is None and kind.endswith("?"):
        return None
    if not _KINDS[kind.rstrip("?")](value):
        raise ChannelError(f"{where}: field {name!r} must be {kind}, got {type(value).__name__}")
    return value


def plain(obj: Any, kinds: dict[str, str]) -> dict[str, Any]:
    """The fields ``kinds`` of ``obj`` as JSON values: a numpy scalar (an id or a rate drawn
    with numpy) as the Python number of the same value."""
    out = {}
    for name in kinds:
        value = getattr(obj, name)
        if isinstance(value, list | tuple):
            value = [v.item() if isinstance(v, np.generic) else v for v in value]
        out[name] = value.item() if isinstance(value, np.generic) else value
    return out


def checked_fields(fields: dict[str, Any], kinds: dict[str, str], where: str) -> dict[str, Any]:
    """Every field of ``kinds`` from ``fields``, each of its kind."""
    return {name: field(fields, name, kind, where) for name, kind in kinds.items()}


def specs_of(state: State) -> Specs:
    return {k: (tuple(v.shape), v.dtype) for k, v in state.items()}


def check_like(state: State, specs: Specs, where: str) -> State:
    """``state``, whose tensors must have exactly the names, shapes and dtypes of ``specs``."""
    if state.keys() != specs.keys():
        missing, extra = sorted(specs.keys() - state.keys()), sorted(state.keys() - specs.keys())
        raise ChannelError(f"{where}: tensors differ (missing {missing[:3]}, extra {extra[:3]})")
    for name, (shape, dtype) in specs.items():
        t = state[name]
        if tuple(t.shape) != shape or t.dtype != dtype:
            got = f"{list(t.shape)} {t.dtype}"
            raise ChannelError(f"{where}: {name} is {got}, expected {list(shape)} {dtype}")
    return state


def read(blob: bytes | bytearray, kinds: tuple[str, ...]) -> Message:
    """A framing message of one of ``kinds`` (its tensors views of ``blob`` if writable)."""
    try:
        msg = decode(blob)
    except WireError as err:
        raise ChannelError(f"malformed parallel message: {err}") from None
    if msg.type not in kinds:
        raise ChannelError(f"unexpected parallel message {msg.type[:40]!r}; expected {kinds}")
    return msg


def groups(msg: Message) -> dict[str, State]:
    """The message's tensors by prefix (``prefix/name``)."""
    out: dict[str, State] = {}
    for name, t in msg.tensors.items():
        prefix, sep, key = name.partition("/")
        if not sep:
            raise ChannelError(f"{msg.type}: tensor {name[:40]!r} has no prefix")
        out.setdefault(prefix, {})[key] = t
    return out


def no_more(left: dict[str, State], where: str) -> None:
    if left:
        raise ChannelError(f"{where}: unexpected tensors {sorted(left)[:3]}")


def _send(kind: str, fields: dict[str, Any], tensors: dict[str, torch.Tensor]) -> Frame:
    try:
        return encode(Message(kind, fields, tensors))
    except WireError as err:
        raise ChannelError(f"cannot send {kind}: {err}") from None


# -- driver → worker ---------------------------------------------------------------------------
@dataclass
class Init:
    """What a worker is told once: the run's config, the data's input shape and classes, the
    model's dtype and architecture (``repr``), where and how to train."""

    config: ExperimentConfig
    input_shape: tuple[int, ...]
    num_classes: int
    dtype: torch.dtype
    architecture: str
    device: str
    precision: str
    channels_last: bool
    threads: int
    augment: Transforms | None


INIT_FIELDS = {"config": "dict", "input_shape": "ints", "num_classes": "int", "dtype": "str",
               "architecture": "str", "device": "str", "precision": "str",
               "channels_last": "bool", "threads": "int", "augment": "dict?"}  # fmt: skip


def init_message(init: Init) -> Frame:
    fields = {f.name: getattr(init, f.name) for f in dataclasses.fields(init)}
    fields["config"] = init.config.to_dict()
    fields["input_shape"] = list(init.input_shape)
    fields["dtype"] = str(init.dtype).removeprefix("torch.")
    fields["augment"] = None if init.augment is None else dataclasses.asdict(init.augment)
    return _send("init", fields, {})


def read_init(msg: Message) -> Init:
    f = checked_fields(msg.fields, INIT_FIELDS, "init")
    if f["dtype"] not in DTYPES or not DTYPES[f["dtype"]].is_floating_point:
        raise ChannelError(f"init: dtype {f['dtype'][:20]!r} is not a floating-point dtype")
    if f["threads"] < 1 or f["num_classes"] < 1 or min(f["input_shape"], default=0) < 1:
        raise ChannelError("init: threads, num_classes and input_shape must be positive")
    no_more(groups(msg), "init")
    return Init(
        config=from_dict(ExperimentConfig, f["config"]),
        input_shape=tuple(f["input_shape"]),
        num_classes=f["num_classes"],
        dtype=DTYPES[f["dtype"]],
        architecture=f["architecture"],
        device=f["device"],
        precision=f["precision"],
        channels_last=f["channels_last"],
        threads=f["threads"],
        augment=None if f["augment"] is None else _transforms(f["augment"]),
    )


def _transforms(d: dict[str, Any]) -> Transforms:
    """``data.transforms`` as parsed (:class:`~splitfl.data.transforms.Transforms`)."""
    kinds = {"augment": "list", "mean": "list?", "std": "list?", "crop_first": "bool",
             "pad_value": "list?"}  # fmt: skip
    f = checked_fields(d, kinds, "init.augment")
    ops = f["augment"]
    if not all(type(o) is list and len(o) == 2 and type(o[0]) is str for o in ops):
        raise ChannelError("init.augment: field 'augment' must be [name, value] pairs")
    for name in ("augment", "mean", "std", "pad_value"):
        values = [o[1] for o in ops] if name == "augment" else f[name] or []
        if not all(type(v) in (int, float) for v in values):
            raise ChannelError(f"init.augment: field {name!r} must hold numbers")
    tup = lambda v: None if v is None else tuple(v)  # noqa: E731
    return Transforms(
        augment=tuple((o[0], o[1]) for o in ops),
        mean=tup(f["mean"]),
        std=tup(f["std"]),
        crop_first=f["crop_first"],
        pad_value=tup(f["pad_value"]),
    )


def data_message(partitions: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> Frame:
    """Clients' samples ``(x, y)``: ``x/<client>``, ``y/<client>``."""
    tensors = {}
    for c, (x, y) in partitions.items():
        tensors[f"x/{c}"], tensors[f"y/{c}"] = x, y
    return _send("data", {"clients": [int(c) for c in partitions]}, tensors)


def read_data(
    msg: Message, input_shape: tuple[int, ...]
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """The clients' samples; each ``x`` of shape ``[n, *input_shape]``, ``y`` ``[n, ...]``."""
    clients = field(msg.fields, "clients", "ints", "data")
    by = groups(msg)
    xs, ys = by.pop("x", {}), by.pop("y", {})
    no_more(by, "data")
    if set(xs) != {str(c) for c in clients} or set(ys) != set(xs):
        raise ChannelError("data: tensors do not match the clients listed")
    out = {}
    for c in clients:
        x, y = xs[str(c)], ys[str(c)]
        if tuple(x.shape[1:]) != tuple(input_shape) or y.dim() < 1 or len(y) != len(x):
            raise ChannelError(f"data: client {c}: x {list(x.shape)}, y {list(y.shape)}")
        out[c] = (x, y)
    return out


def setup_message(global_state: State, plan: RoundPlan, round_seed: int) -> Frame:
    """A round: the global model (``global/…``), the plan without its tasks (``plan``, its
    tensors ``plan/…``: :func:`~splitfl.core.plan_codec.encode`), the round seed."""
    if isinstance(plan.topology, Ring):
        raise ChannelError("a ring round is one coupled unit, never dealt")
    value, tensors = plan_codec.encode(dataclasses.replace(plan, tasks=[]))
    tensors = state_tensors("global", global_state) | state_tensors("plan", tensors)
    return _send("setup", {"plan": value, "round_seed": round_seed}, tensors)


def read_setup(msg: Message, specs: Specs) -> tuple[State, RoundPlan, int]:
    """The global state (checked against the worker's model), the plan (no tasks, no ring),
    the seed."""
    seed = field(msg.fields, "round_seed", "int", "setup")
    by = groups(msg)
    plan = plan_data(msg.fields.get("plan"), by.pop("plan", {}), RoundPlan, "setup.plan")
    if plan.tasks or isinstance(plan.topology, Ring):
        raise ChannelError(
            "setup.plan: has tasks or a ring (units carry the tasks; a ring is never dealt)"
        )
    state = check_like(by.pop("global", {}), specs, "setup: global model")
    no_more(by, "setup")
    return state, plan, seed


def plan_data(value: Any, tensors: State, cls: type, where: str) -> Any:
    """The ``cls`` that ``value`` and ``tensors`` encode (:mod:`splitfl.core.plan_codec`)."""
    try:
        return plan_codec.decode(value, tensors, cls)
    except PlanCodecError as err:
        raise ChannelError(f"{where}: {err}") from None


def unit_message(run: GroupRun, record: tuple[int, list[int]] | None = None) -> Frame:
    """One group: its tasks (``tasks``; a task's tensors, its ``init_state`` where it starts
    from its own state, ``task:<i>/…``) and its members' aux heads (``aux:<i>/…``), ``i`` the
    task's position; ``record``: (batches, clients) whose received tensors the worker sends
    back (``privacy.record``), None: nothing."""
    tasks, tensors = [], {}
    for i, t in enumerate(run.tasks):
        value, own = plan_codec.encode(t)
        tasks.append(value)
        tensors |= state_tensors(f"task:{i}", own)
        tensors |= state_tensors(f"aux:{i}", run.aux.get(t.client))
    fields = {"group": run.group, "tasks": tasks, "aux": [t.client in run.aux for t in run.tasks]}
    fields["record"] = None if record is None else [record[0], list(record[1])]
    return _send("unit", fields, tensors)


def read_unit_record(msg: Message) -> tuple[int, list[int]] | None:
    """A unit's ``record`` (:func:`unit_message`): (batches, clients), or None."""
    value = msg.fields.get("record")
    if value is None:
        return None
    ok = type(value) is list and len(value) == 2 and type(value[0]) is int
    if not ok or type(value[1]) is not list or any(type(c) is not int for c in value[1]):
        raise ChannelError("unit: 'record' must be [batches, [clients]]")
    return value[0], value[1]


def read_unit(
    msg: Message, specs: Specs, num_classes: int
) -> tuple[int, list[ClientTask], dict[int, State]]:
    """A unit: its group, tasks (an ``init_state`` checked against the model's blocks below
    the task's cut) and aux heads (a linear classifier for ``num_classes`` classes)."""
    group = field(msg.fields, "group", "int", "unit")
    rows, auxes = (field(msg.fields, k, "list", "unit") for k in ("tasks", "aux"))
    if not rows or len(rows) != len(auxes):
        raise ChannelError("unit: 'tasks' and 'aux' must be lists of one length")
    num_blocks = 1 + max(block_index(k) for k in specs)
    by, tasks, aux = groups(msg), [], {}
    for i, row in enumerate(rows):
        where = f"unit: task {i}"
        t = plan_data(row, by.pop(f"task:{i}", {}), ClientTask, where)
        if not 1 <= t.cut <= num_blocks or t.group != group or min(t.batch_size, t.steps) < 0:
            raise ChannelError(f"{where}: cut {t.cut}, group {t.group}, batch or steps invalid")
        if t.init_state:  # an empty one starts from the global model, as None (StartParts)
            below = {k: s for k, s in specs.items() if block_index(k) < t.cut}
            check_like(t.init_state, below, f"{where} init_state")
        if auxes[i] is True:
            aux[t.client] = check_aux(by.pop(f"aux:{i}", {}), num_classes, specs, where)
        tasks.append(t)
    no_more(by, "unit")
    return group, tasks, aux


def check_aux(state: State, num_classes: int, specs: Specs, where: str) -> State:
    """An aux head's state (:func:`~splitfl.roles.common.aux_head`: a linear layer from
    the activation's elements to ``num_classes``, in the model's dtype)."""
    dtype = next(iter(specs.values()))[1]
    w = state.get("1.weight", torch.empty(0))
    if w.dim() != 2 or w.shape[0] != num_classes or w.shape[1] < 1:
        raise ChannelError(f"{where} aux head: weight {list(w.shape)}, {num_classes} classes")
    return check_like(state, {"1.weight": (tuple(w.shape), dtype),
                              "1.bias": ((num_classes,), dtype)}, f"{where} aux head")  # fmt: skip


# -- worker → driver ---------------------------------------------------------------------------
def ok_answer(peak_rss: int, **fields: Any) -> Frame:
    return _send("ok", {**fields, "peak_rss": peak_rss}, {})


def error_answer(err: BaseException, trace: str, peak_rss: int) -> Frame:
    fields = {"type": type(err).__name__, "message": str(err), "traceback": trace}
    return _send("error", {**fields, "peak_rss": peak_rss}, {})


def trained_answer(
    updates: list[ClientUpdate],
    server_state: State | None,
    seconds: float,
    peak_rss: int,
    recorded: list | None = None,
) -> Frame:
    """A unit's updates (``part:<i>/…``, ``aux:<i>/…``), server copy (``server/…``) and
    the tensors its loops received for the record (``recorded``: a
    :class:`~splitfl.roles.cut_record.RelayTap`'s items, ``rec:<j>/<i>``)."""
    rows, tensors = [], {}
    for j, (_, _, _, parts) in enumerate(recorded or []):
        tensors |= {f"rec:{j}/{i}": t for i, t in enumerate(parts)}
    for i, u in enumerate(updates):
        kinds = {k: v for k, v in UPDATE_FIELDS.items() if k != "aux"}
        rows.append({**plain(u, kinds), "aux": u.aux_state is not None})
        tensors |= state_tensors(f"part:{i}", u.state) | state_tensors(f"aux:{i}", u.aux_state)
    tensors |= state_tensors("server", server_state)
    fields = {"updates": rows, "server": server_state is not None, "seconds": seconds}
    fields["recorded"] = [[kind, c, step, len(parts)] for kind, c, step, parts in recorded or []]
    return _send("trained", {**fields, "peak_rss": peak_rss}, tensors)


def read_recorded(msg: Message, run: GroupRun) -> list[tuple[str, int, int, Any]]:
    """A ``trained`` answer's recorded tensors: (kind, client, step, one tensor or a tuple),
    each of a client of ``run``."""
    rows, by, out = msg.fields.get("recorded") or [], groups(msg), []
    members = {t.client for t in run.tasks}
    for j, row in enumerate(rows if type(rows) is list else [None]):
        ok = type(row) is list and len(row) == 4 and row[0] in ("smashed", "head_gradient")
        if not ok or any(type(v) is not int for v in row[1:]) or row[1] not in members:
            raise ChannelError(f"trained: recorded entry {j} is not [kind, member, step, n]")
        parts = [by.get(f"rec:{j}", {}).get(str(i)) for i in range(row[3])]
        if not parts or any(p is None for p in parts):
            raise ChannelError(f"trained: recorded entry {j} lacks its tensors")
        out.append((row[0], row[1], row[2], parts[0] if len(parts) == 1 else tuple(parts)))
    return out


def read_error(msg: Message) -> tuple[str, str, str]:
    """An error answer's exception type, message and traceback."""
    return tuple(field(msg.fields, k, "str", "error") for k in ("type", "message", "traceback"))


def read_trained(
    msg: Message, run: GroupRun, specs: Specs, server_blocks: tuple[int, int] | None
) -> tuple[list[ClientUpdate], State | None, float]:
    """A unit's answer, checked against the unit: one update per task in task order, each
    part shaped as the part it started from, an aux head as sent, the server copy as the
    global model's blocks ``server_blocks`` (the unit's family says which:
    :meth:`~splitfl.topologies.base.Family.server_blocks`; None: no server copy)."""
    rows = field(msg.fields, "updates", "list", "trained")
    seconds = field(msg.fields, "seconds", "number", "trained")
    if len(rows) != len(run.tasks):
        raise ChannelError(f"trained: {len(rows)} updates for {len(run.tasks)} tasks")
    by = {k: v for k, v in groups(msg).items() if not k.startswith("rec:")}  # read_recorded
    updates = []
    for i, (row, t) in enumerate(zip(rows, run.tasks, strict=True)):
        where = f"trained: update {i}"
        f = checked_fields(row if type(row) is dict else {}, UPDATE_FIELDS, where)
        same = (f["client"], f["cut"], f["group"], f["steps"])
        if same != (t.client, t.cut, run.group, t.steps) or f["samples"] < 0:
            raise ChannelError(f"{where}: client/cut/group/steps differ from the task's")
        if f.pop("aux") != (t.client in run.aux):
            raise ChannelError(f"{where}: aux head {'not ' * (t.client in run.aux)}expected")
        part = check_like(by.pop(f"part:{i}", {}), specs_of(run.parts[t.client]), where)
        aux = None
        if t.client in run.aux:
            aux = check_like(by.pop(f"aux:{i}", {}), specs_of(run.aux[t.client]), where)
        updates.append(ClientUpdate(**f, state=part, aux_state=aux))
    if field(msg.fields, "server", "bool", "trained") != (server_blocks is not None):
        expected = "expected" if server_blocks is not None else "unexpected"
        raise ChannelError(f"trained: a server copy {expected}")
    server = None
    if server_blocks is not None:
        lo, hi = server_blocks
        held = {k: s for k, s in specs.items() if lo <= block_index(k) < hi}
        server = check_like(by.pop("server", {}), held, "trained: server copy")
    no_more(by, "trained")
    return updates, server, seconds


def peak_rss_of(msg: Message) -> int:
    return field(msg.fields, "peak_rss", "int", msg.type)

"""The round plan's one encoding (:mod:`splitfl.core.plan_codec`): every payload dataclass a
:class:`RoundPlan` reaches is registered and round-trips exactly through a framing message;
real plans of every registered algorithm round-trip and train; hostile input is one line."""

import ast
import dataclasses
import math
import types
import typing

import numpy as np
import pytest
import torch

import splitfl.core.plan_codec as codec_module
from splitfl.algorithms import ALGORITHMS
from splitfl.core.framing import Message, WireError, decode, encode
from splitfl.core.plan import ClientTask, RoundPlan
from splitfl.core.plan_codec import MAX_CHARS, MAX_ITEMS, OPEN_BASES, PLAN_TYPES, PlanCodecError
from splitfl.core.plan_codec import decode as plan_decode
from splitfl.core.plan_codec import encode as plan_encode
from splitfl.core.topology import Clusters, Ring, RingSpec, ServerSpec, Star, Turns
from splitfl.experiment import loop
from splitfl.experiment.runner import run
from splitfl.testing import config_for


def _reachable(root: type) -> list[type]:
    """Every dataclass reachable from ``root`` through its fields' type hints (all fields,
    carried or not; a field hinted with an open base, :data:`OPEN_BASES`, reaches every
    registered subclass), in the order found."""
    found, todo = [], [root]
    while todo:
        cls = todo.pop(0)
        if cls in found:
            continue
        found.append(cls)
        hints = list(typing.get_type_hints(cls).values())
        while hints:
            hint = hints.pop()
            if dataclasses.is_dataclass(hint):
                todo.append(hint)
            if hint in OPEN_BASES:
                todo.extend(_payloads(hint))
            hints.extend(a for a in typing.get_args(hint) if a is not Ellipsis)
    return found


def _payloads(base: type) -> list[type]:
    return [c for c in PLAN_TYPES if issubclass(c, base)]


REACHABLE = _reachable(RoundPlan)
#: Values for fields a payload checks on construction (a sample must be a valid payload, and
#: unlike the field's default so that a field lost in transit shows).
CHOICES = {
    "group_loss": "sum",
    "device_grad": "own",
    "forward": "concat",
    "mode": "sequential",
    "upload_every": 4,
    "upload_phase": 3,
    "pipeline": "schedule",
}


def test_every_dataclass_a_plan_reaches_is_registered():
    assert len(REACHABLE) >= 5  # RoundPlan, ClientTask, RingSpec, AuxSpec, AlignSpec at least
    reachable = _reachable(RoundPlan)  # now: a test may have registered a payload of its own
    missing = [c.__name__ for c in reachable if c not in PLAN_TYPES]
    assert missing == [], f"reachable from RoundPlan but not in plan_codec.PLAN_TYPES: {missing}"
    assert [c for c in PLAN_TYPES if c not in reachable] == []


def test_only_the_planners_own_info_stays_behind():
    left = [f"{c.__name__}.{f.name}" for c in PLAN_TYPES for f in dataclasses.fields(c)
            if not f.metadata.get("carried", True)]  # fmt: skip
    assert left == ["RoundPlan.info", "RoundPlan.control"]


# ------------------------------------------------------------------ one sample of each type
def _sample(hint, name: str, default, arm: int | None):
    """A value of ``hint`` unlike ``default`` (so a field lost in transit shows); ``arm``
    picks among a union's non-None arms (None: None wherever a hint allows it)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if name in CHOICES:
        return CHOICES[name]
    if dataclasses.is_dataclass(hint):
        return _instance(hint, arm)
    if hint in OPEN_BASES:
        kinds = _payloads(hint)
        return _instance(kinds[(arm or 0) % len(kinds)], arm)
    if origin in (typing.Union, types.UnionType):
        if arm is None and type(None) in args:
            return None
        arms = [a for a in args if a is not type(None)]
        return _sample(arms[(arm or 0) % len(arms)], name, None, arm)
    if hint is bool:
        return not default if isinstance(default, bool) else True
    if hint is int:
        return 7 + len(name)
    if hint is float:
        return 0.375 + len(name)
    if hint is str:
        return f"sample-{name}"
    if hint is torch.Tensor:
        return torch.arange(6, dtype=torch.float64).reshape(2, 3) + len(name)
    if origin is dict and args == (str, torch.Tensor):
        return {"blocks.0.weight": torch.randn(3, 2), "blocks.0.count": torch.tensor([4, 5])}
    if origin is dict:
        return {3: _sample(args[1], name, None, arm), -1: _sample(args[1], name, None, _next(arm))}
    if origin is list:
        return [_sample(args[0], name, None, arm), _sample(args[0], name + "x", None, _next(arm))]
    if origin is tuple and args[-1] is Ellipsis:
        return (_sample(args[0], name, None, arm), _sample(args[0], name + "y", None, _next(arm)))
    if origin is tuple:
        return tuple(_sample(a, f"{name}{i}", None, arm) for i, a in enumerate(args))
    raise AssertionError(f"no sample for {hint!r}: teach _sample the new kind of field")


def _next(arm: int | None) -> int | None:
    return None if arm is None else arm + 1


def _instance(cls: type, arm: int | None = 0):
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        if f.metadata.get("carried", True):  # the others keep their default
            default = f.default if f.default is not dataclasses.MISSING else None
            values[f.name] = _sample(hints[f.name], f.name, default, arm)
    return cls(**values)


def _same(a, b, where: str = "") -> None:
    """``b`` is ``a``, exactly: the same types all through, equal tensors of the same dtype;
    a field not carried (``NOT_CARRIED``) has its default in ``b``."""
    if isinstance(a, np.generic):  # a planner's numpy scalar: the Python number of its value
        a = a.item()
    assert type(a) is type(b), f"{where}: {type(a).__name__} became {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and torch.equal(a, b), where
    elif dataclasses.is_dataclass(a):
        for f in dataclasses.fields(a):
            if f.metadata.get("carried", True):
                _same(getattr(a, f.name), getattr(b, f.name), f"{where}.{f.name}")
            else:
                assert getattr(b, f.name) == _default(f), f"{where}.{f.name} was carried"
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{where}: keys {list(a)} became {list(b)}"
        assert [type(k) for k in a] == [type(k) for k in b], where
        for k in a:
            _same(a[k], b[k], f"{where}[{k}]")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} became {b!r}"


def _default(f: dataclasses.Field):
    return f.default if f.default_factory is dataclasses.MISSING else f.default_factory()


def _through_a_message(obj, cls: type):
    """``obj`` encoded, framed, sent as bytes and read back (as the channel and wire do)."""
    value, tensors = plan_encode(obj)
    msg = decode(bytes(encode(Message("plan", {"plan": value}, tensors)).tobytes()))
    return plan_decode(msg.fields["plan"], msg.tensors, cls)


@pytest.mark.parametrize("arm", [0, 1, None])
@pytest.mark.parametrize("cls", REACHABLE, ids=lambda c: c.__name__)
def test_every_payload_type_round_trips_exactly(cls, arm):
    sent = _instance(cls, arm)
    if cls is RoundPlan:
        sent.info = {"logged": 1}  # the planner's own: not carried
    got = _through_a_message(sent, cls)
    _same(sent, got, cls.__name__)
    if cls is RoundPlan:
        assert got.info == {}


def test_numpy_scalars_cross_as_the_python_numbers_of_their_values():
    ring = RingSpec([np.int64(2), np.int32(0)], {np.int64(2): np.int64(3)}, {2: np.float32(0.5)})
    task = ClientTask(np.int64(4), 2, lr=np.float64(0.1), upload_model=np.bool_(False))
    got = _through_a_message(RoundPlan([task], topology=Ring(spec=ring)), RoundPlan)
    _same(RoundPlan([ClientTask(4, 2, lr=0.1, upload_model=False)],
                    topology=Ring(spec=RingSpec([2, 0], {2: 3}, {2: 0.5}))), got)  # fmt: skip
    star = Star(server=ServerSpec(lr=np.float64(0.2)))
    got = _through_a_message(RoundPlan([], topology=star), RoundPlan)
    assert type(got.topology.server.lr) is float and got.topology.server.lr == 0.2


def test_a_value_its_hint_does_not_allow_is_not_encoded():
    for plan in (
        RoundPlan([ClientTask(1, 2, batch_size=16.0)]),
        RoundPlan([], topology=Clusters(hosts={"a": 1})),
        RoundPlan([], topology=Turns(order=(True,), mode="sequential")),
        RoundPlan([ClientTask(1, 2, init_state={"w": 1.0})]),
    ):
        where = r"plan codec: RoundPlan\.(tasks\[0\]|topology\.hosts|topology\.order)"
        with pytest.raises(TypeError, match=where):
            plan_encode(plan)
    with pytest.raises(TypeError, match="not a registered plan type"):
        plan_encode(Message("x"))


def test_the_codec_never_imports_a_pickler():
    tree = ast.parse(open(codec_module.__file__).read())
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not names & {"pickle", "cloudpickle", "dill", "marshal", "copyreg", "shelve"}


# ---------------------------------------------------------- real plans of every algorithm
class _RoundTrip:
    """An executor that sends each plan through a message and runs what arrives."""

    def __init__(self, inner):
        self.inner, self.plans = inner, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def run_round(self, ctx, global_state, plan, round_seed):
        got = _through_a_message(plan, RoundPlan)
        _same(plan, got, "plan")
        self.plans += 1
        return self.inner.run_round(ctx, global_state, got, round_seed)


@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_real_plans_of_every_algorithm_round_trip(algorithm, tmp_path, monkeypatch):
    made = []
    real = loop.build_runtime

    def build(config, device):
        made.append(_RoundTrip(real(config, device)))
        return made[-1]

    monkeypatch.setattr(loop, "build_runtime", build)
    out = run(config_for(algorithm, rounds=3), run_dir=tmp_path)
    assert len(out.metrics) == 3 and made[0].plans == 3


# ------------------------------------------------------------------------ hostile input
def _plan_value() -> tuple[dict, dict]:
    value, tensors = plan_encode(_instance(RoundPlan))
    assert tensors  # the sample's tasks hold tensors: their references are checked below
    return value, tensors


def _server(value: dict) -> dict:
    return value["topology"]["server"]


def _turns(value: dict, order) -> None:
    server = _server(value)
    value["topology"] = {"@type": "Turns", "order": order, "mode": "sequential", "chain": False}
    value["topology"]["server"] = server


def _clusters(value: dict, hosts) -> None:
    value["topology"] = {"@type": "Clusters", "hosts": hosts, "server": _server(value)}


def _deep(depth: int):
    value = 1
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize(
    "edit,message",
    [
        (lambda v, t: v.update({"@type": "Pwn"}), r"^RoundPlan: unknown type tag 'Pwn'$"),
        (lambda v, t: v.update({"@type": "AuxSpec"}), "expected RoundPlan, got AuxSpec"),
        (lambda v, t: v.pop("@type"), "no type tag '@type'"),
        (lambda v, t: v.update(extra=1), r"RoundPlan: unknown fields \['extra'\]"),
        (lambda v, t: v.update(info={}), r"unknown fields \['info'\]"),  # never carried
        (lambda v, t: v.pop("topology"), r"RoundPlan: missing fields \['topology'\]"),
        (lambda v, t: v["tasks"][0].pop("lr"), r"RoundPlan\.tasks\[0\]: missing fields"),
        (lambda v, t: _server(v).update(group_loss=3), "group_loss: expected str, got int"),
        (lambda v, t: _server(v).update(lr="0.1"), r"server\.lr: expected float, got str"),
        (lambda v, t: v["device_update"].update(upload_every=True), "expected int, got bool"),
        (lambda v, t: _server(v).update(group_loss="median"), "group_loss must be one of"),
        (lambda v, t: v["topology"].update({"@type": "AuxSpec"}), "expected Topology, got AuxSpec"),
        (lambda v, t: v["device_update"].update({"@type": "Star"}), "expected DeviceUpdate, got"),
        (lambda v, t: v["tasks"][0].update(cut=True), r"tasks\[0\]\.cut: expected int, got bool"),
        (lambda v, t: v.update(round_idx=2**63), "round_idx: expected int"),
        (lambda v, t: _server(v).update(lr=math.inf), r"server\.lr: expected float, got float"),
        (lambda v, t: _turns(v, {"0": 1}), r"order: expected tuple\[int, \.\.\.\], got object"),
        (lambda v, t: _clusters(v, {"01": 1}), "hosts: key '01' is not an int"),
        (lambda v, t: _turns(v, _deep(1000)), r"order\[0\]: expected int, got array"),
        (lambda v, t: _turns(v, [0] * (MAX_ITEMS + 1)), f"{MAX_ITEMS + 1} items"),
        (lambda v, t: _server(v).update(group_loss="m" * (MAX_CHARS + 1)), "expected str"),
        (
            lambda v, t: v["tasks"][0].update(aux_memory=[{"@tensor": 0}]),
            r"aux_memory: 1 items for tuple\[",
        ),
        (lambda v, t: t.update({"99/x": torch.zeros(1)}), r"tensors \[99\] are not referenced"),
        (lambda v, t: t.update({"../x": torch.zeros(1)}), "bad plan tensor name '../x'"),
        (lambda v, t: v["tasks"][1].update(init_state={"@state": 0}), "referenced twice"),
        (
            lambda v, t: v["tasks"][0].update(init_state={"@state": 0, "more": 1}),
            r"init_state: expected \{'@state': index\}, got object",
        ),
        (lambda v, t: v["tasks"][0].update(init_state={"@tensor": 0}), "expected {'@state'"),
    ],
)
def test_hostile_plan_data_is_refused_in_one_line(edit, message):
    value, tensors = _plan_value()
    edit(value, tensors)
    with pytest.raises(PlanCodecError, match=message) as err:
        plan_decode(value, tensors, RoundPlan)
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_a_header_nesting_deeper_than_the_framing_limit_never_reaches_the_codec():
    value, tensors = _plan_value()
    value["tasks"] = _deep(40)
    frame = encode(Message("setup", {"plan": value}, tensors))
    with pytest.raises(WireError, match="nests deeper"):
        decode(bytes(frame.tobytes()))


def test_only_registered_types_are_decoded():
    value, tensors = _plan_value()
    with pytest.raises(TypeError, match="not a registered plan type"):
        plan_decode(value, tensors, Message)

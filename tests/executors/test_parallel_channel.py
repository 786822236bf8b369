"""The parallel executor's driver <-> worker channel: every message kind round-trips exactly,
nothing is unpickled, and malformed, truncated or mis-shaped messages are one clear error."""

import ast
import dataclasses
import io
import pickle
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import splitfl
from splitfl.algorithms.aux_model import smashed_shape
from splitfl.core.plan import ClientUpdate
from splitfl.core.seeding import rng_for
from splitfl.core.topology import AuxSpec, Clusters, LocalLoss, ServerSpec
from splitfl.executors import channel
from splitfl.executors.channel import ChannelError, Init
from splitfl.executors.parallel import ParallelExecutor, partitions
from splitfl.executors.pools import WorkerError
from splitfl.executors.workers import UnitWorker, recv_message, send_message
from splitfl.experiment.runner import as_config, prepare
from splitfl.models.aux_heads import linear_aux
from splitfl.net.transport.wire import decode
from splitfl.roles.fleet import group_runs
from splitfl.testing import config_for

EXECUTORS = Path(splitfl.__file__).parent / "executors"


@pytest.fixture(scope="module")
def prep():
    return prepare(as_config(config_for("s2fl")), dtype=torch.float64)


def _init(ctx, **changes) -> Init:
    init = Init(
        config=ctx.config,
        input_shape=tuple(ctx.bundle.input_shape),
        num_classes=ctx.bundle.num_classes,
        dtype=torch.float64,
        architecture=repr(ctx.model),
        device="cpu",
        precision="fp32",
        channels_last=False,
        threads=1,
        augment=ctx.augment,
    )
    return dataclasses.replace(init, **changes)


def _plan(prep):
    alg = prep.algorithm
    return alg.plan_round(0, alg.select_clients(0, rng_for(3, "select", 0)), rng_for(3, "p", 0))


def _local_run(prep):
    """A unit whose first task starts from its own state and whose members have aux heads
    (linear auxiliary models, as LocFedMix-SL's plans carry them in each task)."""
    ctx, plan = prep.ctx, _plan(prep)
    cut = plan.tasks[0].cut
    spec = AuxSpec("linear", smashed_shape(ctx, cut), ctx.bundle.num_classes)
    head = linear_aux(spec.input_shape, spec.num_classes).to(torch.float64).state_dict()
    tasks = [dataclasses.replace(t, aux_state=dict(head)) for t in plan.tasks]
    topology = Clusters(hosts={1: 4}, server=ServerSpec(lr=0.5))
    plan = dataclasses.replace(
        plan, tasks=tasks, topology=topology, device_update=LocalLoss(aux=spec)
    )
    first = plan.tasks[0]
    own = {k: v + 1 for k, v in ctx.model.state_dict().items() if int(k.split(".")[1]) < first.cut}
    plan.tasks[0] = dataclasses.replace(first, init_state=own)
    return plan, next(group_runs(ctx, ctx.model, plan))


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _bytes(frame) -> bytes:
    return bytes(frame.tobytes())


# ------------------------------------------------------------------------------ round trips
def test_init_and_data_round_trip(prep):
    ctx = prep.ctx
    sent = _init(ctx)
    got = channel.read_init(channel.read(_bytes(channel.init_message(sent)), ("init",)))
    assert got == sent  # the config, the augmentation, the dtype: all equal
    parts = partitions(ctx, {0, 5})
    got = channel.read_data(decode(_bytes(channel.data_message(parts))), ctx.bundle.input_shape)
    assert list(got) == [0, 5]
    for c, (x, y) in parts.items():
        assert torch.equal(got[c][0], x) and torch.equal(got[c][1], y)
        assert got[c][0].dtype == torch.float64 and got[c][1].dtype == y.dtype


def test_setup_and_unit_round_trip(prep):
    ctx = prep.ctx
    specs = channel.specs_of(ctx.model.state_dict())
    plan, run = _local_run(prep)
    state = ctx.model.state_dict()
    msg = channel.read(_bytes(channel.setup_message(state, plan, 2**62 + 3)), ("setup",))
    got_state, got_plan, seed = channel.read_setup(msg, specs)
    assert seed == 2**62 + 3 and _same(got_state, state)
    # the whole plan but its tasks (they come with the units) and info (the driver's own)
    assert got_plan == dataclasses.replace(plan, tasks=[], info={}, control=None)  # not carried
    msg = channel.read(_bytes(channel.unit_message(run)), ("unit",))
    group, tasks, aux = channel.read_unit(msg, specs, ctx.bundle.num_classes)
    assert group == run.group and len(aux) == len(run.tasks) > 1
    for sent, got in zip(run.tasks, tasks, strict=True):
        no_tensors = {"init_state": None, "aux_state": None}
        assert dataclasses.replace(got, **no_tensors) == dataclasses.replace(sent, **no_tensors)
        assert _same(got.aux_state, sent.aux_state)
        assert _same(aux[sent.client], run.aux[sent.client])
    assert _same(tasks[0].init_state, run.tasks[0].init_state)
    assert all(t.init_state is None for t in tasks[1:])


def test_numpy_scalars_cross_as_python_numbers_of_the_same_value(prep):
    ctx = prep.ctx
    plan, run = _local_run(prep)
    plan.topology = Clusters(hosts={np.int64(1): np.int64(4)}, server=plan.topology.server)
    first = run.tasks[0]
    run.tasks[0] = dataclasses.replace(first, lr=np.float64(0.1), upload_model=np.bool_(False))
    specs = channel.specs_of(ctx.model.state_dict())
    setup = channel.setup_message(ctx.model.state_dict(), plan, 1)
    _, got_plan, _ = channel.read_setup(decode(_bytes(setup)), specs)
    hosts = got_plan.topology.hosts
    assert hosts == {1: 4} and all(type(c) is int for c in [*hosts, *hosts.values()])
    msg = decode(_bytes(channel.unit_message(run)))
    task = channel.read_unit(msg, specs, ctx.bundle.num_classes)[1][0]
    assert (task.lr, task.upload_model) == (0.1, False) and type(task.lr) is float


def _trained(ctx, run):
    updates = [
        ClientUpdate(
            t.client,
            t.cut,
            run.group,
            16 * (i + 1),
            t.steps,
            run.parts[t.client],
            0.1 * (i + 1) / 3,
            run.aux.get(t.client),
        )  # fmt: skip
        for i, t in enumerate(run.tasks)
    ]
    low = min(t.cut for t in run.tasks)
    server = {k: v for k, v in ctx.model.state_dict().items() if int(k.split(".")[1]) >= low}
    return updates, server


def test_answers_round_trip(prep):
    ctx = prep.ctx
    _, run = _local_run(prep)
    updates, server = _trained(ctx, run)
    specs = channel.specs_of(ctx.model.state_dict())
    frame = channel.trained_answer(updates, server, 0.25, 123)
    msg = channel.read(_bytes(frame), channel.ANSWERS)
    blocks = (min(t.cut for t in run.tasks), ctx.num_blocks)
    got, got_server, seconds = channel.read_trained(msg, run, specs, blocks)
    assert seconds == 0.25 and channel.peak_rss_of(msg) == 123 and _same(got_server, server)
    assert updates  # the loop below compares something
    for u, v in zip(updates, got, strict=True):
        assert (u.client, u.cut, u.group, u.samples, u.steps) == (
            v.client, v.cut, v.group, v.samples, v.steps)  # fmt: skip
        assert u.loss_sum == v.loss_sum and _same(u.state, v.state)
        assert _same(u.aux_state, v.aux_state)
    ok = channel.read(_bytes(channel.ok_answer(7, pid=42)), channel.ANSWERS)
    assert (ok.type, ok.fields) == ("ok", {"pid": 42, "peak_rss": 7})
    try:
        raise KeyError("x")
    except KeyError as err:
        frame = channel.error_answer(err, "Traceback ...", 9)
    err = channel.read(_bytes(frame), channel.ANSWERS)
    assert channel.read_error(err) == ("KeyError", "'x'", "Traceback ...")


# ----------------------------------------------------------------------- no pickle anywhere
class _Pwn:
    """Unpickling this creates ``path`` (a stand-in for running any code)."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return (open, (str(self.path), "w"))


def test_a_pickle_sent_to_a_worker_is_refused_and_never_unpickled(tmp_path):
    marker = tmp_path / "unpickled"
    for payload in (pickle.dumps({"op": "data", "x": _Pwn(marker)}), _torch_saved(_Pwn(marker))):
        answer = UnitWorker().handle([payload])
        assert not marker.exists(), "the worker unpickled the driver's bytes"
        answer = decode(_bytes(answer))
        assert answer.type == "error" and answer.fields["type"] == "ChannelError"
        assert "not a splitfl message" in answer.fields["message"]


def _torch_saved(obj) -> bytes:
    buffer = io.BytesIO()
    torch.save({"op": "data", "partitions": obj}, buffer)
    return buffer.getvalue()


def test_a_pickle_answer_is_refused_by_the_driver(tmp_path):
    marker = tmp_path / "unpickled"
    with pytest.raises(ChannelError, match=r"malformed parallel message: not a splitfl message"):
        channel.read(pickle.dumps(_Pwn(marker)), channel.ANSWERS)
    assert not marker.exists()


def test_the_executors_neither_pickle_nor_torch_load():
    """No module of the executors imports a pickler or calls ``torch.load`` (an unpickle)."""
    picklers = {"pickle", "cloudpickle", "dill", "marshal", "copyreg", "shelve"}
    found = []
    paths = sorted(EXECUTORS.glob("*.py"))
    assert len(paths) > 5  # the executors package was found
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name.split(".")[0] for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module.split(".")[0]]
            elif isinstance(node, ast.Attribute) and node.attr in ("load", "loads"):
                names = [ast.unparse(node)]
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n in picklers | _LOADS]
    assert found == []


_LOADS = {"torch.load", "pickle.load", "pickle.loads", "torch.serialization.load"}


# ------------------------------------------------------------------ hostile and truncated
def _kinds(prep) -> dict[str, tuple[bytes, object]]:
    """Each message kind's bytes and how its receiver reads it."""
    ctx = prep.ctx
    specs = channel.specs_of(ctx.model.state_dict())
    plan, run = _local_run(prep)
    updates, server = _trained(ctx, run)
    n, classes = ctx.num_blocks, ctx.bundle.num_classes
    return {
        "init": (channel.init_message(_init(ctx)), channel.read_init),
        "data": (
            channel.data_message(partitions(ctx, {1})),
            lambda m: channel.read_data(m, ctx.bundle.input_shape),
        ),
        "setup": (
            channel.setup_message(ctx.model.state_dict(), plan, 1),
            lambda m: channel.read_setup(m, specs),
        ),
        "unit": (channel.unit_message(run), lambda m: channel.read_unit(m, specs, classes)),
        "trained": (
            channel.trained_answer(updates, server, 0.5, 1),
            lambda m: channel.read_trained(m, run, specs, (min(t.cut for t in run.tasks), n)),
        ),
    }


def test_truncated_or_padded_messages_are_refused(prep):
    for kind, (frame, reader) in _kinds(prep).items():
        blob = _bytes(frame)
        for cut in (0, 3, 9, len(blob) // 2, len(blob) - 1):
            with pytest.raises(ChannelError, match="malformed parallel message"):
                reader(channel.read(blob[:cut], (kind,)))
        with pytest.raises(ChannelError, match="trailing bytes"):
            channel.read(blob + bytes(8), (kind,))
        with pytest.raises(ChannelError, match="unexpected parallel message"):
            channel.read(blob, ("something else",))


def _retyped(frame, kind: str, edit) -> bytes:
    """``frame`` decoded, changed by ``edit(message)`` and encoded again."""
    msg = decode(_bytes(frame))
    edit(msg)
    return _bytes(channel._send(kind, msg.fields, msg.tensors))


def _tensor(msg, name: str, new) -> None:
    msg.tensors[name] = new(msg.tensors[name])


#: A ring as encoded (:mod:`splitfl.core.plan_codec`): a setup must not carry one.
_RING = {"@type": "Ring", "pipeline": "ideal", "spec": {"@type": "RingSpec", "order": [1],
         "lengths": {"1": 1}, "weights": {"1": 1.0}, "dynamic_lr": False}}  # fmt: skip


def _topology(msg) -> dict:
    return msg.fields["plan"]["topology"]


@pytest.mark.parametrize(
    "kind,edit,message",
    [
        ("init", lambda m: m.fields.update(threads="2"), "field 'threads' must be int"),
        ("init", lambda m: m.fields.update(dtype="int64"), "not a floating-point dtype"),
        ("init", lambda m: m.fields["augment"].update(mean=["a"]), "'mean' must hold numbers"),
        ("data", lambda m: m.fields.update(clients=[1, 2]), "do not match the clients"),
        ("data", lambda m: _tensor(m, "y/1", lambda t: t[:-1]), "client 1: x"),
        ("setup", lambda m: _topology(m).update(hosts="1"), r"hosts: expected dict\[int, int\]"),
        ("setup", lambda m: _topology(m).update(hosts={"a": 1}), "hosts: key 'a' is not"),
        ("setup", lambda m: m.fields["plan"].update(topology=_RING), "has tasks or a ring"),
        (
            "setup",
            lambda m: _tensor(m, "global/blocks.0.0.weight", lambda t: t[:1]),
            r"blocks.0.0.weight is \[1, ",
        ),  # fmt: skip
        (
            "setup",
            lambda m: _tensor(m, "global/blocks.0.0.bias", lambda t: t.float()),
            "torch.float32, expected",
        ),  # fmt: skip
        ("setup", lambda m: m.tensors.pop("global/blocks.0.0.bias"), "missing"),
        ("unit", lambda m: m.fields["tasks"][0].update(cut=99), "cut 99"),
        ("unit", lambda m: m.fields["tasks"][1].update(lr=None), "lr: expected float, got null"),
        ("unit", lambda m: m.fields["aux"].__setitem__(0, False), "unexpected tensors"),
        ("unit", lambda m: m.tensors.update({"other/x": torch.zeros(1)}), "unexpected tensors"),
        ("unit", lambda m: m.tensors.update({"x": torch.zeros(1)}), "has no prefix"),
        ("trained", lambda m: m.fields["updates"].pop(), "updates for"),
        ("trained", lambda m: m.fields["updates"][0].update(client=999), "differ from the task"),
        ("trained", lambda m: m.fields.update(server=False), "server copy expected"),
        ("trained", lambda m: m.fields.update(seconds=float("inf")), "cannot send trained"),
        (
            "trained",
            lambda m: _tensor(m, "part:0/blocks.0.0.weight", lambda t: t[0]),
            "update 0: blocks.0.0.weight",
        ),  # fmt: skip
    ],
)
def test_mis_typed_or_mis_shaped_messages_are_one_line_errors(prep, kind, edit, message):
    frame, reader = _kinds(prep)[kind]
    with pytest.raises(ChannelError, match=message) as err:
        reader(channel.read(_retyped(frame, kind, edit), (kind,)))
    assert "\n" not in str(err.value)


def test_a_worker_answers_a_malformed_operation_with_an_error_and_keeps_serving(prep):
    ctx = prep.ctx
    worker = UnitWorker()
    answer = decode(bytes(worker.handle([b"SFL1\x10\x00"]).tobytes()))
    assert answer.fields["type"] == "ChannelError" and "bad magic" in answer.fields["message"]
    before = decode(bytes(worker.handle([_bytes(channel.data_message({}))]).tobytes()))
    assert "'data' before 'init'" in before.fields["message"]
    answer = decode(bytes(worker.handle([_bytes(channel.init_message(_init(ctx)))]).tobytes()))
    assert answer.type == "ok" and answer.fields["pid"] > 0


def test_a_model_changed_in_process_is_refused_by_the_workers(prep):
    ctx = prep.ctx
    changed = repr(nn.Sequential(*ctx.model.blocks[:1], nn.Dropout(0.3)))
    frame = channel.init_message(_init(ctx, architecture=changed))
    answer = decode(bytes(UnitWorker().handle([_bytes(frame)]).tobytes()))
    assert answer.type == "error"
    assert "config.model 'cnn_digits' builds" in answer.fields["message"]
    assert "give it as config.model" in answer.fields["message"]


class _Answers:
    """A pool whose workers answer with the given bytes."""

    def __init__(self, blob: bytes):
        self.blob = blob

    def wait_any(self, busy):
        return next(iter(busy)), self.blob

    def describe(self, w):
        return f"parallel worker {w}"


def test_the_driver_turns_a_bad_answer_into_a_worker_error(prep):
    ex = ParallelExecutor()
    for blob in (b"\x80\x04junk", _bytes(channel.ok_answer(1))[:-3]):
        ex.pool = _Answers(blob)
        _, _, error = ex._next({1: "training group 3 of round 2"})
        assert isinstance(error, WorkerError)
        assert str(error).startswith("parallel worker 1 while training group 3 of round 2: ")
        assert "malformed parallel message" in str(error)


def test_a_stream_with_an_impossible_count_or_length_is_refused_before_allocating():
    for header in (
        (10**6).to_bytes(8, "little"),
        (1).to_bytes(8, "little") + (1 << 50).to_bytes(8, "little"),
    ):
        mine, theirs = socket.socketpair()
        with mine, theirs:
            mine.sendall(header)
            with pytest.raises(ChannelError, match=r"a (message|frame) of \d+ (frames|bytes)"):
                recv_message(theirs)


def test_frames_cross_a_socket_unjoined_and_arrive_decodable(prep):
    frame = channel.setup_message(prep.ctx.model.state_dict(), _plan(prep), 1)
    mine, theirs = socket.socketpair()
    with mine, theirs:
        sender = threading.Thread(target=send_message, args=(mine, [frame, b"raw"]))
        sender.start()  # a frame larger than the socket's buffer: read while it is written
        got = recv_message(theirs)
        sender.join()
    assert got == [frame.tobytes(), bytearray(b"raw")]


def test_recorded_tensors_round_trip_and_a_stranger_s_are_refused(prep):
    """``privacy.record`` under ``executor: parallel``: a unit asks for its members'
    received tensors, the answer carries them back as sent; an entry naming a client
    outside the unit, or lacking its tensors, is one ChannelError."""
    ctx = prep.ctx
    _, run = _local_run(prep)
    member = run.tasks[0].client
    unit = channel.read(_bytes(channel.unit_message(run, (2, [member]))), ("unit",))
    assert channel.read_unit_record(unit) == (2, [member])
    plain = channel.read(_bytes(channel.unit_message(run)), ("unit",))
    assert channel.read_unit_record(plain) is None
    updates, server = _trained(ctx, run)
    fx, skip = torch.randn(4, 3), torch.arange(4)
    recorded = [("smashed", member, 1, [fx]), ("head_gradient", member, 0, [fx, skip])]
    msg = channel.read(
        _bytes(channel.trained_answer(updates, server, 0.5, 1, recorded)), ("trained",)
    )
    specs = channel.specs_of(ctx.model.state_dict())
    blocks = (min(t.cut for t in run.tasks), ctx.num_blocks)
    assert len(channel.read_trained(msg, run, specs, blocks)[0]) == len(updates)
    (k1, c1, s1, v1), (k2, c2, s2, v2) = channel.read_recorded(msg, run)
    assert (k1, c1, s1, k2, c2, s2) == ("smashed", member, 1, "head_gradient", member, 0)
    assert torch.equal(v1, fx) and torch.equal(v2[0], fx) and torch.equal(v2[1], skip)
    stranger = max(t.client for t in run.tasks) + 1
    for bad in ([("smashed", stranger, 0, [fx])], [("smashed", member, 0, [])]):
        frame = channel.trained_answer(updates, server, 0.5, 1, bad)
        with pytest.raises(ChannelError, match="recorded entry 0"):
            channel.read_recorded(channel.read(_bytes(frame), ("trained",)), run)

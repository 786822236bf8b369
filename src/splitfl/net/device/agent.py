"""The device process (``splitfl device``): one edge device hosting one or more clients.

It connects to the server, says hello (name, token, protocol version, the clients it asks to
host), receives the run's config, loads **only its own clients' samples** (its partition of a
dataset root, drawn exactly as the simulation draws it, or its own files with ``--data``:
:meth:`ClientData.from_local`, announced at join by :mod:`splitfl.net.transport.announce`) and then
answers the server's commands
with :class:`~splitfl.roles.sides.DeviceRole` — the same code the in-process executor runs:

* ``begin`` (task, device part, auxiliary model, round seed) → ``ack``
* ``forward`` (step) → ``forwarded`` (smashed data, labels)
* ``backward`` (activation gradient) and ``head_update`` → no reply (the next reply follows)
* ``aux_step``, ``estimate_update``, ``load_aux``: the auxiliary model's commands
  (:mod:`splitfl.net.device.aux_commands`)
* ``local_step`` (step) → ``local_done`` (loss sum, samples)
* ``finish`` → ``finished`` (trained device part and what of the auxiliary model goes back)
* ``identify`` (K models, sample positions; own data only) → ``identified`` (IFCA's cluster)
* a family's own commands (:data:`EXTRA_COMMANDS`): U-shaped split learning's ``u_begin``,
  ``u_forward``, ``u_head``, ``u_finish`` (:mod:`splitfl.net.device.ushaped`)

Every reply carries ``compute_s``: device compute since the previous reply. The server never
sends code or pickles: commands are JSON fields plus raw tensors
(:mod:`splitfl.net.transport.wire`). Imports stop at config, data, models and the executor roles: no
matplotlib, scipy, Ray. If the connection drops, the process reconnects with exponential backoff.

Over 400 lines as one concept: the device's command table — each command's handler with the
check of what the server sent for it, and the one dispatch (timing, refusals, ``compute_s``)
they all go through; the auxiliary, ring, cluster and U-shaped commands live in their own
modules and register into it.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc
import numpy as np
import torch

from splitfl.config import DataConfig, ExperimentConfig
from splitfl.core.activations import count_of, differentiable, leaves, pack, unpack
from splitfl.core.plan import ClientTask
from splitfl.core.seeding import derive_seed, seed_torch
from splitfl.data.clients import client_partition
from splitfl.data.local import LocalData
from splitfl.data.source import augmentation, normalized, transforms_of
from splitfl.data.transforms import with_black
from splitfl.extensions import build_model, load_dataset
from splitfl.models import ModelPart
from splitfl.models.base import lowest_loss_state, moving_state
from splitfl.models.registry import Split
from splitfl.net.device.aux_commands import AuxCommands, step_of
from splitfl.net.device.emulation import FORWARD_SHARE, Profile, stretch, transfer
from splitfl.net.transport.announce import build_announcement, data_mismatch
from splitfl.net.transport.peer import PeerEndpoint
from splitfl.net.transport.wire import (
    Message,
    WireError,
    all_finite,
    state_from,
    state_tensors,
)
from splitfl.roles.sides import DeviceRole, Runtime


@dataclass(frozen=True)
class DeviceOptions:
    """How a device process connects (``splitfl device`` flags)."""

    server: str
    name: str
    token: str
    clients: tuple[int, ...] = ()
    data_root: str | None = None
    credentials: grpc.ChannelCredentials | None = None
    max_message_bytes: int = 256 << 20
    retry_s: float = 60.0
    #: how long a device that has joined a run (been welcomed) redials a server it lost:
    #: the run may resume (``splitfl server --resume``) after a restart that takes minutes
    resume_wait_s: float = 6 * 3600.0
    compression: str = "none"
    #: where this device accepts device-to-device links (RingSFL, ParallelSFL); None = none
    peer_listen: str | None = "127.0.0.1:0"
    #: the address peers dial (default: the listen address)
    peer_address: str | None = None
    #: how long the server may refuse this name because another link of it answers
    #: keepalives (another process with the same token) before the device gives up (exit 2)
    duplicate_wait_s: float = 60.0
    #: the device's own training data (``--data``; ``splitfl.data.local``), None = the
    #: server's dataset from ``data_root``, partitioned by the server's seed
    data: str | None = None
    data_format: str = "npz"
    #: Laplace ε of the announced label histograms (the server's may be smaller)
    histogram_epsilon: float | None = None
    #: seed of the histogram noise (None: fresh OS entropy, unknown to the server)
    noise_seed: int | None = None
    #: gRPC keepalive ping interval (a silent link is dropped after about twice this); 0 = off
    keepalive_s: float = 10.0


class Refused(RuntimeError):
    """The server refused this device (wrong token, protocol, name taken…): do not retry."""


class ClientData:
    """The samples of the clients this device hosts (and nothing else): its partition of the
    server's dataset, or (:meth:`from_local`) its own data."""

    def __init__(self, config: ExperimentConfig, clients: list[int], data_root: str | None):
        d = config.data
        bundle = load_dataset(d, data_root)  # lazy inputs: only its clients' are read
        parts = client_partition(config, bundle)
        self.input_shape, self.num_classes = bundle.input_shape, bundle.num_classes
        self.augment = augmentation(d, bundle)
        self.samples: dict[int, tuple[torch.Tensor, torch.Tensor, np.ndarray]] = {}
        for c in clients:
            idx = torch.as_tensor(parts[c], dtype=torch.long)
            # local copies; positions 0..n-1 draw the same batches as the global indices
            x, y = bundle.train.x[idx].clone(), bundle.train.y[idx].clone()
            self.samples[c] = (x, y, np.arange(len(idx)))

    @classmethod
    def from_local(
        cls, local: LocalData, clients: list[int], spec: dict, d: DataConfig
    ) -> ClientData:
        """The device's own data (``--data``) for the ``clients`` the server welcomed, checked
        against the server's model (``spec``: ``input_shape``, ``num_classes``, ``black``); a
        mismatch is refused in one line (:class:`Refused`). The server's ``data.transforms``
        apply as in a simulation run: ``normalize`` to the inputs as read (lazily for lazy
        inputs), crop/flip to each training batch (crops padded with the server dataset's
        black, ``spec["black"]``)."""
        if None in local:  # one unnamed client's data: the one client the server gave it
            if len(clients) != 1:
                raise Refused(f"data mismatch: {len(clients)} clients assigned, data for one")
            local = {clients[0]: local[None]}
        missing = sorted(set(clients) - set(local))
        if missing:
            raise Refused(f"data mismatch: no local data for clients {missing}")
        for c in clients:
            x, y = local[c]
            problem = data_mismatch(tuple(x.shape[1:]), int(y.max()), spec)
            if problem:
                raise Refused(f"data mismatch: client {c}: {problem}")
        self = cls.__new__(cls)
        self.input_shape, self.num_classes = tuple(spec["input_shape"]), int(spec["num_classes"])
        t = transforms_of(d)
        black = spec.get("black")
        self.augment = with_black(t, tuple(black) if black else None)
        self.samples = {
            c: (normalized(local[c][0], t), local[c][1], np.arange(len(local[c][1])))
            for c in clients
        }
        return self


class CommandError(WireError):
    """A command this device refuses (malformed, out of order, not for its clients)."""


#: What refusing a command catches: the device's own checks and what a malformed command
#: makes torch or the handlers raise (a wrong shape, a missing field); an OSError (a lost
#: link) still ends the session.
REFUSED = (WireError, KeyError, TypeError, ValueError, IndexError, RuntimeError, AttributeError)
#: Largest batch size, local steps and group index a ``begin`` may ask for.
_MOST = 1 << 24


def _check_begin(f: dict, num_blocks: int) -> None:
    """The ``begin`` fields are in range (one :class:`CommandError` naming the field)."""
    ints = {"cut": (1, num_blocks), "group": (0, _MOST), "batch_size": (1, _MOST)}
    ints |= {"steps": (1, _MOST), "round_seed": (0, 2**63 - 1)}
    for name, (lo, hi) in ints.items():
        v = f.get(name)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise CommandError(f"'begin' field {name}: {str(v)[:40]} not in [{lo}, {hi}]")
    lr = f.get("lr")
    if isinstance(lr, bool) or not isinstance(lr, int | float) or not 0 < lr < 1e9:
        raise CommandError(f"'begin' field lr: {str(lr)[:40]}")


#: Share of the part's per-sample FLOPs each command computes (emulation).
_COMPUTE_SHARE = {
    "forward": FORWARD_SHARE,
    "backward": 1 - FORWARD_SHARE,
    "head_update": 1 - FORWARD_SHARE,
    "estimate_update": 1 - FORWARD_SHARE,
    "aux_step": 1.0,
    "local_step": 1.0,
}
#: Commands a device answers (``aux_step``, ``estimate_update``, ``load_aux``:
#: :class:`~splitfl.net.device.aux_commands.AuxCommands`).
COMMANDS = (
    "begin",
    "forward",
    "backward",
    "head_update",
    "local_step",
    "finish",
    "identify",
    *("aux_step", "estimate_update", "load_aux"),
)


@dataclass(frozen=True)
class Command:
    """A command a topology's device side adds (:data:`EXTRA_COMMANDS`): ``handler(agent,
    client, message)`` → the reply (None: no reply), answered as :data:`COMMANDS` are (timed
    into ``compute_s``, refused with an ``error`` reply); ``begins``: it may come before
    ``begin`` (it puts the client's round state in ``agent.roles``), else it needs one there."""

    handler: Callable
    begins: bool = False
    #: under ``network.emulate``, ``flops(agent, client, profile)`` → the per-sample FLOPs
    #: the command computes (its compute is stretched to them at the profile's FLOPS, as a
    #: split command's share of its part's); None: it computes nothing emulated
    flops: Callable | None = None


#: Commands beyond :data:`COMMANDS`, by name, filled by a family's device module
#: (:mod:`splitfl.net.device.ushaped`, imported with this package).
EXTRA_COMMANDS: dict[str, Command] = {}


class DeviceAgent(AuxCommands):
    """Answers the server's commands for this device's clients."""

    def __init__(self, config: ExperimentConfig, data: ClientData):
        self.config, self.data = config, data
        if config.threads:
            torch.set_num_threads(config.threads)  # as the simulation: same kernels, same digits
        torch.manual_seed(config.seed)
        self.model = build_model(
            config.model,
            data.input_shape,
            data.num_classes,
            Split.of(config.split),
            config.train.lora,
            hf=config.hf,
        )
        self.runtime = Runtime(torch.device("cpu"), augment=data.augment)
        self.roles: dict[int, DeviceRole] = {}
        self.aux_losses: dict[int, str] = {}
        #: each client's last refused command, since its last ``begin``
        self.refusals: dict[int, str] = {}
        self.pending: dict[int, float] = {}
        self.profiles: dict[int, Profile | None] = {}
        self.last_batch: dict[int, int] = {}
        #: this process's listener for peers (set by :func:`run_device`)
        self.peer: PeerEndpoint | None = None
        #: the session options of this process (to open device-to-device links like it)
        self.options: DeviceOptions | None = None
        self.aborts: dict[int, threading.Event] = {}
        #: handlers of the device-to-device session commands (set by the connection loop,
        #: :mod:`splitfl.net.device.session`): command → handler(agent, client, message)
        self.sessions: dict = {}
        #: what the device announced of its own data (``data.source: devices``), once
        self.announced: dict | None = None
        #: sends a message to the server at once, outside any reply (set by the connection
        #: loop for each session): a ring member's ``ring_started``
        self.notify = _unconnected
        self.warm_up()

    def announcement(self, spec: dict, epsilon: float | None, seed: int) -> dict:
        """What this device announces of its clients' data (``ready``'s ``data`` field,
        :func:`~splitfl.net.transport.announce.build_announcement`)."""
        data = {c: (x, y) for c, (x, y, _) in self.data.samples.items()}
        return build_announcement(data, spec, epsilon, seed)

    def abort_event(self, session) -> threading.Event:
        """The event that tells device-to-device session ``session`` (the seq of its command)
        to give up (the server's ``abort``); created by whichever comes first."""
        return self.aborts.setdefault(session, threading.Event())

    def warm_up(self) -> None:
        """One forward/backward on a batch of its samples before saying ready, so that
        one-time kernel set-up (per batch shape) is not measured as the first round's compute."""
        x = next(iter(self.data.samples.values()))[0][: self.config.train.batch_size]
        model = copy.deepcopy(self.model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # first use loads lazily
        model(x).sum().backward()
        optimizer.step()

    def handle(self, msg: Message) -> Message | None:
        """One command → its reply (None for ``backward``, ``head_update``, ``estimate_update``,
        ``load_aux``). With emulation,
        compute is stretched to the client's profile (:mod:`splitfl.net.device.emulation`). A bad
        or out-of-order command is refused with an ``error`` reply (the client's round state
        is discarded) and the device keeps serving."""
        c = msg.fields.get("client")
        try:
            return self._handle(c, msg)
        except REFUSED as err:
            why = f"{msg.type[:40]!r} refused: {type(err).__name__}: {str(err)[:200]}"
            if isinstance(c, int):  # the client's round state is unknown now: discarded
                self.roles.pop(c, None)
                self.pending.pop(c, None)
                self.refusals[c] = why  # said again with the next command (backward has no reply)
            return Message("error", {"client": c, "seq": msg.fields.get("seq"), "error": why})

    def _handle(self, c, msg: Message) -> Message | None:
        if not isinstance(c, int) or c not in self.data.samples:
            raise CommandError(f"client {str(c)[:40]} is not hosted here")
        if msg.type in self.sessions:
            reply = self.sessions[msg.type](self, c, msg)
            reply.fields.update(client=c, seq=msg.fields.get("seq"), compute_s=0.0)
            self.aborts.pop(msg.fields.get("seq"), None)
            return reply
        extra = None if msg.type in COMMANDS else EXTRA_COMMANDS.get(msg.type)
        if msg.type not in COMMANDS and extra is None:
            raise CommandError(f"unknown command {msg.type[:40]!r}")
        begins = msg.type in ("begin", "identify") or (extra is not None and extra.begins)
        if not begins and c not in self.roles:  # identify: stateless
            earlier = self.refusals.get(c)
            raise CommandError(
                f"{msg.type!r} before 'begin'" + (f" ({earlier})" if earlier else "")
            )
        t0 = time.perf_counter()
        if extra is not None:
            reply = extra.handler(self, c, msg)
        else:
            reply = getattr(self, f"_on_{msg.type}")(c, msg)
        self._stretch(c, msg.type, t0)
        self.pending[c] = self.pending.get(c, 0.0) + time.perf_counter() - t0
        if reply is None:
            return None
        reply.fields.update(client=c, seq=msg.fields.get("seq"), compute_s=self.pending.pop(c))
        return reply

    def _stretch(self, c: int, kind: str, started: float) -> None:
        profile = self.profiles.get(c)
        if profile is None or c not in self.roles:
            return
        extra = None if kind in COMMANDS else EXTRA_COMMANDS.get(kind)
        if extra is not None:
            per_sample = None if extra.flops is None else extra.flops(self, c, profile)
        else:
            share = _COMPUTE_SHARE.get(kind)
            per_sample = None if share is None else share * profile.flops_per_sample
        if per_sample is not None:
            stretch(started, self.last_batch.get(c, 0), per_sample, profile.flops)

    def link(self, c, kind: str, nbytes: int) -> None:
        """Hold a message for its emulated transfer on client ``c``'s link."""
        profile = self.profiles.get(c)
        if profile is not None:
            transfer(nbytes, profile.uplink if kind == "up" else profile.downlink)

    def _on_begin(self, c: int, msg: Message) -> Message:
        f = msg.fields
        _check_begin(f, self.model.num_blocks)
        task = ClientTask(c, f["cut"], f["group"], f["batch_size"], f["steps"], f["lr"])
        part = copy.deepcopy(ModelPart(self.model, 0, task.cut))
        received = state_from("part", msg.tensors)
        if set(received) != self._moving_keys(task.cut):  # a LoRA model's base stays here
            raise WireError("begin: the device part's tensors differ from this model's")
        part.load_state_dict(received, strict=False)
        aux = self.begin_aux(c, msg)
        self.refusals.pop(c, None)
        seed_torch(derive_seed(f["round_seed"], "device-rng", c))  # dropout masks
        self.roles[c] = DeviceRole(
            task, part, aux, self.config.train, self.data.samples[c], f["round_seed"], self.runtime
        )
        return Message("ack")

    def _on_forward(self, c: int, msg: Message) -> Message:
        fx, y = self.roles[c].forward(step_of(msg, self.roles[c]))
        self.last_batch[c] = len(y)
        return Message("forwarded", {"step": msg.fields["step"]}, {**pack("fx", fx), "y": y})

    def _on_backward(self, c: int, msg: Message) -> None:
        role = self.roles[c]
        fx = role.pending_output()
        grad = unpack("grad", msg.tensors, count_of(fx))
        for t, g in zip(leaves(fx), leaves(grad), strict=True):
            wanted = differentiable(t)
            if (g is None) == wanted or (wanted and (g.shape != t.shape or g.dtype != t.dtype)):
                shapes = [tuple(t.shape) for t in leaves(fx)]
                raise CommandError(f"gradient does not fit the smashed data {shapes}")
            if wanted and not all_finite(g):
                raise CommandError("non-finite gradient")
        if self.aux_losses.get(c) == "local+server":
            role.local_server_update(grad)
        elif c in self.aux_losses:
            raise CommandError(f"'backward' in a round whose device update is {self.aux_losses[c]}")
        else:
            role.backward(grad)

    def _on_head_update(self, c: int, msg: Message) -> None:
        role = self.roles[c]
        role.pending_output()
        if role.aux is None or self.aux_losses.get(c) != "local":
            raise CommandError("'head_update' without an auxiliary model trained on the device")
        role.head_update()

    def _on_local_step(self, c: int, msg: Message) -> Message:
        loss_sum, samples = self.roles[c].local_step(step_of(msg, self.roles[c]))
        self.last_batch[c] = samples
        return Message("local_done", {"loss_sum": loss_sum, "samples": samples})

    def _on_identify(self, c: int, msg: Message) -> Message:
        """IFCA's cluster identity on this client's own samples at the given positions: the
        index of the lowest-loss model among the ``models`` sent (``m0.*``, ``m1.*``, …)."""
        x, y, _ = self.data.samples[c]
        pos = msg.fields.get("positions")
        k = msg.fields.get("models")
        ok = isinstance(pos, list) and all(type(p) is int and 0 <= p < len(y) for p in pos)
        if not ok or not pos or type(k) is not int or not 1 <= k <= 64:
            raise WireError("identify: bad positions or model count")
        states = [state_from(f"m{j}", msg.tensors) for j in range(k)]
        take = torch.as_tensor(pos)
        cluster = lowest_loss_state(self.model, states, x[take], y[take], self.config.train.loss)
        return Message("identified", {"cluster": cluster})

    def _on_finish(self, c: int, msg: Message) -> Message:
        part, aux = self.roles[c].states()
        aux = self.aux_back(c, aux)
        role = self.roles.pop(c)
        moving = self._moving_keys(role.task.cut)
        part = {k: v for k, v in part.items() if k in moving}
        return Message("finished", {}, {**state_tensors("part", part), **state_tensors("aux", aux)})

    def _moving_keys(self, cut: int) -> set[str]:
        """The device part's tensors that travel (all but a LoRA model's frozen base)."""
        return set(moving_state(ModelPart(self.model, 0, cut), self.model))


def _unconnected(message: Message) -> None:
    """:attr:`DeviceAgent.notify` before a session: nowhere to send ``message``."""

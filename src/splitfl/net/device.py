"""The device process (``splitfl device``): one edge device hosting one or more clients.

It connects to the server, says hello (name, token, protocol version, the clients it asks to
host), receives the run's config, loads **only its own clients' samples** (its partition of a
dataset root, drawn exactly as the simulation draws it) and then answers the server's commands
with :class:`~splitfl.executors.roles.DeviceRole` — the same code the in-process executor runs:

* ``begin`` (task, device part, aux head, round seed) → ``ack``
* ``forward`` (step) → ``forwarded`` (smashed data, labels)
* ``backward`` (activation gradient) and ``head_update`` → no reply (the next reply follows)
* ``local_step`` (step) → ``local_done`` (loss sum, samples)
* ``finish`` → ``finished`` (trained device part and aux head)

Every reply carries ``compute_s``: device compute since the previous reply. The server never
sends code or pickles: commands are JSON fields plus raw tensors (:mod:`splitfl.net.wire`).
Imports stop at config, data, models and the executor roles: no matplotlib, scipy, Ray.
If the connection drops, the process reconnects with exponential backoff.
"""

from __future__ import annotations

import copy
import threading
import time
from dataclasses import dataclass

import grpc
import numpy as np
import torch

from splitfl.config import ExperimentConfig
from splitfl.data import load_dataset
from splitfl.data.clients import client_partition
from splitfl.executors.roles import DeviceRole, Runtime, aux_from_state
from splitfl.models import ModelPart, build_model
from splitfl.net.emulation import FORWARD_SHARE, Profile, stretch, transfer
from splitfl.net.peer import PeerEndpoint
from splitfl.net.wire import (
    Message,
    WireError,
    state_from,
    state_tensors,
)
from splitfl.plan import ClientTask
from splitfl.seeding import derive_seed


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
    compression: str = "none"
    #: where this device accepts device-to-device links (RingSFL, ParallelSFL); None = none
    peer_listen: str | None = "127.0.0.1:0"
    #: the address peers dial (default: the listen address)
    peer_address: str | None = None
    #: gRPC keepalive ping interval (a silent link is dropped after about twice this); 0 = off
    keepalive_s: float = 10.0


class Refused(RuntimeError):
    """The server refused this device (wrong token, protocol, name taken…): do not retry."""


class ClientData:
    """The samples of the clients this device hosts (and nothing else)."""

    def __init__(self, config: ExperimentConfig, clients: list[int], data_root: str | None):
        d = config.data
        bundle = load_dataset(d.dataset, data_root or d.root, verify=d.verify)
        parts = client_partition(config, bundle)
        self.input_shape, self.num_classes = bundle.input_shape, bundle.num_classes
        self.samples: dict[int, tuple[torch.Tensor, torch.Tensor, np.ndarray]] = {}
        for c in clients:
            idx = torch.as_tensor(parts[c], dtype=torch.long)
            # local copies; positions 0..n-1 draw the same batches as the global indices
            x, y = bundle.train.x[idx].clone(), bundle.train.y[idx].clone()
            self.samples[c] = (x, y, np.arange(len(idx)))


#: Share of the part's per-sample FLOPs each command computes (emulation).
_COMPUTE_SHARE = {
    "forward": FORWARD_SHARE,
    "backward": 1 - FORWARD_SHARE,
    "head_update": 1 - FORWARD_SHARE,
    "local_step": 1.0,
}
#: Commands a device answers.
COMMANDS = ("begin", "forward", "backward", "head_update", "local_step", "finish")


class DeviceAgent:
    """Answers the server's commands for this device's clients."""

    def __init__(self, config: ExperimentConfig, data: ClientData):
        self.config, self.data = config, data
        if config.threads:
            torch.set_num_threads(config.threads)  # as the simulation: same kernels, same digits
        torch.manual_seed(config.seed)
        self.model = build_model(config.model, data.input_shape, data.num_classes)
        self.runtime = Runtime(torch.device("cpu"))
        self.roles: dict[int, DeviceRole] = {}
        self.pending: dict[int, float] = {}
        self.profiles: dict[int, Profile | None] = {}
        self.last_batch: dict[int, int] = {}
        #: this process's listener for peers (set by :func:`run_device`)
        self.peer: PeerEndpoint | None = None
        #: the session options of this process (to open device-to-device links like it)
        self.options: DeviceOptions | None = None
        self.aborts: dict[int, threading.Event] = {}
        #: handlers of the device-to-device session commands (set by the connection loop,
        #: :mod:`splitfl.net.device_session`): command → handler(agent, client, message)
        self.sessions: dict = {}
        self.warm_up()

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
        """One command → its reply (None for ``backward``/``head_update``). With emulation,
        compute is stretched to the client's profile (:mod:`splitfl.net.emulation`)."""
        c = msg.fields.get("client")
        if msg.type in self.sessions and c in self.data.samples:
            reply = self.sessions[msg.type](self, c, msg)
            reply.fields.update(client=c, seq=msg.fields.get("seq"), compute_s=0.0)
            self.aborts.pop(msg.fields.get("seq"), None)
            return reply
        if msg.type not in COMMANDS or c not in self.data.samples:
            raise WireError(f"unexpected command {msg.type!r} for client {c!r}")
        t0 = time.perf_counter()
        reply = getattr(self, f"_on_{msg.type}")(c, msg)
        self._stretch(c, msg.type, t0)
        self.pending[c] = self.pending.get(c, 0.0) + time.perf_counter() - t0
        if reply is None:
            return None
        reply.fields.update(client=c, seq=msg.fields.get("seq"), compute_s=self.pending.pop(c))
        return reply

    def _stretch(self, c: int, kind: str, started: float) -> None:
        profile = self.profiles.get(c)
        share = _COMPUTE_SHARE.get(kind)
        if profile is None or share is None or c not in self.roles:
            return
        samples = self.last_batch.get(c, 0)
        stretch(started, samples, share * profile.flops_per_sample, profile.flops)

    def link(self, c, kind: str, nbytes: int) -> None:
        """Hold a message for its emulated transfer on client ``c``'s link."""
        profile = self.profiles.get(c)
        if profile is not None:
            transfer(nbytes, profile.uplink if kind == "up" else profile.downlink)

    def _on_begin(self, c: int, msg: Message) -> Message:
        f = msg.fields
        task = ClientTask(c, f["cut"], f["group"], f["batch_size"], f["steps"], f["lr"])
        part = copy.deepcopy(ModelPart(self.model, 0, task.cut))
        part.load_state_dict(state_from("part", msg.tensors))
        aux_state = state_from("aux", msg.tensors)
        aux = aux_from_state(aux_state) if aux_state else None
        torch.manual_seed(derive_seed(f["round_seed"], "device-rng", c))  # dropout masks
        self.roles[c] = DeviceRole(
            task, part, aux, self.config.train, self.data.samples[c], f["round_seed"], self.runtime
        )
        return Message("ack")

    def _on_forward(self, c: int, msg: Message) -> Message:
        fx, y = self.roles[c].forward(msg.fields["step"])
        self.last_batch[c] = len(y)
        return Message("forwarded", {"step": msg.fields["step"]}, {"fx": fx, "y": y})

    def _on_backward(self, c: int, msg: Message) -> None:
        self.roles[c].backward(msg.tensors["grad"])

    def _on_head_update(self, c: int, msg: Message) -> None:
        self.roles[c].head_update()

    def _on_local_step(self, c: int, msg: Message) -> Message:
        loss_sum, samples = self.roles[c].local_step(msg.fields["step"])
        self.last_batch[c] = samples
        return Message("local_done", {"loss_sum": loss_sum, "samples": samples})

    def _on_finish(self, c: int, msg: Message) -> Message:
        part, aux = self.roles.pop(c).states()
        return Message("finished", {}, {**state_tensors("part", part), **state_tensors("aux", aux)})

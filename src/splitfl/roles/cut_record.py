"""What the server received at the cut during training, recorded (``privacy.record``).

The threat model is the honest-but-curious server (docs/explanation/privacy-threat-models.md):
it follows the protocol and keeps what arrives. For the clients and rounds of
:class:`~splitfl.config.privacy.RecordConfig` the server side keeps, for the first
``batches`` mini-batches of each:

* ``smashed`` — the smashed data of the device part as they reached the server (after the
  device's ``train.defence``): what :class:`~splitfl.roles.fleet.SplitLoop` and the U-shaped
  loop got back from their fleet's ``forward``, in process and over the wire alike (the
  networked server's :class:`~splitfl.net.server.remote_fleet.RemoteFleet` returns the decoded
  device message), and each row of the vectorised executor's device bucket;
* ``head_gradient`` — U-shaped runs (labels on the device): the cut-layer gradient of the
  head, ``∂L/∂h``, which the device sends back to the server (Li et al., "Label Leakage and
  Protection in Two-party Split Learning", ICLR 2022);
* the device part the server sent at the round's start (the global model's blocks
  ``[0, cut)``, or the task's own starting state), which an attacker inverts with;
* each batch's sample indices into the training set: for the evaluator, who fetches the true
  inputs and labels; the attacks never read them.

A :class:`CutRecorder` opens a :class:`RoundTap` for a recorded round; the executors hand
the tap to the loops that receive tensors (one call per tensor: :meth:`RoundTap.smashed`,
:meth:`RoundTap.gradient`); the recorder writes the round when it closes. A parallel
worker's loops record into a :class:`RelayTap`, whose tensors travel back with the unit's
answer into the driver's tap (:meth:`RoundTap.put`). Recording clones
what it keeps and draws no random number, so the run trains exactly as without it.

Files (``RUN_DIR/cut_record/``): ``round_NNNN.pt`` — plain tensors, written with
``torch.save`` and read back with ``weights_only=True`` — and ``index.json``, the entries
(round, client, cut, step, kind, the tensors' keys, the indices' and the part's keys).
:func:`read_record` reads them; a missing or damaged file is one line naming it.
"""

from __future__ import annotations

import json
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from splitfl.config import ConfigError
from splitfl.core.activations import Activation, leaves
from splitfl.core.atomic import write_atomic
from splitfl.core.plan import ClientTask, RoundPlan
from splitfl.core.topology import Star, Turns, UShaped
from splitfl.models import block_index
from splitfl.roles.common import task_batches

#: The run directory's folder of recorded tensors.
RECORD_DIR = "cut_record"
INDEX = "index.json"
#: The patterns whose server receives the devices' smashed data (clusters and the ring pass
#: them between devices: the central server never sees them).
RECORDED_TOPOLOGIES = (Star, Turns, UShaped)
SMASHED, HEAD_GRADIENT = "smashed", "head_gradient"

State = dict[str, torch.Tensor]


def _kept(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", copy=True)


class Tap(ABC):
    """What the loops that receive tensors call (``smashed``, ``gradient``); a tap keeps
    those of the clients it records (:meth:`chosen`) in mini-batches ``step < batches``.
    Abstract: :class:`RoundTap` keeps them for the driver, :class:`RelayTap` in a worker."""

    batches: int

    @abstractmethod
    def chosen(self, client: int) -> bool:
        """Whether ``client``'s tensors are recorded."""

    def wants(self, client: int, step: int) -> bool:
        return self.chosen(client) and step < self.batches

    def smashed(self, client: int, step: int, features: Activation) -> None:
        """The smashed data of ``client``'s mini-batch ``step`` as the server received them."""
        if self.wants(client, step):
            self.put(SMASHED, client, step, features)

    def gradient(self, client: int, step: int, grad: Activation) -> None:
        """The head's cut-layer gradient ``client`` sent for mini-batch ``step`` (U-shaped)."""
        if self.wants(client, step):
            self.put(HEAD_GRADIENT, client, step, grad)

    @abstractmethod
    def put(self, kind: str, client: int, step: int, value: Activation) -> None:
        """Keep ``value`` (``kind``: smashed data or head gradient) of ``client``'s ``step``."""


def _kept_leaves(value: Activation) -> list[torch.Tensor]:
    """The tensors of ``value`` (a gradient's None leaves left out), copied to the CPU."""
    return [_kept(t) for t in leaves(value) if t is not None]


@dataclass
class RoundTap(Tap):
    """One recorded round: what the server received from the clients of ``tasks`` in
    mini-batches ``step < batches``; ``batch_indices[client][step]`` the sample indices of
    each, ``parts[client]`` the device part it was sent."""

    round: int
    batches: int
    tasks: dict[int, ClientTask]
    batch_indices: dict[int, list[torch.Tensor]]
    parts: dict[int, State]
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    entries: list[dict] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def chosen(self, client: int) -> bool:
        return client in self.tasks

    def put(self, kind: str, client: int, step: int, value: Activation) -> None:
        """Keep ``value`` (``kind`` :data:`SMASHED` or :data:`HEAD_GRADIENT`) of ``client``'s
        mini-batch ``step`` if the round records it (a parallel worker's relayed ones too)."""
        if not self.wants(client, step):
            return
        name = f"{kind}.k{client}.s{step}"
        kept = {f"{name}.{i}": t for i, t in enumerate(_kept_leaves(value))}
        task = self.tasks[client]
        entry = {
            "round": self.round,
            "client": client,
            "group": task.group,
            "cut": task.cut,
            "step": step,
            "kind": kind,
            "tensors": sorted(kept),
            "indices": f"indices.k{client}.s{step}",
            "part": _part_key(task),
        }
        with self.lock:
            self.tensors.update(kept)
            self.tensors[entry["indices"]] = self.batch_indices[client][step].clone()
            for k, v in self.parts[client].items():
                self.tensors.setdefault(entry["part"] + k, _kept(v))
            self.entries.append(entry)


@dataclass
class RelayTap(Tap):
    """A parallel worker's tap: what its unit's loops received from ``clients`` in
    mini-batches ``step < batches``, kept for the driver's :class:`RoundTap`
    (``items``: kind, client, step, the tensors)."""

    batches: int
    clients: frozenset[int]
    items: list[tuple[str, int, int, list[torch.Tensor]]] = field(default_factory=list)

    def chosen(self, client: int) -> bool:
        return client in self.clients

    def put(self, kind: str, client: int, step: int, value: Activation) -> None:
        self.items.append((kind, client, step, _kept_leaves(value)))


class CutRecorder:
    """``privacy.record`` of a run: opens the recorded rounds' taps and writes them to
    ``run_dir/cut_record``. ``client_indices`` and ``drop_last`` give each batch's indices
    (:func:`~splitfl.roles.common.task_batches`, what every executor's devices draw)."""

    def __init__(self, spec, run_dir: Path, client_indices: list[np.ndarray], drop_last):
        self.spec, self.folder = spec, Path(run_dir) / RECORD_DIR
        self.client_indices, self.drop_last = client_indices, drop_last
        self.current: RoundTap | None = None

    def open_round(self, plan: RoundPlan, global_state: State, round_seed: int) -> None:
        """Open round ``plan.round_idx`` (0-based) for recording if the spec names it."""
        self.current = None
        r = plan.round_idx + 1
        if r not in self.spec.rounds:
            return
        refuse_unrecorded(type(plan.topology))
        chosen = self.spec.clients
        tasks = {t.client: t for t in plan.tasks if chosen is None or t.client in chosen}
        indices = {
            c: task_batches(self.client_indices[c], t, round_seed, self.drop_last)
            for c, t in tasks.items()
        }
        parts = {c: _start_part(global_state, t) for c, t in tasks.items()}
        self.current = RoundTap(r, self.spec.batches, tasks, indices, parts)

    def tap(self, plan: RoundPlan) -> RoundTap | None:
        """The open tap of ``plan``'s round (None: the round is not recorded)."""
        tap = self.current
        return tap if tap is not None and tap.round == plan.round_idx + 1 else None

    def close_round(self) -> None:
        """Write the open round (its tensors, then the index naming them)."""
        tap, self.current = self.current, None
        if tap is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        name = f"round_{tap.round:04d}.pt"
        write_atomic(self.folder / name, lambda p: torch.save(dict(sorted(tap.tensors.items())), p))
        index_path = self.folder / INDEX
        rounds = _read_index(index_path)["rounds"] if index_path.is_file() else {}
        entries = sorted(tap.entries, key=lambda e: (e["client"], e["step"], e["kind"]))
        rounds[str(tap.round)] = {"file": name, "entries": entries}
        ordered = dict(sorted(rounds.items(), key=lambda kv: int(kv[0])))
        text = json.dumps({"format": 1, "rounds": ordered}, indent=1, allow_nan=False)
        write_atomic(index_path, text)


def tap_of(ctx, plan: RoundPlan) -> RoundTap | None:
    """The run's tap for ``plan``'s round (``ctx.cut_record``, a :class:`CutRecorder` or None)."""
    recorder = getattr(ctx, "cut_record", None)
    return None if recorder is None else recorder.tap(plan)


def _part_key(task: ClientTask) -> str:
    """The key prefix of a task's starting part: one per cut for the global model's blocks,
    one per client for a task's own start."""
    return f"part.k{task.client}." if task.init_state else f"part.c{task.cut}."


def _start_part(global_state: State, task: ClientTask) -> State:
    """The device part the server sent ``task``'s client: its own start, else the global
    model's blocks ``[0, cut)`` (:class:`~splitfl.roles.fleet.StartParts`)."""
    if task.init_state:
        return dict(task.init_state)
    return {k: v for k, v in global_state.items() if block_index(k) < task.cut}


def refuse_unrecorded(topology: type) -> None:
    """ConfigError naming ``privacy.record`` unless the server of ``topology`` rounds (a
    payload class of :mod:`splitfl.core.topology`) receives the devices' smashed data
    (:data:`RECORDED_TOPOLOGIES`); the config validation asks it of the algorithm's
    ``topology`` before any round runs, the recorder of each recorded round's plan."""
    if not issubclass(topology, RECORDED_TOPOLOGIES):
        raise ConfigError(
            "privacy.record",
            f"the server receives no smashed data in {topology.__name__} rounds "
            "(recorded: star, turns, U-shaped)",
        )


@dataclass(frozen=True)
class RecordedBatch:
    """One recorded mini-batch: where it came from, the tensors the server received
    (``value``: one tensor or a tuple), the batch's sample indices and the device part."""

    round: int
    client: int
    cut: int
    step: int
    kind: str
    value: Activation
    indices: torch.Tensor
    part: State


def read_record(run_dir: str | Path) -> list[RecordedBatch]:
    """Every recorded batch of ``run_dir`` (ConfigError naming the file for one that is
    missing or damaged)."""
    folder = Path(run_dir) / RECORD_DIR
    index = _read_index(folder / INDEX)
    out = []
    for r, entry in index["rounds"].items():
        path = folder / str(entry.get("file", ""))
        tensors = _read_tensors(path)
        for e in entry["entries"]:
            try:
                parts = [tensors[k] for k in e["tensors"]]
                prefix = e["part"]
                part = {k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)}
                value = parts[0] if len(parts) == 1 else tuple(parts)
                batch = RecordedBatch(
                    int(r), e["client"], e["cut"], e["step"], e["kind"], value,
                    tensors[e["indices"]], part,
                )  # fmt: skip
            except (KeyError, TypeError, IndexError) as err:
                line = f"does not hold the tensors its index names ({err})"
                raise ConfigError(str(path), line) from None
            out.append(batch)
    return out


def _read_index(path: Path) -> dict:
    if not path.is_file():
        raise ConfigError(str(path), "missing: the run recorded nothing (set privacy.record)")
    try:
        index = json.loads(path.read_text())
        if not isinstance(index.get("rounds"), dict):
            raise ValueError("no 'rounds' mapping")
        for entry in index["rounds"].values():
            if not isinstance(entry.get("entries"), list):
                raise ValueError("a round without 'entries'")
    except (OSError, ValueError, AttributeError) as err:
        raise ConfigError(str(path), f"not a cut-record index ({str(err)[:80]})") from None
    return index


def _read_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        tensors = torch.load(path, weights_only=True)
    except FileNotFoundError:
        raise ConfigError(str(path), "missing (named by the record's index.json)") from None
    except Exception as err:  # torch raises RuntimeError, UnpicklingError, EOFError, ...
        line = str(err).splitlines()[0][:80] if str(err) else type(err).__name__
        raise ConfigError(str(path), f"not a tensor file splitfl wrote ({line})") from None
    if not isinstance(tensors, dict) or not all(
        isinstance(v, torch.Tensor) for v in tensors.values()
    ):
        raise ConfigError(str(path), "not a mapping of tensors")
    return tensors

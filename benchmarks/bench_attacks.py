"""Attack counts (issue 35's "must show"): runs one insider can wreck, stall or stop, and
devices lost for good after a link break, on loopback gRPC with devices in threads.

Each case is a networked run of ten single-client devices (RingSFL: four, its ring size on
the 4-block MLP) on the embedded digits, one of them an insider holding a valid token, next
to the same run with every device honest (its *baseline*). A run is

* **wrecked** when its final test accuracy is more than ``--wreck-points`` (10) percentage
  points below the baseline's, or its status says the accuracy collapsed or is at chance;
* **stalled** when its median round takes more than ``--stall-factor`` (3) times the
  baseline's median round (``wall_time`` per metrics row);
* **stopped** when ``splitfl.run`` raises or the status is not ``ok``;
* **caught** when the insider's client is dropped in some round with a recorded reason (a
  ParallelSFL top worker: when its members' drops name it, ``top worker 0: ...``; a RingSFL
  member: also when the round's ``executor_events`` name it, ``ring member 0 late to start``).

The link-break case cuts every device's link (a relay that swallows bytes) for longer than
the network timeout, after each device has been connected longer than its ``retry_s``, and
counts devices whose client is still dropped in the last round or whose thread ended before
the server's bye. Lock-out and replay (issue 35, items 7–8) are tests, not counted here:
``tests/net/test_net_auth.py``.

Run: ``python benchmarks/bench_attacks.py`` (about 10 minutes on 2 cores), results in
``benchmarks/results/attacks-<date>.json``; ``--only NAME`` runs the cases whose name
contains NAME; ``--untrusted-aggregation RULE`` sets ``network.untrusted_aggregation`` of
every run and its honest control (attack cases and ``--false-positive-rate``).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
import yaml

import splitfl
from splitfl.config.network import NetworkConfig
from splitfl.config.schema import UNTRUSTED_AGGREGATIONS
from splitfl.net.device import clusters as device_clusters
from splitfl.net.device.agent import DeviceAgent, DeviceOptions
from splitfl.net.device.session import start_in_thread
from splitfl.net.server.testbed import FreezingRelay, Testbed
from splitfl.net.transport.wire import Message
from splitfl.testing import config_for, flip_away

AGGREGATIONS = ("mean", "median", "trimmed_mean", "clip_mean")


# ---------------------------------------------------------------- insiders (client 0's device)
class ScaledSmashed(DeviceAgent):
    """Sends its honest smashed data times ``factor`` (inside the 100× peak bound)."""

    factor = 50.0

    def _on_forward(self, c, msg):
        reply = super()._on_forward(c, msg)
        reply.tensors["fx"] = reply.tensors["fx"] * type(self).factor
        return reply


class Smashed10(ScaledSmashed):
    factor = 10.0


def _moved(given: torch.Tensor, sent: torch.Tensor, how: str) -> torch.Tensor:
    """``sent`` (an honest part) sign-flipped, or moved 9.9 × ‖given‖ along its update."""
    if how == "flip":
        return -sent
    step = sent - given
    return given + 9.9 * given.norm() * step / step.norm().clamp_min(1e-12)


class _Tampering(DeviceAgent):
    """Tampers with every floating-point tensor of its finished part."""

    how = "flip"

    def _on_begin(self, c, msg):
        self.given = {k: t.clone() for k, t in msg.tensors.items() if k.startswith("part/")}
        return super()._on_begin(c, msg)

    def _on_finish(self, c, msg):
        reply = super()._on_finish(c, msg)
        for name, t in reply.tensors.items():
            if t.is_floating_point() and name in self.given:
                reply.tensors[name] = _moved(self.given[name], t, type(self).how)
        return reply


class FlippedPart(_Tampering):
    how = "flip"


class BoostedPart(_Tampering):
    how = "boost"


class Negated(DeviceAgent):
    """Sends ``sent − factor × (its honest move)`` after its first ``honest`` replies (issue
    51's colluders: inside every norm bound; honest-then-attack passed the spread check)."""

    factor, honest = 6.0, 0

    def _on_begin(self, c, msg):
        self.given = {k: t.clone() for k, t in msg.tensors.items() if k.startswith("part/")}
        return super()._on_begin(c, msg)

    def _on_finish(self, c, msg):
        reply = super()._on_finish(c, msg)
        self.replies = getattr(self, "replies", 0) + 1
        if self.replies <= type(self).honest:
            return reply
        for name, t in reply.tensors.items():
            if t.is_floating_point() and name in self.given:
                sent = self.given[name]
                reply.tensors[name] = sent - type(self).factor * (t - sent)
        return reply


def negated(factor: float, honest: int = 0) -> type:
    """A :class:`Negated` colluder of this ``factor``, honest for its first ``honest`` replies."""
    return type(f"Negated{factor:g}h{honest}", (Negated,), {"factor": factor, "honest": honest})


class RogueTop(DeviceAgent):
    """As a ParallelSFL top worker, reports its cluster's top part sign-flipped."""

    def handle(self, msg):
        reply = super().handle(msg)
        if reply is not None and reply.type == "hosted":
            for name, t in reply.tensors.items():
                if name.startswith("server/") and t.is_floating_point():
                    reply.tensors[name] = -t
        return reply


class LoudLoss(DeviceAgent):
    """Reports 0.99 × ``loss_max`` per sample for each local step (inside the bound)."""

    def _on_local_step(self, c, msg):
        reply = super()._on_local_step(c, msg)
        reply.fields["loss_sum"] = 0.99 * 1e4 * reply.fields["samples"]
        return reply


class SlowDrip(DeviceAgent):
    """Answers every command after 0.9 × the network timeout (never late enough to time out)."""

    delay_s = 0.9 * 2.0

    def handle(self, msg):
        time.sleep(type(self).delay_s)
        return super().handle(msg)


# ------------------------------------------- issue 51 item 4 and 6: RingSFL and ParallelSFL
class RingFlip(DeviceAgent):
    """As a RingSFL member, uploads ``g − 9.9 ‖g‖ · unit(its honest move)`` per tensor."""

    flip_ring = True


class RingStallAfterAck(DeviceAgent):
    """As a RingSFL member, from its second ring on: acknowledges the command, then stalls
    (silent past the server's abort)."""

    stall_after_ack = True
    rings = 0


class SleepyTop(DeviceAgent):
    """As a ParallelSFL top worker, trains its cluster, then sleeps 15 s before reporting."""

    def handle(self, msg):
        reply = super().handle(msg)
        if msg.type == "host":
            time.sleep(15.0)
        return reply


def _ring_session(agent, c, msg, abort):
    """device clusters' ``ring_session`` with :class:`RingFlip`'s and
    :class:`RingStallAfterAck`'s tampering (other agents: unchanged)."""
    if getattr(agent, "stall_after_ack", False):
        agent.rings += 1
        if agent.rings >= 2:
            abort.wait(20.0)
            time.sleep(2.0 + 1.0)  # the bench's timeout_s, and more
            return Message("ring_failed", {"reason": "stalled", "client": c})
    reply = _RING_SESSION(agent, c, msg, abort)
    if getattr(agent, "flip_ring", False) and reply.type == "ring_done":
        flip_away(reply.tensors, msg.tensors)
    return reply


_RING_SESSION = device_clusters.ring_session
device_clusters.ring_session = _ring_session


def d2d_fault_cases() -> list[Case]:
    """Issue 51 items 4 and 6, each before (the fix switched off, or ``network.trust:
    trusted`` for the ring's peer check, which is what the old code checked) and after."""
    ring = {"options.ringsfl.version": "v1"}
    clusters = {"options.parallelsfl.k": 4}
    off = {"network.trust": "trusted"}
    return [
        Case("ring-model-flip/before-trusted", "ringsfl", RingFlip, {**ring, **off}, devices=4),
        Case("ring-model-flip/after", "ringsfl", RingFlip, ring, devices=4),
        Case(
            "ring-ack-then-stall/before",
            "ringsfl",
            RingStallAfterAck,
            {**ring, "options.ringsfl.exclude_stalled": False},
            devices=4,
        ),
        Case("ring-ack-then-stall/after", "ringsfl", RingStallAfterAck, ring, devices=4),
        Case(
            "sleeping-top/before",
            "parallelsfl",
            SleepyTop,
            {**clusters, "network.cluster_deadline_factor": 0.0},
            devices=8,
        ),
        Case("sleeping-top/after", "parallelsfl", SleepyTop, clusters, devices=8),
    ]


# ----------------------------------------------------------------------------- the cases
@dataclass(frozen=True)
class Case:
    name: str
    algorithm: str
    agent: type | None
    changes: dict[str, Any] = field(default_factory=dict)
    devices: int = 10
    insiders: int = 1  # clients 0 .. insiders - 1 (colluders send the same tampering)


def cases() -> list[Case]:
    """Every insider case: model damage under each aggregation rule, then D2D roles, stalls
    and stops (under the default ``mean``)."""
    out = []
    for rule in AGGREGATIONS:
        agg = {"train.aggregation": rule}
        out += [
            Case(f"smashed-x10/{rule}", "splitfed_v1", Smashed10, agg),
            Case(f"smashed-x50/{rule}", "splitfed_v1", ScaledSmashed, agg),
            Case(f"flipped-part/{rule}", "fedavg", FlippedPart, agg),
            Case(f"boosted-part/{rule}", "fedavg", BoostedPart, agg),
        ]
        out.append(Case(f"flipped-part-2-of-10/{rule}", "fedavg", FlippedPart, agg, insiders=2))
    ring = {"options.ringsfl.version": "v1"}
    clusters = {"options.parallelsfl.k": 4}  # up to 4 clusters of 8 devices
    out += [
        Case("parallelsfl-flipped-bottom", "parallelsfl", FlippedPart, clusters, devices=8),
        Case("parallelsfl-rogue-top", "parallelsfl", RogueTop, clusters, devices=8),
        Case("ringsfl-slow-drip", "ringsfl", SlowDrip, ring, devices=4),
        Case("slow-drip", "splitfed_v1", SlowDrip),
        Case("loud-loss", "fedavg", LoudLoss),
    ]
    return out + collusion_cases() + d2d_fault_cases()


def collusion_cases() -> list[Case]:
    """Issue 51: colluders sending ``sent − k × (their honest move)`` under the networked
    default (10/20/30 % of ten at k = 6, 30 % at k = 3 and 9), the same honest for their first
    3 replies, one of a round of two, and one device reporting maximal losses."""
    fl = {"network.bounds.min_cosine": 0.0}  # FLTrust's rule: off by default (false positives)
    out = [Case(f"colluders-{n}0pct-x6", "fedavg", negated(6.0), fl, insiders=n) for n in (1, 2, 3)]
    out += [Case(f"colluders-30pct-x{k:g}", "fedavg", negated(k), fl, insiders=3) for k in (3, 9)]
    out += [
        Case("colluders-30pct-x6-late", "fedavg", negated(6.0, honest=3), fl, insiders=3),
        Case("colluder-round-of-2-x6", "fedavg", negated(6.0), fl, devices=2),
    ]
    return out + default_cases()


#: The shipped ``network.untrusted_aggregation`` (``config_for``'s tiny configs pin ``mean``
#: for the tests' networked-vs-simulation equality): the default cases and the false-positive
#: runs set it, so they measure the unconfigured deployment.
SHIPPED = {"network.untrusted_aggregation": NetworkConfig.untrusted_aggregation}


def with_rule(case: Case, rule: str | None) -> Case:
    """``case`` with ``network.untrusted_aggregation: rule`` (``--untrusted-aggregation``;
    its honest control is run from the same case, so under the same rule); ``None``: the case
    as defined (the shipped rule for the ``default-*`` cases, ``config_for``'s ``mean``
    elsewhere). The rule applies where ``train.aggregation`` is ``mean``."""
    if rule is None:
        return case
    return replace(case, changes={**case.changes, "network.untrusted_aggregation": rule})


def default_cases() -> list[Case]:
    """Issue 51, item 1: the unconfigured deployment (``network.trust: untrusted``, its
    shipped aggregation :data:`SHIPPED`, the direction check off) against colluders at 20 %
    and 30 % of ten sending ``sent − k × (their honest move)`` for k in 0.5, 1, 1.9, 3, 6
    (k = 1.9: inside a 2× norm bound), the same honest for their first 3 replies, and one of
    a round of two."""
    out = [
        Case(f"default-{n}0pct-x{k:g}", "fedavg", negated(k), SHIPPED, insiders=n)
        for n in (2, 3)
        for k in (0.5, 1.0, 1.9, 3.0, 6.0)
    ]
    out += [
        Case("default-30pct-x1.9-late", "fedavg", negated(1.9, honest=3), SHIPPED, insiders=3),
        Case("default-round-of-2-x1.9", "fedavg", negated(1.9), SHIPPED, devices=2),
    ]
    return out


def config(case: Case, rounds: int, **network: Any) -> dict[str, Any]:
    sized = {"data.num_clients": case.devices, "train.clients_per_round": case.devices}
    if case.algorithm == "ringsfl":
        sized = {}  # config_for's ring size: 4 clients on the 4-block MLP
    return config_for(case.algorithm, rounds=rounds, **{**sized, **case.changes, **network})


def networked(case: Case, folder: Path, rounds: int, honest: bool) -> dict[str, Any]:
    """One run with the insiders (or none); tried again on a fresh port when another process
    took the free port before the server bound it (a race of the benchmark, not a result)."""
    for attempt in range(3):
        result = _networked(case, folder / f"try{attempt}", rounds, honest)
        if "cannot listen on" not in result["status"]:
            break
    return result


def _networked(case: Case, folder: Path, rounds: int, honest: bool) -> dict[str, Any]:
    """One run with client 0's device the insider (or honest); its outcome fields."""
    names = [f"d{i}" for i in range(case.devices)]
    bed = Testbed.create(folder / "bed", names)
    agent = None if honest else case.agent
    threads = [
        bed.device(n, [i], agent if i < case.insiders else None, retry_s=30.0)
        for i, n in enumerate(names)
    ]
    # a round waits for all but two devices (waiting for every one would let one device
    # that redials hold up each round: min_devices is the operator's choice)
    net = bed.server_overrides(min_devices=max(2, case.devices - 2), timeout_s=2.0)
    t0 = time.perf_counter()
    try:
        result = splitfl.run(config(case, rounds, **net), run_dir=folder / "run")
        status, rows = result.summary["status"], result.metrics
    except Exception as err:  # noqa: BLE001 (a stopped run is a counted outcome)
        status, rows = f"raised {type(err).__name__}: {str(err)[:200]}", []
    for t in threads:
        t.join(30)
    return outcome(status, rows, time.perf_counter() - t0)


#: Issue 51's false-positive runs: honest fleets of ten, non-IID (Dirichlet α), algorithms
#: with one cut and S²FL's mixed cuts.
FP_ALGORITHMS, FP_ALPHAS = ("fedavg", "splitfed_v1", "s2fl"), (0.1, 0.5)
#: Issue 51 item 3's false-positive rate (``--false-positive-rate``): every algorithm the
#: attack cases run networked (RingSFL on its ring of four, ParallelSFL with up to 4
#: clusters of 8), at both α, under the untrusted default; then a server whose round loop
#: sleeps :data:`FREEZE_S` once (past ``timeout_s`` 2 s and the 2 s deadline floor) and an
#: S²FL run resumed at half its rounds on a fresh server (what judges its rounds comes
#: from the checkpoint: the peer windows since 2026-12-06, the lateness record before).
FP_RATE_RUNS = (
    ("fedavg", 10, {}),
    ("splitfed_v1", 10, {}),
    ("s2fl", 10, {}),
    ("parallelsfl", 8, {"options.parallelsfl.k": 4}),
    ("ringsfl", 4, {"options.ringsfl.version": "v1"}),
    # rounds of two: only the server's step judges them (network.bounds.small_round_min_cosine)
    ("fedavg", 2, {}),
    ("splitfed_v1", 2, {}),
)
FREEZE_S = 5.0
#: drop reasons that say a device was not there (not a check's verdict on an honest update)
ABSENT = ("device not connected",)


def false_positives(folder: Path, rounds: int) -> list[dict[str, Any]]:
    """Honest runs under the untrusted default and under ``network.trust: trusted`` (plain
    ``mean``): every client-round dropped in the default is a false positive (goal 0);
    the accuracy pair is what the median aggregation costs an honest fleet."""
    out = []
    for algorithm in FP_ALGORITHMS:
        for alpha in FP_ALPHAS:
            row: dict[str, Any] = {"algorithm": algorithm, "alpha": alpha}
            for trust in ("untrusted", "trusted"):
                changes = {"data.alpha": alpha, "network.trust": trust}
                case = Case(f"fp-{algorithm}-{alpha:g}-{trust}", algorithm, None, changes)
                run = networked(case, folder / case.name, rounds, True)
                dropped = sum(len(r) for r in run.pop("dropped_clients"))
                row[trust] = {**run, "client_rounds_dropped": dropped}
            out.append(row)
            u, t = row["untrusted"], row["trusted"]
            print(
                f"fp {algorithm:<12} alpha {alpha:g}: dropped {u['client_rounds_dropped']} "
                f"client-rounds; acc {u['final_acc']} (median) vs {t['final_acc']} (mean)",
                flush=True,
            )
    return out


#: the false-positive rate's server-freeze and resumed runs (:func:`fp_rate_cases`)
FROZEN, RESUMED = f"splitfed_v1-a0.5-freeze-{FREEZE_S:g}s", "s2fl-a0.5-resumed"


def fp_rate_cases(only: str = "", rule: str | None = None) -> list[Case]:
    """The false-positive rate's honest runs whose name contains ``only``: each of
    :data:`FP_RATE_RUNS` at each α, then :data:`FROZEN` and :data:`RESUMED`, all under the
    shipped rule or ``rule`` (:func:`with_rule`)."""
    out = []
    for algorithm, devices, extra in FP_RATE_RUNS:
        for alpha in FP_ALPHAS:
            changes = {"data.alpha": alpha, **SHIPPED, **extra}
            name = f"{algorithm}-a{alpha:g}" + ("" if devices >= 3 else f"-{devices}-clients")
            out.append(Case(name, algorithm, None, changes, devices=devices))
    out += [
        Case(FROZEN, "splitfed_v1", None, {"data.alpha": 0.5, **SHIPPED}),
        Case(RESUMED, "s2fl", None, {"data.alpha": 0.5, **SHIPPED}),
    ]
    return [with_rule(c, rule) for c in out if only in c.name]


def false_positive_rate(
    folder: Path, rounds: int, only: str = "", rule: str | None = None
) -> dict[str, Any]:
    """Issue 51 item 3: honest client-rounds dropped (for any reason but an absent device)
    over all honest client-rounds, per run of :func:`fp_rate_cases`; goal 0."""
    runs = []
    for case in fp_rate_cases(only, rule):
        where = folder / case.name
        if case.name == FROZEN:
            with _server_sleeps(FREEZE_S):
                runs.append(_rate(case.name, networked(case, where, rounds, True)))
        elif case.name == RESUMED:
            runs.append(_rate(case.name, resumed(case, where, rounds)))
        else:
            runs.append(_rate(case.name, networked(case, where, rounds, True)))
        print(f"fp-rate {case.name}: {runs[-1]['dropped']} dropped", flush=True)
    for r in runs:
        print(f"fp-rate {r['run']:<32} {r['dropped']}/{r['client_rounds']} {r['status'][:60]}")
    dropped, total = sum(r["dropped"] for r in runs), sum(r["client_rounds"] for r in runs)
    return {
        "dropped": dropped,
        "client_rounds": total,
        "rate": dropped / max(total, 1),
        "runs": runs,
    }


#: Issue 51 item 3: networked aggregation rules compared for the untrusted default, each as
#: the config changes that select it (``train.aggregation: mean``, so the untrusted rule
#: applies): the attack rows and the honest non-IID rows of :func:`tradeoff`.
TRADEOFF_RULES: dict[str, dict[str, Any]] = {
    "mean": {"network.untrusted_aggregation": "mean"},
    "median": {"network.untrusted_aggregation": "median"},
    "trimmed_mean-0.3": {
        "network.untrusted_aggregation": "trimmed_mean",
        "train.trim_fraction": 0.3,
    },
    "clip_mean": {"network.untrusted_aggregation": "clip_mean"},
    "centered_clip": {"network.untrusted_aggregation": "centered_clip"},
    # FLTrust (Cao et al. NDSS 2021): trust scores against the server's own step
    "fltrust": {"network.untrusted_aggregation": "fltrust"},
    "mean+min_cosine-0": {
        "network.untrusted_aggregation": "mean",
        "network.bounds.min_cosine": 0.0,
    },
}
#: the coalitions of the tradeoff's attack rows: 30 % of ten at k, honest for ``honest`` replies
TRADEOFF_ATTACKS = ((1.9, 0), (6.0, 0), (1.9, 3))


def tradeoff(
    folder: Path, rounds: int, honest_rounds: int, only: str, wreck_points: float
) -> list[dict[str, Any]]:
    """Per rule of :data:`TRADEOFF_RULES` (those whose name contains ``only``): three
    colluders of ten at each of :data:`TRADEOFF_ATTACKS` for ``rounds`` rounds next to the
    honest run of the same config, and honest FedAvg fleets at Dirichlet α 0.1 and 0.5 for
    ``honest_rounds`` rounds (each round's accuracy kept: the gap after 4 and after 20)."""
    out = []
    for rule, changes in TRADEOFF_RULES.items():
        if only not in rule:
            continue
        row: dict[str, Any] = {"rule": rule, "changes": changes, "attacks": [], "honest": {}}
        base = networked(Case(f"{rule}-base", "fedavg", None, changes), folder / rule, rounds, True)
        for k, honest in TRADEOFF_ATTACKS:
            case = Case(
                f"{rule}-30pct-x{k:g}-h{honest}", "fedavg", negated(k, honest), changes, 10, 3
            )
            run = networked(case, folder / case.name, rounds, False)
            verdict = judge(run, base, wreck_points, 3.0)
            row["attacks"].append({"k": k, "honest_replies": honest, **verdict, "run": run})
            print(_line({"case": case.name, **verdict, "run": run, "baseline": base}), flush=True)
        row["baseline"] = base
        for alpha in FP_ALPHAS:
            case = Case(f"{rule}-a{alpha:g}", "fedavg", None, {**changes, "data.alpha": alpha})
            run = _rate(case.name, networked(case, folder / case.name, honest_rounds, True))
            row["honest"][f"{alpha:g}"] = run
            print(f"tradeoff {case.name}: accs {run['accs']} dropped {run['dropped']}", flush=True)
        out.append(row)
    return out


def _rate(name: str, run: dict[str, Any]) -> dict[str, Any]:
    """A run's honest client-rounds and those dropped, with their reasons (absent devices
    counted apart: a round waits for all but two devices)."""
    reasons = [why for row in run["dropped_reasons"] for why in row.values()]
    checked = [why for why in reasons if not why.startswith(ABSENT)]
    return {
        "run": name,
        "status": run["status"],
        "final_acc": run["final_acc"],
        "accs": run["accs"],
        "client_rounds": run["client_rounds"],
        "dropped": len(checked),
        "absent": len(reasons) - len(checked),
        "reasons": sorted({why[:120] for why in checked}),
        "wall_s": run["wall_s"],
    }


@contextlib.contextmanager
def _server_sleeps(seconds: float):
    """The server's round loop sleeps ``seconds`` once, in the first round with a deadline,
    before it reads a reply (the smallest server freeze: tests/net/test_server_stalls.py)."""
    from splitfl.net.server.remote_fleet import RemoteFleet

    original, slept = RemoteFleet._await, []

    def sleepy(self, link, c, seq, deadline):
        if self.round_deadline is not None and not slept:
            slept.append(c)
            time.sleep(seconds)
        return original(self, link, c, seq, deadline)

    RemoteFleet._await = sleepy
    try:
        yield
    finally:
        RemoteFleet._await = original


def resumed(case: Case, folder: Path, rounds: int) -> dict[str, Any]:
    """An honest run of ``case`` (:data:`RESUMED`: S²FL, α 0.5) stopped after half its rounds
    and resumed, as ``splitfl server --resume``, on a fresh server with freshly started
    devices: what judges the resumed rounds is what the checkpoint kept
    (``NetworkedExecutor.state_dict``: deadlines, the lateness record and, since 2026-12-06,
    the peer windows)."""
    first = networked(case, folder / "first", rounds // 2, True)
    run_dir = sorted((folder / "first").glob("try*/run"))[-1]
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    config["rounds"] = rounds
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    names = [f"d{i}" for i in range(case.devices)]
    bed = Testbed.create(folder / "bed2", names)
    threads = [bed.device(n, [i], None, retry_s=30.0) for i, n in enumerate(names)]
    flags = [f"network.listen=127.0.0.1:{bed.port}", f"network.tokens={bed.tokens_file}"]
    t0 = time.perf_counter()
    try:
        result = splitfl.resume(run_dir, overrides=flags)
        status, rows = result.summary["status"], result.metrics
    except Exception as err:  # noqa: BLE001 (a stopped run is a counted outcome)
        status, rows = f"raised {type(err).__name__}: {str(err)[:200]}", []
    for t in threads:
        t.join(30)
    resumed_run = outcome(status, rows, time.perf_counter() - t0 + first["wall_s"])
    return resumed_run


def outcome(status: str, rows: list[dict], wall_s: float) -> dict[str, Any]:
    """A run's result: status, final accuracy, each round's wall time (``wall_time`` is the
    time since the run began), the rounds the insider was dropped in and why."""
    ends = [r["wall_time"] for r in rows]
    round_s = [b - a for a, b in zip([0.0, *ends], ends, strict=False)]
    accs = [r["test_acc"] for r in rows if r.get("test_acc") is not None]
    caught = [r["round"] for r in rows if _insider_named(r)]
    reasons = [why for r in rows for why in _insider_reasons(r)]
    return {
        "status": status,
        "final_acc": accs[-1] if accs else None,
        "accs": [round(a, 4) for a in accs],
        # the largest reported training loss (a liar's reports must not move it)
        "train_loss_max": max((r["train_loss"] for r in rows if r.get("train_loss")), default=None),
        "median_round_s": statistics.median(round_s[1:] or round_s) if rows else None,
        "round_s": [round(t, 2) for t in round_s],
        "rounds_insider_dropped": caught,
        "reasons": sorted({why[:160] for why in reasons}),
        "wall_s": round(wall_s, 1),
        "dropped_clients": [r.get("dropped_clients", []) for r in rows],
        "dropped_reasons": [r.get("dropped_reasons") or {} for r in rows],
        "client_rounds": sum(len(r.get("clients", [])) for r in rows),
    }


#: how a drop names the insider as a ParallelSFL top worker (it is no task of its cluster:
#: its members are dropped, naming it; ``dropped by top worker 0`` is its own doing)
TOP_WORKER = "top worker 0:"


#: how an executor event names the insider as a RingSFL member (slow to start: its work is
#: kept, it is benched)
RING_MEMBER = "ring member 0 "


def _insider_reasons(row: dict) -> list[str]:
    """The round's drop reasons of client 0, those naming it as the top worker at fault, and
    the executor's events naming it as a ring member."""
    reasons = row.get("dropped_reasons", {})
    named = [why for why in reasons.values() if why.startswith(TOP_WORKER)]
    events = [e for e in row.get("executor_events", []) if e.startswith(RING_MEMBER)]
    return ([reasons["0"]] if "0" in reasons else []) + named[:1] + events


def _insider_named(row: dict) -> bool:
    """Client 0 was dropped in the round, or named as the top worker or ring member at
    fault."""
    return 0 in row.get("dropped_clients", []) or bool(_insider_reasons(row))


def judge(run: dict, base: dict, wreck_points: float, stall_factor: float) -> dict[str, bool]:
    stopped = not run["status"].startswith("ok")
    acc, ref = run["final_acc"], base["final_acc"]
    wrecked = acc is None or (ref is not None and 100 * (ref - acc) > wreck_points)
    wrecked = wrecked or "collapsed" in run["status"] or "at chance" in run["status"]
    slow, ref_s = run["median_round_s"], base["median_round_s"]
    stalled = slow is not None and ref_s is not None and slow > stall_factor * ref_s
    return {
        "wrecked": wrecked,
        "stalled": stalled,
        "stopped": stopped,
        "caught": bool(run["rounds_insider_dropped"]),
    }


# ------------------------------------------------------------------------- the link break
def link_break(folder: Path, devices: int, cut_after_s: float, hold_s: float) -> dict[str, Any]:
    """Every device behind one relay, ``retry_s`` 5 s (shorter than it has been connected,
    longer than the cut), cut for ``hold_s`` once connected for ``cut_after_s``: how many
    devices are lost for good."""
    names = [f"d{i}" for i in range(devices)]
    bed = Testbed.create(folder / "bed", names)
    relay = FreezingRelay(bed.port)
    threads = []
    for i, name in enumerate(names):
        opts = DeviceOptions(
            f"127.0.0.1:{relay.port}", name, bed.tokens[name], (i,), retry_s=5.0, keepalive_s=1.0
        )
        threads.append(start_in_thread(opts))

    def cut() -> None:
        time.sleep(cut_after_s)
        relay.frozen.set()
        time.sleep(hold_s)
        relay.frozen.clear()

    threading.Thread(target=cut, daemon=True).start()
    net = bed.server_overrides(min_devices=devices, timeout_s=2.0, rejoin_s=8.0)
    net["network.keepalive_s"] = 1.0
    sized = {"data.num_clients": devices, "train.clients_per_round": devices}
    cfg = config_for("splitfed_v1", rounds=25, **sized, **net)
    try:
        result = splitfl.run(cfg, run_dir=folder / "run")
        rows, status = result.metrics, result.summary["status"]
    finally:
        for t in threads:
            t.join(30)
        relay.stop()
    cut_rounds = [r["round"] for r in rows if r["dropped_clients"]]
    gone = sorted(set(rows[-1]["dropped_clients"]) | {i for i, t in enumerate(threads) if t.code})
    return {
        "status": status,
        "rounds_with_drops": cut_rounds,
        "devices_lost_for_good": len(gone),
        "exit_codes": [t.code for t in threads],
    }


# --------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--wreck-points", type=float, default=10.0)
    parser.add_argument("--stall-factor", type=float, default=3.0)
    parser.add_argument("--only", default="")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--false-positives", action="store_true", help="honest runs only")
    parser.add_argument(
        "--false-positive-rate", action="store_true", help="issue 51 item 3: honest drop rate"
    )
    parser.add_argument(
        "--tradeoff", action="store_true", help="issue 51 item 3: rules, attacks vs honest"
    )
    parser.add_argument("--honest-rounds", type=int, default=20)
    parser.add_argument(
        "--untrusted-aggregation",
        choices=UNTRUSTED_AGGREGATIONS,
        default=None,
        help="network.untrusted_aggregation of every run and its honest control "
        "(attack cases, --false-positive-rate); default: each case's own",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rule = args.untrusted_aggregation
    chosen = [with_rule(c, rule) for c in cases() if args.only in c.name]
    results, baselines = [], {}
    if args.tradeoff:
        with tempfile.TemporaryDirectory() as tmp:
            rows = tradeoff(
                Path(tmp), args.rounds, args.honest_rounds, args.only, args.wreck_points
            )
        report = {"date": str(datetime.date.today()), "rounds": args.rounds, "rules": rows}
        report["honest_rounds"] = args.honest_rounds
        out = args.out or Path(__file__).parent / "results" / "attacks-tradeoff.json"
        out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        print(f"wrote {out}")
        return 0
    if args.false_positive_rate:
        with tempfile.TemporaryDirectory() as tmp:
            rate = false_positive_rate(Path(tmp), args.rounds, args.only, rule)
        report = {"date": str(datetime.date.today()), "rounds": args.rounds, **rate}
        report["untrusted_aggregation"] = rule or NetworkConfig.untrusted_aggregation
        out = args.out or Path(__file__).parent / "results" / "attacks-fp-rate.json"
        out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        print(f"{rate['dropped']} of {rate['client_rounds']} honest client-rounds dropped; {out}")
        return 0
    if args.false_positives:
        with tempfile.TemporaryDirectory() as tmp:
            fp = false_positives(Path(tmp), args.rounds)
        total = sum(r["untrusted"]["client_rounds_dropped"] for r in fp)
        report = {"date": str(datetime.date.today()), "rounds": args.rounds, "dropped": total}
        out = args.out or Path(__file__).parent / "results" / "attacks-false-positives.json"
        out.write_text(json.dumps({**report, "runs": fp}, indent=2, allow_nan=False) + "\n")
        print(f"{total} honest client-rounds dropped; wrote {out}")
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        for k, case in enumerate(chosen):
            key = json.dumps([case.algorithm, case.changes, case.devices], sort_keys=True)
            if key not in baselines:
                baselines[key] = networked(case, Path(tmp) / f"base{k}", args.rounds, True)
            run = networked(case, Path(tmp) / f"case{k}", args.rounds, False)
            verdict = judge(run, baselines[key], args.wreck_points, args.stall_factor)
            results.append({"case": case.name, **verdict, "run": run, "baseline": baselines[key]})
            print(_line(results[-1]), flush=True)
        link = None
        if not args.only or "link" in args.only:
            link = link_break(Path(tmp) / "link", 10, cut_after_s=7.0, hold_s=4.0)
            print(f"link break: {link['devices_lost_for_good']} of 10 devices lost", flush=True)
    counts = {k: sum(r[k] for r in results) for k in ("wrecked", "stalled", "stopped", "caught")}
    print(f"{len(results)} insider runs: {counts}")
    report = {"date": str(datetime.date.today()), "rounds": args.rounds, "counts": counts}
    report["untrusted_aggregation"] = rule  # None: each case's own
    report |= {"cases": results, "link_break": link, "splitfl": splitfl.__version__}
    out = args.out or Path(__file__).parent / "results" / f"attacks-{report['date']}.json"
    out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    print(f"wrote {out}")
    return 0


def _line(r: dict) -> str:
    run, base = r["run"], r["baseline"]
    flags = ",".join(k for k in ("wrecked", "stalled", "stopped", "caught") if r[k]) or "-"
    acc = lambda a: "-" if a is None else f"{100 * a:.1f}%"  # noqa: E731
    return (
        f"{r['case']:<28} {flags:<24} acc {acc(run['final_acc'])} (honest "
        f"{acc(base['final_acc'])}), round {run['median_round_s'] or 0:.2f}s "
        f"(honest {base['median_round_s'] or 0:.2f}s), {run['status'][:60]}"
    )


if __name__ == "__main__":
    sys.exit(main())

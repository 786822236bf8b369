"""S²FL (Yan et al., "Have Your Cake and Eat It Too: Toward Efficient and Accurate Split
Federated Learning"): adaptive sliding model split + data balance-based training + layer-wise
aggregation. Spec: ``papers/s2fl.md`` §3 (Algorithms 1–2, Eq. 1–4), defaults from §5.

* Adaptive sliding split (§3.1, Eq. 1): warm-up over the K cut points, the client time table,
  the cut closest to the median (:func:`closest_to_median`, :meth:`S2FL.choose_cuts`), unmeasured
  entries from measured speeds (:func:`measured_device`).
* Round time: Eq. (1), the slowest participant; ``lockstep_barrier`` prices the groups' barrier.
* Data balance grouping (§3.2, Eq. 2–4): :mod:`splitfl.algorithms.s2fl.data_balance`.
* Aggregation (§3.3, Algorithm 1): :func:`splitfl.aggregation.layerwise.layerwise_aggregate`.

How each sentence of the paper is read, and why: ``docs/explanation/readings/s2fl.md``.
Ablations (§5.4): ``s2fl+R`` (neither mechanism: every device on WcK, one server copy per
device = SFL), ``s2fl+B`` (grouping only), ``s2fl+M`` (sliding split only), ``s2fl+MB`` (both).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from splitfl.algorithms.base import Algorithm
from splitfl.algorithms.s2fl.data_balance import balanced_groups, partition_cost
from splitfl.config import ConfigError
from splitfl.core.plan import RoundPlan, RoundReport, RoundResult
from splitfl.core.topology import GROUP_FORWARDS, ServerSpec, Star
from splitfl.system.cost import ClientCost, split_client_cost
from splitfl.system.devices import DeviceProfile


@dataclass(frozen=True)
class S2FLOptions:
    adaptive_split: bool = True
    data_balance: bool = True
    group_size: int = 5
    exact_limit: int = 20000
    restarts: int = 8
    warmup_all_devices: bool = True
    warmup_training: str = "time_only"
    time_table_update: str = "mean"
    group_loss: str = "mean"
    device_grad: str = "own"
    group_forward: str = "concat"
    #: Charge each group's per-iteration lock-step barrier (:func:`lockstep_finish`) on the
    #: clock. Off: the round is Eq. (1)'s max over participants, as §3.1 prints it.
    lockstep_barrier: bool = False

    def __post_init__(self) -> None:
        if self.group_size < 1:
            raise ConfigError("options.s2fl.group_size", f"must be >= 1 (got {self.group_size})")
        if self.warmup_training not in ("time_only", "aggregate"):
            raise ConfigError("options.s2fl.warmup_training", "allowed: time_only, aggregate")
        if self.time_table_update not in ("mean", "last"):
            raise ConfigError("options.s2fl.time_table_update", "allowed: mean, last")
        if self.group_loss not in ("mean", "sum"):
            raise ConfigError("options.s2fl.group_loss", "allowed: mean, sum")
        if self.device_grad not in ("union", "own"):
            raise ConfigError("options.s2fl.device_grad", "allowed: union, own")
        if self.group_forward not in GROUP_FORWARDS:
            raise ConfigError("options.s2fl.group_forward", f"allowed: {', '.join(GROUP_FORWARDS)}")
        if self.exact_limit < 1 or self.restarts < 1:
            raise ConfigError("options.s2fl.exact_limit", "exact_limit and restarts must be >= 1")


def closest_to_median(table: dict[int, dict[int, float]]) -> tuple[dict[int, int], float]:
    """§3.1: median of all x·K entries; each device's cut whose time is closest to it.

    Args:
        table: ``{device: {cut: time}}`` for the round's selected devices.

    Returns:
        ``{device: cut}`` and the median. Ties go to the smaller cut.
    """
    entries = [t for row in table.values() for t in row.values()]
    median = float(np.median(entries))
    choice = {
        dev: min(sorted(row), key=lambda cut, row=row: abs(row[cut] - median))
        for dev, row in table.items()
    }
    return choice, median


def measured_device(obs: list[float]) -> tuple[DeviceProfile, DeviceProfile]:
    """A device's and the server's effective speeds as measured on the clock.

    ``obs`` = [device FLOPs, device compute time, bytes moved, transfer time, server FLOPs,
    server time] (sums over observations, or the latest). Rates are work / time (∞ when no
    time was spent), so Eq. (1) with them reproduces every measured time at the measured cut
    and scales it by FLOPs and bytes at other cuts.
    """

    def rate(work: float, time: float) -> float:
        return work / time if time > 0 else math.inf

    link = rate(obs[2], obs[3])
    device = DeviceProfile(flops=rate(obs[0], obs[1]), uplink=link, downlink=link, kind="measured")
    server = DeviceProfile(flops=rate(obs[4], obs[5]), uplink=math.inf, downlink=math.inf)
    return device, server


def cost_observation(cost: ClientCost, jitter: float) -> list[float]:
    """The work and measured time components of one round's report (see measured_device)."""
    return [
        cost.device_flops,
        cost.device_time * jitter,
        cost.traffic.total,
        cost.comm_time * jitter,
        cost.server_flops,
        cost.server_time * jitter,
    ]


@dataclass(frozen=True)
class WarmupAggregation:
    """A ``time_only`` warm-up round: the selected devices, the only ones aggregated."""

    clients: tuple[int, ...]


class S2FL(Algorithm):
    name = "s2fl"
    needs_class_labels = "data-balance grouping (Eq. 2) needs class labels"
    paper = "Yan et al., S²FL §3 (Alg. 1–2, Eq. 1–4)"
    Options = S2FLOptions

    def __init__(self, options: S2FLOptions, ctx) -> None:
        super().__init__(options, ctx)
        # time_table[device][cut] = [sum of observed times, count, last observed time]
        self.time_table: dict[int, dict[int, list[float]]] = {}
        # measured[device] = {"sum": cost_observation summed, "last": the latest one}
        self.measured: dict[int, dict[str, list[float]]] = {}
        # the round's selected devices while every device takes part in a warm-up round
        self._selected: list[int] | None = None

    @property
    def cut_points(self) -> tuple[int, ...]:
        return self.ctx.cut_points

    def is_warmup(self, round_idx: int) -> bool:
        return self.options.adaptive_split and round_idx < len(self.cut_points)

    def notes(self) -> list[str]:
        """The warm-up's share of the run: one round per cut point (§3.1)."""
        k, rounds = len(self.cut_points), self.ctx.config.rounds
        if not self.options.adaptive_split:
            return []
        left = (
            f"rounds {k + 1}-{rounds} choose cut points adaptively"
            if rounds > k
            else f"every one of the {rounds} rounds is warm-up (none adaptive: use rounds > {k})"
        )
        return [
            f"s2fl: rounds 1-{min(k, rounds)} are the warm-up (§3.1: one round per cut point; "
            f"{k} cut points {list(self.cut_points)}); {left}"
        ]

    def select_clients(self, round_idx: int, rng: np.random.Generator) -> list[int]:
        """The round's x devices; every device in a warm-up round (``warmup_all_devices``),
        the x drawn as usual being the ones aggregated (``warmup_training: time_only``)."""
        selected = super().select_clients(round_idx, rng)
        self._selected = None
        if self.is_warmup(round_idx) and self.options.warmup_all_devices:
            if self.options.warmup_training == "time_only":
                self._selected = selected
            return list(range(self.ctx.num_clients))
        return selected

    def table_time(self, device: int, cut: int, round_idx: int) -> float:
        """A time-table entry: measured (mean or last), else estimated from measurements."""
        del round_idx  # entries change only with measurements
        entry = self.time_table.get(device, {}).get(cut)
        if entry is None:
            return self.estimated_time(device, cut)
        total, count, last = entry
        return total / count if self.options.time_table_update == "mean" else last

    def estimated_time(self, device: int, cut: int) -> float:
        """An unmeasured entry: Eq. (1) at ``cut`` with the device's measured speeds; for a
        device never measured, the median of the measured devices' entries at ``cut``."""
        if device in self.measured:
            key = "sum" if self.options.time_table_update == "mean" else "last"
            dev, server = measured_device(self.measured[device][key])
            b = self.ctx.config.train.batch_size
            samples = self.ctx.round_samples(device, b, self.ctx.local_steps(device, b))
            label_bytes = self.ctx.config.devices.label_bytes
            return split_client_cost(self.ctx.profile, cut, samples, dev, server, label_bytes).time
        at_cut = [self.table_time(d, cut, 0) for d, row in self.time_table.items() if cut in row]
        known = at_cut or [r[0] / r[1] for row in self.time_table.values() for r in row.values()]
        return float(np.median(known)) if known else 0.0

    def choose_cuts(self, round_idx: int, clients: list[int]) -> tuple[dict[int, int], dict]:
        if not self.options.adaptive_split:
            return {c: self.cut_points[-1] for c in clients}, {"split": "fixed WcK"}
        if self.is_warmup(round_idx):
            cut = self.cut_points[round_idx]
            return {c: cut for c in clients}, {"split": "warm-up"}
        table = {c: {k: self.table_time(c, k, round_idx) for k in self.cut_points} for c in clients}
        choice, median = closest_to_median(table)
        return choice, {"split": "adaptive", "median_time": median}

    def choose_groups(
        self, clients: list[int], rng: np.random.Generator
    ) -> tuple[dict[int, int], dict]:
        if not self.options.data_balance:
            return {c: i for i, c in enumerate(clients)}, {}
        hist = self.ctx.label_hist[clients]
        num_groups = math.ceil(len(clients) / self.options.group_size)
        groups, exact = balanced_groups(
            hist, num_groups, rng, self.options.exact_limit, self.options.restarts
        )
        group_of = {clients[i]: g for g, members in enumerate(groups) for i in members}
        cost = partition_cost(hist, groups)
        return group_of, {"grouping_exact": exact, "grouping_distance": cost}

    def warmup_groups(
        self, clients: list[int], rng: np.random.Generator
    ) -> tuple[dict[int, int], dict]:
        """``time_only`` warm-up: the selected devices grouped as in any round, then the timed
        ones among themselves in groups of their own (never mixed with the selected)."""
        selected = self._selected or []
        groups, info = self.choose_groups(selected, rng)
        chosen = set(selected)  # once: the list below is O(N), not O(N·K)
        timed = [c for c in clients if c not in chosen]
        if timed:
            others, _ = self.choose_groups(timed, rng)
            offset = max(groups.values(), default=-1) + 1
            groups.update({c: offset + g for c, g in others.items()})
        return groups, {**info, "warmup_aggregated": list(selected)}

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        cuts, split_info = self.choose_cuts(round_idx, clients)
        if self._selected is not None and self.is_warmup(round_idx):
            groups, group_info = self.warmup_groups(clients, rng)
        else:
            groups, group_info = self.choose_groups(clients, rng)
        tasks = [self.make_task(c, cuts[c], groups[c], round_idx) for c in clients]
        o = self.options
        server = ServerSpec(
            group_loss=o.group_loss, device_grad=o.device_grad, forward=o.group_forward
        )
        topology = Star(server=server, barrier=o.lockstep_barrier)
        keep = group_info.get("warmup_aggregated")
        control = None if keep is None else WarmupAggregation(tuple(keep))
        return RoundPlan(
            tasks, topology=topology, info={**split_info, **group_info}, control=control
        )

    def aggregate(self, global_state: dict, plan: RoundPlan, result: RoundResult) -> dict:
        """Algorithm 1 over the round's devices — in a ``time_only`` warm-up round, over the
        selected ones only (the others were timed, see the module docstring)."""
        if plan.control is not None:
            keep = set(plan.control.clients)
            kept = [u for u in result.updates if u.client in keep]
            result = dataclasses.replace(result, updates=kept)
        return super().aggregate(global_state, plan, result)

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        """§3.1: update the client time table with each device's measured time at its cut,
        and its measured speeds (for entries it has not measured)."""
        for task in plan.tasks:
            c = task.client
            row = self.time_table.setdefault(c, {})
            total, count, _ = row.get(task.cut, [0.0, 0, 0.0])
            t = report.times[c]
            row[task.cut] = [total + t, count + 1, t]
            obs = cost_observation(report.costs[c], report.jitter[c])
            prev = self.measured.get(c, {}).get("sum", [0.0] * len(obs))
            self.measured[c] = {"sum": [a + b for a, b in zip(prev, obs, strict=True)], "last": obs}

    def state_dict(self) -> dict:
        return {
            "time_table": {d: dict(r) for d, r in self.time_table.items()},
            "measured": {d: dict(m) for d, m in self.measured.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.time_table = {
            int(d): {int(k): list(v) for k, v in row.items()}
            for d, row in state["time_table"].items()
        }
        self.measured = {
            int(d): {k: list(v) for k, v in m.items()} for d, m in state.get("measured", {}).items()
        }

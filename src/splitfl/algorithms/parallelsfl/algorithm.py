"""ParallelSFL (Liao et al., "ParallelSFL: A Novel Split Federated Learning Framework Tackling
Heterogeneity Issues"): spec ``papers/parallelsfl.md`` §3.3–4.5 (Alg. 1, Eq. 2–18).

Every worker takes part each round, in clusters of one top worker and N_c bottom workers
(Eq. 2–3); the top worker averages the bottom submodels (Eq. 4) and the PS aggregates the
spliced models with weights N_c·τ_c (Eq. 18, via
:func:`~splitfl.aggregation.layerwise.layerwise_aggregate`).

* State monitoring (§4.2, Eq. 6–7): measured estimates, :mod:`.monitoring`.
* Eq. (8) budget: N_c ≤ B_top·t_ref·``ingress_scale``/b (``ingress_time``).
* Clustering (Alg. 1, Eq. 8–14): :mod:`splitfl.algorithms.parallelsfl.planner`.
* τ_c (Eq. 15–17) on the clock's cluster model, :func:`splitfl.system.cluster.cluster_times`;
  ``beta_c`` chooses Eq. (15)'s β_c.
* Ablations (§5.4): ``parallelsfl-WC``, ``parallelsfl-R``.

How each sentence of the paper is read, and why: ``docs/explanation/readings/parallelsfl.md``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from splitfl.aggregation.layerwise import layerwise_aggregate
from splitfl.algorithms.base import Algorithm, SplitOptions
from splitfl.algorithms.estimates import moving_average
from splitfl.algorithms.parallelsfl.clustering import load_kmeans
from splitfl.algorithms.parallelsfl.frequency import round_waiting
from splitfl.algorithms.parallelsfl.monitoring import radio_observations, record_radios
from splitfl.algorithms.parallelsfl.planner import failed_tops, plan_clusters
from splitfl.algorithms.parallelsfl.problem import Cluster, ClusterInputs
from splitfl.config import ConfigError
from splitfl.core.benching import SitOut
from splitfl.core.plan import ClientTask, RoundPlan, RoundReport
from splitfl.core.topology import Clusters, ServerSpec
from splitfl.system.cluster import ClusterLoad, cluster_times
from splitfl.system.cost import d2d_rate

#: Eq. (15)'s ``β_c`` in the τ_c rule: ``upload`` = the top worker's upload of the submodels to
#: the PS (as printed); ``full`` = all model traffic the clock charges (PS download, bottom
#: parts to the members and back, upload).
BETA_C = ("upload", "full")


@dataclass(frozen=True)
class ParallelSFLOptions(SplitOptions):
    cut: int | None = None
    tau: int = 30
    lam: float = 0.5
    k: int | None = None
    ema: float = 0.8
    ingress_scale: float = 1.0
    ingress_time: float | None = None
    random_clusters: bool = False
    adaptive_tau: bool = True
    max_passes: int = 20
    beta_c: str = "upload"

    def __post_init__(self) -> None:
        checks = {
            "tau": self.tau >= 1,
            "lam": 0 <= self.lam <= 1,
            "k": self.k is None or self.k >= 1,
            "ema": 0 <= self.ema < 1,
            "ingress_scale": 0 < self.ingress_scale <= 1e6,
            "ingress_time": self.ingress_time is None or 0 < self.ingress_time <= 1e6,
            "max_passes": self.max_passes >= 0,
            "beta_c": self.beta_c in BETA_C,
        }
        for name, ok in checks.items():
            if not ok:
                raise ConfigError(f"options.parallelsfl.{name}", f"invalid {getattr(self, name)!r}")


class ParallelSFL(Algorithm):
    name = "parallelsfl"
    needs_class_labels = "clustering by label distributions (KL) needs class labels"
    paper = "Liao et al., ParallelSFL §3.3-4.5 (Alg. 1, Eq. 2-18)"
    Options = ParallelSFLOptions
    topology = Clusters

    def __init__(self, options: ParallelSFLOptions, ctx) -> None:
        super().__init__(options, ctx)
        load_kmeans()  # before the run's thread limits (same numbers in every process)
        self.cut = self.options.cut
        self.mu_b: np.ndarray | None = None
        self.mu_p: np.ndarray | None = None
        self.beta: np.ndarray | None = None
        self.d2d: np.ndarray | None = None
        self.ps: np.ndarray | None = None  # [N, 2]: PS uplink, downlink (B/s)
        self.seen: dict[str, np.ndarray] = {}  # latest reported mu_b, d2d, up, down per worker
        self.tops: dict[int, int] = {}
        #: top workers whose failure dropped their cluster sit out elections (splitfl's
        #: choice, the doubling rule of RingSFL and late clients: :class:`SitOut`)
        self.tops_out = SitOut(1)
        self.members: dict[int, int] = {}
        self._inputs: ClusterInputs | None = None  # the round's Alg. 1 inputs

    # -- per-iteration sizes ---------------------------------------------------------------------
    def bytes_per_iteration(self) -> float:
        """b: smashed data + labels one bottom worker sends per iteration (Eq. 8)."""
        d = self.ctx.config.train.batch_size
        return d * (
            self.ctx.profile.activation_bytes(self.cut) + self.ctx.config.devices.label_bytes
        )

    def gradient_bytes(self) -> float:
        return self.ctx.config.train.batch_size * self.ctx.profile.activation_bytes(self.cut)

    def compute_ratio(self) -> float:
        """μ_p / μ_b on one device: the top and bottom submodels' FLOPs per sample (fixed)."""
        prof = self.ctx.profile
        return prof.server_flops(self.cut) / prof.device_flops(self.cut)

    # -- state monitoring (Eq. 6-7) ------------------------------------------------------------
    def announced(self) -> dict[str, np.ndarray]:
        """Round-0 state collection: the workers' announced profiles (before any report)."""
        devices = [self.ctx.population.at(c, 0) for c in range(self.ctx.num_clients)]
        d = self.ctx.config.train.batch_size
        per_batch = d * self.ctx.profile.device_flops(self.cut)
        return {
            "mu_b": np.array([per_batch / dev.flops for dev in devices]),
            "d2d": np.array([d2d_rate(dev, dev) for dev in devices]),
            "up": np.array([dev.uplink for dev in devices]),
            "down": np.array([dev.downlink for dev in devices]),
        }

    def estimates(self, round_idx: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Eq. (6)-(7): moving averages of the latest reported states (see module docs)."""
        if not self.seen:
            self.seen = self.announced()
        seen, a = self.seen, self.options.ema
        beta = (self.bytes_per_iteration() + self.gradient_bytes()) / np.minimum.outer(
            seen["d2d"], seen["d2d"]
        )
        np.fill_diagonal(beta, 0.0)
        self.mu_b = moving_average(self.mu_b, seen["mu_b"], a)
        self.mu_p = self.mu_b * self.compute_ratio()
        self.beta = moving_average(self.beta, beta, a)
        self.d2d = moving_average(self.d2d, seen["d2d"], a)
        self.ps = moving_average(self.ps, np.stack([seen["up"], seen["down"]], axis=1), a)
        return self.mu_b, self.mu_p, self.beta

    def ingress(self, round_idx: int, mu_b: np.ndarray, beta: np.ndarray) -> np.ndarray:
        """Eq. (8) budget per worker in bytes per iteration (see module docstring)."""
        t_ref = self.options.ingress_time
        if t_ref is None:
            n = len(mu_b)
            mean_beta = beta.sum(1) / max(n - 1, 1)
            t_ref = float(np.median(mu_b + mean_beta))
        return self.d2d * t_ref * self.options.ingress_scale

    # -- the cluster time model (Eq. 9, 15), shared with the clock ------------------------------
    def _server(self):
        pop = self.ctx.population
        return pop.server if pop.shared_server else None

    def _contention(self) -> bool:
        return bool(self.ctx.config.devices.contention)

    def cluster_inputs(self, round_idx: int) -> ClusterInputs:
        """Alg. 1's inputs of the round from the Eq. (6)-(7) estimates (module docstring)."""
        mu_b, mu_p, beta = self.estimates(round_idx)
        dists = self.ctx.label_hist / np.maximum(self.ctx.label_hist.sum(1, keepdims=True), 1)
        self._inputs = ClusterInputs(
            dists,
            mu_b,
            mu_p,
            beta,
            self.ingress(round_idx, mu_b, beta),
            self.bytes_per_iteration(),
            lam=self.options.lam,
            down_bytes=self.gradient_bytes(),
            radio=self.d2d if self._contention() else None,
            excluded_tops=self.tops_out.sitting_out(round_idx),
        )
        return self._inputs

    def _planned_load(self, top: int, members: list[int]) -> ClusterLoad:
        """A cluster's load from the estimates (full batches of the run's batch size): the
        members' loads are those Alg. 1 evaluated (:meth:`ClusterInputs.member_loads`)."""
        bottom = self.ctx.profile.device_bytes(self.cut)
        loads = self._inputs.member_loads(sorted(members), top, bottom)
        ps_up, ps_down = self.ps[top]
        return ClusterLoad(loads, self.d2d[top], ps_up, ps_down, self.ctx.profile.total_bytes)

    def planned_times(self, clusters: list[Cluster]) -> tuple[np.ndarray, np.ndarray]:
        """``(t_c,o, β_c)`` per cluster on the estimates, for Eq. (15)-(17); ``β_c`` per the
        ``beta_c`` option (the upload alone, as Eq. 15 prints it, or all model traffic)."""
        loads = [self._planned_load(int(t), [int(i) for i in m]) for t, m in clusters]
        times = cluster_times(loads, self._server(), self.ctx.config.devices.contention)
        upload = self.options.beta_c == "upload"
        beta_c = [c.model_times[2] if upload else c.beta_c for c in times]
        return np.array([c.t_co for c in times]), np.array(beta_c)

    # -- hooks ---------------------------------------------------------------------------------
    def select_clients(self, round_idx: int, rng: np.random.Generator) -> list[int]:
        """Every worker takes part (as a top or a bottom worker)."""
        return list(range(self.ctx.num_clients))

    def plan_round(self, round_idx: int, clients: list[int], rng: np.random.Generator) -> RoundPlan:
        o = self.options
        clusters, taus, info = plan_clusters(
            self.cluster_inputs(round_idx),
            rng,
            tau=o.tau,
            k=o.k,
            max_passes=o.max_passes,
            random_assignment=o.random_clusters,
            adaptive_tau=o.adaptive_tau,
            cluster_time=self.planned_times,
        )
        lr = self.ctx.lr_at(round_idx)
        d = self.ctx.config.train.batch_size
        tasks, self.tops, self.members = [], {}, {}
        for g, ((top, members), tau_c) in enumerate(zip(clusters, taus.tolist(), strict=True)):
            if not members or tau_c < 1:
                continue
            self.tops[g], self.members[g] = int(top), len(members)
            tasks += [ClientTask(int(c), self.cut, g, d, int(tau_c), lr) for c in members]
        summary = {k: v for k, v in info.items() if not isinstance(v, list | np.ndarray)}
        summary["tops"] = sorted(self.tops.values())
        summary["taus"] = [int(t) for t in taus if t > 0]
        # hosts: each cluster's top part runs on its top worker
        server = ServerSpec(device_grad="own", lr=lr)
        return RoundPlan(
            tasks, topology=Clusters(hosts=dict(self.tops), server=server), info=summary
        )

    def observe(self, round_idx: int, plan: RoundPlan, report: RoundReport) -> None:
        """Record what each bottom worker measured (its compute time; the rate of its smashed
        data and gradients, bytes over measured time) and its top worker (compute; the rates
        of its model transfers with the PS; what its radio carried) for the next round's
        Eq. (6)-(7) estimates (module docstring), and log the measured Eq. (16) waiting."""
        d, ratio = self.ctx.config.train.batch_size, self.compute_ratio()
        full = self.ctx.profile.total_bytes
        cluster_time: dict[int, float] = {}
        d2d: dict[int, list[tuple[int, float]]] = {}  # top -> (member, measured D2D rate)
        ps: dict[int, list[tuple[float, float]]] = {}  # top worker -> measured (up, down)
        top_mu: dict[int, list[float]] = {}  # top worker -> its μ_b as each member measured it
        for task in plan.tasks:
            c, top, cost = task.client, self.tops[task.group], report.costs[task.client]
            jitter = report.jitter[c]
            batches = max(report.samples[c], 1) / d  # measured times are scaled to batch d
            self.seen["mu_b"][c] = cost.device_time * jitter / batches
            # the top worker's compute for this member, as the member's measured time holds it
            # (stretched by the same jitter as the rest of that time)
            top_mu.setdefault(top, []).append(cost.extra["top_compute"] * jitter / batches / ratio)
            sent = cost.traffic.d2d_activations + cost.traffic.d2d_gradients
            if cost.extra["d2d_time"] > 0:
                d2d.setdefault(top, []).append((c, sent / (cost.extra["d2d_time"] * jitter)))
            up, down = (cost.extra[k] * jitter for k in ("ps_up_time", "ps_down_time"))
            if up > 0 and down > 0:
                ps.setdefault(top, []).append((full / up, full / down))
            cluster_time[task.group] = max(cluster_time.get(task.group, 0.0), report.times[c])
        for top, values in top_mu.items():
            self.seen["mu_b"][top] = float(np.mean(values))
        record_radios(self.seen["d2d"], radio_observations(d2d, self._contention()))
        for top, rates in ps.items():
            self.seen["up"][top], self.seen["down"][top] = np.mean(rates, axis=0)
        t_c = np.array(list(cluster_time.values()))
        plan.info["cluster_waiting_clock"] = round_waiting(t_c, t_c > 0)["cluster_waiting"]

    def lost(self, round_idx: int, plan: RoundPlan, dropped: dict[int, str]) -> None:
        """Top workers that dropped their cluster sit out (:attr:`tops_out`); others forgiven."""
        failed = failed_tops(self.tops, dropped)
        for w in self.tops.values():
            if w in failed:
                self.tops_out.fail(w, round_idx)
            else:
                self.tops_out.forgive(w)

    def aggregate(self, global_state, plan: RoundPlan, result) -> dict:
        """Eq. (4) + Eq. (18): per-worker weight τ_c (cluster weight N_c·τ_c)."""
        weights = {t.client: float(t.steps) for t in plan.tasks}
        return layerwise_aggregate(
            global_state, result.updates, result.server_states, weights, self.aggregation
        )

    def state_dict(self) -> dict:
        names = ("mu_b", "mu_p", "beta", "d2d", "ps")
        state = {**{k: getattr(self, k) for k in names}, "seen": self.seen}
        return {**state, "tops_out": self.tops_out.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        for k in ("mu_b", "mu_p", "beta", "d2d", "ps"):
            setattr(self, k, state.get(k))
        self.seen = state.get("seen", {})
        self.tops_out.load_state_dict(state.get("tops_out", {}))  # replaces both maps

"""Preset ``jetson80``: the MergeSFL / ParallelSFL testbed of 80 NVIDIA Jetson workers.

MergeSFL §V-A: 30 Jetson TX2 (4 performance modes), 40 Jetson NX and 10 Jetson AGX (8 modes
each); "the AGX with highest performance mode achieves training by 100× faster than the TX2
with lowest performance mode"; modes are changed at random every 20 rounds. Workers sit in
four groups of 20 at 2, 8, 14 and 20 m from the WiFi routers; bandwidth fluctuates between
1 and 30 Mb/s from round to round.

The paper gives no per-mode speeds, so splitfl models *effective training* FLOP/s per mode as
geometric ladders with the stated 100× end-to-end spread (AGX mode 0 = 1e12, TX2 slowest =
1e10), and each distance group as a uniform bandwidth range narrowing toward the stated 1–30
Mb/s extremes. With ``n != 80`` the 3:4:1 mix and the four groups are kept proportionally.
Everything is drawn from the run's seed, per (client, mode period) and (client, round).

**How the bandwidth varies in time** (``devices.bandwidth_correlation`` = ρ, default
``BANDWIDTH_CORRELATION``). The papers say only that "the bandwidth between the PS and devices
dynamically varies during the training" and that it "fluctuates between 1Mb/s and 30Mb/s"
(MergeSFL §V-A, ParallelSFL §5.1, measured with iperf3). Both estimate each worker's state
from earlier rounds by moving averages (MergeSFL Eq. 5-6, ParallelSFL Eq. 6-7, α = 0.8) and
name link-bandwidth prediction (LinkForecast, MergeSFL [40]) as a drop-in estimator: designs
that presume a worker's bandwidth in round h says something about round h+1. A redraw that is
independent every round (ρ = 0, this preset's earlier model) makes every such estimate noise.
So each worker's bandwidth follows a stationary AR(1) process on the normal scale, mapped to
its group's uniform range: ``z_h = ρ·z_{h-1} + √(1−ρ²)·ε_h``, ``bandwidth = low + (high −
low)·Φ(z_h)``; the marginal per round stays uniform on the group's range (as before), and ρ
sets the round-to-round correlation. ρ = 0.9 (a correlation time of about ten rounds, half the
20-round mode period) is an assumption, not a paper figure; ρ = 0 reproduces the independent
redraws exactly, and ρ = 1 holds each worker's first draw for the whole run. The MergeSFL and
ParallelSFL benchmark READMEs report 0, 0.5, 0.9 and 1 (``timing_setups.py``).

**The PS link** (``SERVER_MBPS``; ``devices.server_rate`` overrides it). §V-A connects every
device to the PS "via WiFi routers" and gives no router or PS figure, while §IV-A says the PS's
ingress bandwidth B^h "is usually limited", so that "it is actually infeasible to allow all
the workers to participate". The PS's traffic crosses the routers' shared WiFi, which splitfl
models as one 200 Mb/s link in each direction: about what a consumer 802.11ac router carries
in total over several clients (SmallNetBuilder, "How Much Throughput Can You Really Get From
An AC Router?": two clients of an AC1900 router together stayed at the ~199 Mb/s of one; its
best single-client figure, in a test chamber, was 409 Mb/s). That is below the 80 workers'
combined links (about 1 Gb/s on average), as §IV-A implies, and above what 10 average
workers send at once (about 126 Mb/s). The value is a modelling choice, not a paper figure;
the MergeSFL benchmark README shows its effect at 100, 200, 400 and 1000 Mb/s (1 Gb/s, a wired
PS port, was the earlier value, which 30 concurrent workers never filled).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from splitfl.core.seeding import rng_for
from splitfl.system.profiles import DeviceProfile, Population

MODE_PERIOD = 20  # rounds between random mode changes (MergeSFL §V-A)
#: Round-to-round correlation ρ of each worker's bandwidth (module docstring: an assumption).
BANDWIDTH_CORRELATION = 0.9
MBPS = 1e6 / 8  # bytes/s per Mb/s

#: Effective training FLOP/s per mode (mode 0 fastest): TX2 4 modes, NX and AGX 8 modes.
MODES = {
    "TX2": tuple(float(v) for v in np.geomspace(4e10, 1e10, 4)),
    "NX": tuple(float(v) for v in np.geomspace(2.5e11, 3e10, 8)),
    "AGX": tuple(float(v) for v in np.geomspace(1e12, 1.2e11, 8)),
}
POWER_W = {"TX2": 15.0, "NX": 15.0, "AGX": 30.0}
KIND_COUNTS = {"TX2": 30, "NX": 40, "AGX": 10}
#: Bandwidth range (Mb/s) per distance group: 2 m, 8 m, 14 m, 20 m from the router.
DISTANCE_MBPS = ((15.0, 30.0), (8.0, 22.0), (3.0, 14.0), (1.0, 8.0))
#: The PS's link (Mb/s, each direction): the shared WiFi of the routers (module docstring).
SERVER_MBPS = 200.0
#: Parameter server: a workstation (four 2080Ti) behind the WiFi routers.
SERVER = DeviceProfile(
    flops=5e13, uplink=SERVER_MBPS * MBPS, downlink=SERVER_MBPS * MBPS, power=250.0, kind="PS"
)


@dataclass(frozen=True)
class JetsonSchedule:
    """Per-round profile of each worker: mode per 20-round period, bandwidth per round."""

    kinds: tuple[str, ...]
    groups: tuple[int, ...]
    seed: int
    correlation: float = BANDWIDTH_CORRELATION
    #: z_0..z_h per client, extended on demand (the AR(1) state is a function of the seed)
    _latent: dict[int, list[float]] = field(default_factory=dict, compare=False, repr=False)

    def mode(self, client: int, round_idx: int) -> int:
        period = round_idx // MODE_PERIOD
        return int(
            rng_for(self.seed, "mode", period, client).integers(len(MODES[self.kinds[client]]))
        )

    def latent(self, client: int, round_idx: int) -> float:
        """AR(1) state ``z_h = ρ·z_{h-1} + √(1−ρ²)·ε_h`` (z_0 = ε_0), ε_h ~ N(0, 1) drawn from
        ``(seed, "bw", h, client)``: standard normal in every round."""
        zs = self._latent.setdefault(client, [])
        rho = self.correlation
        while len(zs) <= round_idx:
            eps = float(rng_for(self.seed, "bw", len(zs), client).standard_normal())
            zs.append(eps if not zs else rho * zs[-1] + math.sqrt(1.0 - rho * rho) * eps)
        return zs[round_idx]

    def bandwidth(self, client: int, round_idx: int) -> float:
        """Uniform on the client's distance-group range in every round; correlated from round
        to round by ρ (module docstring; ρ = 0: the independent redraw, draw for draw)."""
        low, high = DISTANCE_MBPS[self.groups[client]]
        if self.correlation == 0.0:
            return float(rng_for(self.seed, "bw", round_idx, client).uniform(low, high)) * MBPS
        u = 0.5 * (1.0 + math.erf(self.latent(client, round_idx) / math.sqrt(2.0)))
        return (low + (high - low) * u) * MBPS

    def __call__(self, client: int, round_idx: int) -> DeviceProfile:
        kind = self.kinds[client]
        mode = self.mode(client, round_idx)
        rate = self.bandwidth(client, round_idx)
        return DeviceProfile(
            flops=MODES[kind][mode],
            uplink=rate,
            downlink=rate,
            d2d=rate,
            power=POWER_W[kind],
            kind=f"{kind}-mode{mode}-group{self.groups[client]}",
        )


def _proportional(n: int, weights: list[float]) -> list[int]:
    w = np.asarray(weights, dtype=float) / sum(weights)
    counts = np.floor(w * n).astype(int)
    for i in np.argsort(-(w * n - counts))[: n - counts.sum()]:
        counts[i] += 1
    return counts.tolist()


def jetson_population(
    n: int, rng: np.random.Generator, correlation: float = BANDWIDTH_CORRELATION
) -> Population:
    """``n`` Jetson workers (3:4:1 TX2:NX:AGX, four distance groups), shuffled with ``rng``;
    ``correlation``: ρ of the bandwidth's AR(1) process (module docstring)."""
    counts = _proportional(n, list(KIND_COUNTS.values()))
    kinds = [k for k, c in zip(KIND_COUNTS, counts, strict=True) for _ in range(c)]
    kinds = [str(k) for k in rng.permutation(kinds)]
    groups = [g for g, c in enumerate(_proportional(n, [1, 1, 1, 1])) for _ in range(c)]
    groups = [int(g) for g in rng.permutation(groups)]
    schedule = JetsonSchedule(tuple(kinds), tuple(groups), int(rng.integers(2**62)), correlation)
    base = tuple(schedule(c, 0) for c in range(n))
    return Population(base, SERVER, schedule)

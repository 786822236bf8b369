"""Presets that draw a heterogeneous population of devices (the profile types live in
:mod:`splitfl.system.profiles` and are re-exported here)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from splitfl.core.seeding import rng_for
from splitfl.system.jetson import jetson_population
from splitfl.system.profiles import DeviceProfile, DeviceSchedule, Population

S2FL_TABLE1_FLOPS = {"High": 2e10, "Mid": 1e10, "Low": 5e9}
S2FL_TABLE1_RATE = {"High": 5e6, "Mid": 2e6, "Low": 1e6}
S2FL_SERVER = DeviceProfile(flops=5e10, uplink=1e7, downlink=1e7, power=300.0, kind="server")

#: High:Mid:Low proportions of S²FL §5.3 ("conf 1" = 5:3:2, "conf 2" = 2:3:5).
COMPOSITIONS = {"uniform": (1, 1, 1), "5:3:2": (5, 3, 2), "2:3:5": (2, 3, 5)}


def _draw_levels(n: int, composition: str, rng: np.random.Generator) -> list[str]:
    """Draw ``n`` quality levels with exact High:Mid:Low proportions, in random order."""
    weights = np.asarray(COMPOSITIONS[composition], dtype=float)
    counts = np.floor(weights / weights.sum() * n).astype(int)
    for i in np.argsort(-(weights / weights.sum() * n - counts))[: n - counts.sum()]:
        counts[i] += 1
    levels = [lvl for lvl, c in zip(("High", "Mid", "Low"), counts, strict=True) for _ in range(c)]
    return list(rng.permutation(levels))


def s2fl_table1(n: int, rng: np.random.Generator, composition: str = "uniform") -> Population:
    """S²FL Table 1 devices: FLOPS level and rate level drawn independently (9 kinds).

    With ``composition`` other than ``uniform`` both the FLOPS levels and the rate levels follow
    the High:Mid:Low proportions (§5.3 "in both FLOPS settings and transfer rate settings").
    """
    flops_levels = _draw_levels(n, composition, rng)
    rate_levels = _draw_levels(n, composition, rng)
    devices = tuple(
        DeviceProfile(
            flops=S2FL_TABLE1_FLOPS[f],
            uplink=S2FL_TABLE1_RATE[r],
            downlink=S2FL_TABLE1_RATE[r],
            d2d=S2FL_TABLE1_RATE[r],
            power=5.0,
            kind=f"flops={f},rate={r}",
        )
        for f, r in zip(flops_levels, rate_levels, strict=True)
    )
    return Population(devices, S2FL_SERVER)


def jetson80(
    n: int,
    rng: np.random.Generator,
    composition: str = "uniform",
    bandwidth_correlation: float | None = None,
) -> Population:
    """MergeSFL §V-A testbed: 30 TX2, 40 NX, 10 AGX; modes redrawn every 20 rounds; 1-30 Mb/s.

    See :mod:`splitfl.system.jetson` for the mode table and the bandwidth model
    (``bandwidth_correlation``: its ρ; null = ``BANDWIDTH_CORRELATION``).
    """
    if bandwidth_correlation is None:
        return jetson_population(n, rng)
    return jetson_population(n, rng, bandwidth_correlation)


RINGSFL_PC = DeviceProfile(
    flops=1e11, uplink=135e6 / 8, downlink=135e6 / 8, d2d=135e6 / 8, power=65.0, kind="PC"
)
RINGSFL_PI = DeviceProfile(
    flops=5e9, uplink=135e6 / 8, downlink=135e6 / 8, d2d=135e6 / 8, power=6.4, kind="RaspberryPi"
)


def ringsfl_testbed(n: int, rng: np.random.Generator, composition: str = "uniform") -> Population:
    """RingSFL §4.1.1 prototype: 2 PCs (65 W) then 3 Raspberry Pis (6.4 W), 135 Mb/s links.

    Client order is kept (PCs are u_0, u_1 as in the paper; for n != 5 the 2:3 mix is kept).
    The paper gives no FLOPS; splitfl uses 1e11 (PC) and 5e9 (Pi) effective FLOP/s, a 20x
    spread in line with the public propagation-length sweeps (e.g. 6:1:1:1:1).
    """
    pcs = max(1, round(n * 2 / 5)) if n > 1 else 1
    devices = tuple(RINGSFL_PC if i < pcs else RINGSFL_PI for i in range(n))
    # the paper gives no server bandwidth: the PC profile stands in for the server's FLOPS only
    return Population(devices, RINGSFL_PC, shared_server=False)


def homogeneous(n: int, rng: np.random.Generator, composition: str = "uniform") -> Population:
    """Identical mid-level devices (a control with no system heterogeneity)."""
    dev = DeviceProfile(flops=1e10, uplink=2e6, downlink=2e6, d2d=2e6, power=5.0, kind="mid")
    return Population(tuple(dev for _ in range(n)), S2FL_SERVER)


@dataclass(frozen=True)
class VariedSchedule:
    """Time-varying devices on top of any preset (``devices.variation``).

    In period ``p = round // period`` client c's FLOPS are multiplied by ``exp(N(0, σ²))`` and
    its up-, down- and D2D rates by an independent ``exp(N(0, σ²))`` (median 1), both drawn
    from ``(seed, "variation", p, c)`` — background load and changing radio conditions, as the
    jetson80 preset's mode and bandwidth redraws. The papers give no such model for S²FL's
    devices; σ and the period are config values (stated choice).
    """

    base: Population
    sigma: float
    period: int
    seed: int

    def factors(self, client: int, round_idx: int) -> tuple[float, float]:
        rng = rng_for(self.seed, "variation", round_idx // self.period, client)
        speed, rate = rng.lognormal(0.0, self.sigma, size=2)
        return float(speed), float(rate)

    def __call__(self, client: int, round_idx: int) -> DeviceProfile:
        dev = self.base.at(client, round_idx)
        speed, rate = self.factors(client, round_idx)
        return replace(
            dev,
            flops=dev.flops * speed,
            uplink=dev.uplink * rate,
            downlink=dev.downlink * rate,
            d2d=None if dev.d2d is None else dev.d2d * rate,
        )


@dataclass(frozen=True)
class ScaledFlops:
    """A schedule whose profiles' FLOP/s are multiplied by ``scale`` (``devices.flops_scale``)."""

    schedule: DeviceSchedule
    scale: float

    def __call__(self, client: int, round_idx: int) -> DeviceProfile:
        dev = self.schedule(client, round_idx)
        return replace(dev, flops=dev.flops * self.scale)


def with_flops_scale(population: Population, scale: float) -> Population:
    """``population`` with every device's FLOP/s (in every round) times ``scale``; the server's
    unchanged (unchanged population when ``scale`` is 1)."""
    if not scale > 0:
        raise ValueError(f"flops scale must be > 0 (got {scale})")
    if scale == 1.0:
        return population
    devices = tuple(replace(d, flops=d.flops * scale) for d in population.devices)
    schedule = None if population.schedule is None else ScaledFlops(population.schedule, scale)
    return replace(population, devices=devices, schedule=schedule)


def with_variation(population: Population, sigma: float, period: int, seed: int) -> Population:
    """``population`` with :class:`VariedSchedule` applied (unchanged when ``sigma`` is 0)."""
    if sigma <= 0:
        return population
    schedule = VariedSchedule(population, sigma, period, seed)
    return replace(population, schedule=schedule)


PRESETS: dict[str, Callable[..., Population]] = {
    "s2fl_table1": s2fl_table1,
    "homogeneous": homogeneous,
    "jetson80": jetson80,
    "ringsfl_testbed": ringsfl_testbed,
}

#: Presets whose link bandwidth is redrawn every round (``devices.bandwidth_correlation``).
VARYING_BANDWIDTH = ("jetson80",)

#: Whether the time model of each preset's paper shares the server link among the round's
#: participants — the default of ``devices.contention`` (null), so that a paper's preset
#: reproduces that paper's clock. S²FL Eq. (1) charges each device its own rate R (Table 1;
#: ``homogeneous`` is its control); RingSFL's prototype gives every link its own 135 Mb/s;
#: MergeSFL bounds the PS's ingress by a budget B^h (Eq. 10) and ParallelSFL a top worker's
#: by B_c^h (Eq. 8), so their testbed's transfers share those links.
PAPER_CONTENTION: dict[str, bool] = {
    "s2fl_table1": False,
    "homogeneous": False,
    "jetson80": True,
    "ringsfl_testbed": False,
}


def resolve_contention(preset: str, contention: bool | None) -> bool:
    """``devices.contention``: ``contention`` where set, else the preset's paper model
    (:data:`PAPER_CONTENTION`; a preset not listed there: no sharing, as Eq. 1)."""
    return PAPER_CONTENTION.get(preset, False) if contention is None else contention


@dataclass(frozen=True)
class D2DOverride:
    """A schedule whose profiles all have device-to-device rate ``rate``."""

    schedule: DeviceSchedule
    rate: float

    def __call__(self, client: int, round_idx: int) -> DeviceProfile:
        return replace(self.schedule(client, round_idx), d2d=self.rate)


def with_d2d_rate(population: Population, rate: float) -> Population:
    """``population`` with every device's D2D rate set to ``rate`` B/s (``devices.d2d_rate``:
    RingSFL §4.2.3 / Fig. 11-12 sweep the D2D rate; ParallelSFL's clusters use it too)."""
    if not rate > 0:
        raise ValueError(f"d2d rate must be > 0 (got {rate})")
    devices = tuple(replace(d, d2d=rate) for d in population.devices)
    schedule = None if population.schedule is None else D2DOverride(population.schedule, rate)
    return replace(population, devices=devices, schedule=schedule)


def with_server_rate(population: Population, rate: float) -> Population:
    """``population`` with the server's link at ``rate`` B/s each way (``devices.server_rate``),
    shared by the participants' transfers (``shared_server``) since it is now defined."""
    if not rate > 0:
        raise ValueError(f"server rate must be > 0 (got {rate})")
    server = replace(population.server, uplink=rate, downlink=rate)
    return replace(population, server=server, shared_server=True)


def draw_population(
    preset: str,
    n: int,
    rng: np.random.Generator,
    composition: str = "uniform",
    d2d_rate: float | None = None,
    server_rate: float | None = None,
    bandwidth_correlation: float | None = None,
) -> Population:
    """Draw ``n`` device profiles from ``preset`` with ``rng`` (deterministic given the seed);
    ``d2d_rate`` (B/s) replaces every device's D2D rate, ``server_rate`` (B/s) the server's
    link rate, ``bandwidth_correlation`` the round-to-round ρ of a preset whose bandwidth
    varies by round (:data:`VARYING_BANDWIDTH`)."""
    if preset not in PRESETS:
        raise KeyError(f"unknown device preset {preset!r}; choose one of {', '.join(PRESETS)}")
    if bandwidth_correlation is not None:
        if preset not in VARYING_BANDWIDTH:
            raise ValueError(f"preset {preset!r} has no per-round bandwidth to correlate")
        population = PRESETS[preset](n, rng, composition, bandwidth_correlation)
    else:
        population = PRESETS[preset](n, rng, composition)
    if d2d_rate is not None:
        population = with_d2d_rate(population, d2d_rate)
    return population if server_rate is None else with_server_rate(population, server_rate)

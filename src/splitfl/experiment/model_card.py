"""The clock's model card: every decision the simulated clock makes for a config's device preset
and algorithm, its value in the (resolved) config, the paper's model where the paper prints one,
and the source — a quoted sentence with its section, a file of the authors' code, or
"assumption:" with the reason (issue 32 item 10).

``splitfl validate`` prints the card; ``docs/model-cards.md`` is :func:`cards_markdown`
(``splitfl list --model-cards``; a test keeps it in sync); ``tests/models/test_model_cards.py``
checks, decision by decision, that every paper preset's default is the paper's model. A new
realism option adds its row here, defaults to the paper's model on paper presets, and ships a
sensitivity table.

Over 400 lines as one concept, the card: a function of rows per device preset, the algorithms'
rows and the one table they render to; split by preset, the rows a reader compares (a preset's
speeds against the paper's sentence) would sit apart from the table that shows them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from splitfl.algorithms import resolve_algorithm
from splitfl.config import ExperimentConfig
from splitfl.config import load_config as read_config
from splitfl.system import jetson
from splitfl.system.devices import (
    PRESETS,
    RINGSFL_PC,
    RINGSFL_PI,
    S2FL_SERVER,
    S2FL_TABLE1_FLOPS,
    S2FL_TABLE1_RATE,
    resolve_contention,
)

#: The paper model has no such term / no figure (the value is splitfl's choice).
NONE = None


@dataclass(frozen=True)
class Decision:
    """One decision of the clock: ``field`` sets it (``-``: fixed by the preset)."""

    name: str
    field: str
    value: Any
    paper: Any
    source: str

    @property
    def follows_paper(self) -> bool | None:
        """Whether the value is the paper's (None: the paper prints no model for it)."""
        return None if self.paper is NONE else self.value == self.paper


def _common(config: ExperimentConfig, paper_eq: str) -> list[Decision]:
    """Decisions every preset shares: noise, per-message latency, time-varying devices."""
    v = config.devices
    return [
        Decision(
            "per-round noise on each client's time",
            "devices.jitter",
            v.jitter,
            0.0,
            f"{paper_eq} has no noise term",
        ),
        Decision(
            "fixed cost per message exchange (s)",
            "devices.exchange_latency_s",
            v.exchange_latency_s,
            0.0,
            f"{paper_eq}: bytes / rate only",
        ),
        Decision(
            "every device's FLOP/s times",
            "devices.flops_scale",
            v.flops_scale,
            1.0,
            "1 = the preset's speeds; a sensitivity (issue 50 item 1)",
        ),
        Decision(
            "extra log-normal variation of speeds and rates",
            "devices.variation",
            v.variation,
            0.0,
            "none in the paper's device model; a sensitivity (splitfl.system.devices)",
        ),
    ]


def _s2fl_table1(config: ExperimentConfig) -> list[Decision]:
    v = config.devices
    eq1 = "S²FL Eq. (1), §3.1: T = (2|W_c| + 2pq)/R + F_c/Comp_c + F_s/Comp_s"
    return [
        Decision(
            "server link shared by the round's transfers",
            "devices.contention",
            resolve_contention(v.preset, v.contention),
            False,
            f"{eq1} (each device at its own rate R); shared at §5.1's server rate: the next row",
        ),
        Decision(
            "device FLOP/s and rates (High/Mid/Low)",
            "-",
            (tuple(S2FL_TABLE1_FLOPS.values()), tuple(S2FL_TABLE1_RATE.values())),
            ((2e10, 1e10, 5e9), (5e6, 2e6, 1e6)),
            "S²FL Table 1",
        ),
        Decision(
            "server FLOP/s",
            "-",
            S2FL_SERVER.flops,
            5e10,
            'S²FL §5.1: "We assume that the server has ultra-high computing resources, its FLOPS '
            'is set to 5 × 10^10"',
        ),
        Decision(
            "server transfer rate (B/s, each way)",
            "devices.server_rate",
            S2FL_SERVER.uplink if v.server_rate is None else v.server_rate,
            1e7,
            'S²FL §5.1: "and the transfer rate is set to 1 × 10^7"; reading: Eq. (1) charges '
            "each device its own R, so the rate bounds nothing unless the link is shared "
            "(`devices.contention: true`, or setting `devices.server_rate`); shared as printed, "
            "SFL ÷ S²FL per round on Table 3's setup falls from 2.17× to 1.59× (both reported "
            "by benchmarks/papers/timing_tables.py)",
        ),
        Decision(
            "device power (W)",
            "-",
            5.0,
            NONE,
            "assumption: S²FL prints no power; energy is reported, never compared with it",
        ),
        *_common(config, "S²FL Eq. (1)"),
    ]


def _jetson80(config: ExperimentConfig) -> list[Decision]:
    v = config.devices
    rho = (
        jetson.BANDWIDTH_CORRELATION
        if v.bandwidth_correlation is None
        else (v.bandwidth_correlation)
    )
    server = jetson.SERVER_MBPS if v.server_rate is None else v.server_rate / jetson.MBPS
    return [
        Decision(
            "PS link shared by the round's uploads",
            "devices.contention",
            resolve_contention(v.preset, v.contention),
            NONE,
            'reading: MergeSFL §IV-A, Eq. (10): "the available ingress bandwidth B^h of the PS is '
            "usually limited\"; ParallelSFL Eq. (8) bounds a top worker's ingress; neither says "
            "how the time of concurrent transfers is shared (unshared: the jetson-sensitivity "
            "table's row)",
        ),
        Decision(
            "PS link rate (Mb/s, each way)",
            "devices.server_rate",
            server,
            NONE,
            "assumption: §V-A gives no router or PS figure; 200 Mb/s = what a consumer "
            "802.11ac router carries over several clients (splitfl.system.jetson)",
        ),
        Decision(
            "worker bandwidth range (Mb/s)",
            "-",
            (min(r[0] for r in jetson.DISTANCE_MBPS), max(r[1] for r in jetson.DISTANCE_MBPS)),
            (1.0, 30.0),
            'MergeSFL §V-A: "The bandwidth of devices is measured by iperf3 [54], which '
            "fluctuates between 1Mb/s and 30Mb/s\"; the four distance groups' ranges are an "
            "assumption (splitfl.system.jetson)",
        ),
        Decision(
            "round-to-round correlation of a worker's bandwidth",
            "devices.bandwidth_correlation",
            rho,
            NONE,
            'assumption: the papers say only that it "dynamically varies during the training" '
            "and estimate it from earlier rounds (MergeSFL Eq. 5-6); sensitivity 0 / 0.5 / 0.9 "
            "/ 1 (splitfl.system.jetson)",
        ),
        Decision(
            "compute modes' spread (fastest / slowest FLOP/s)",
            "-",
            max(jetson.MODES["AGX"]) / min(jetson.MODES["TX2"]),
            100.0,
            'MergeSFL §V-A: "the AGX with highest performance mode (*i.e.*, mode 0 of AGX) '
            'achieves training by 100× faster than the TX2 with lowest performance mode"; the '
            "ladders between are an assumption",
        ),
        Decision(
            "worker FLOP/s, fastest mode (TX2 / NX / AGX), before devices.flops_scale",
            "-",
            tuple(max(jetson.MODES[k]) for k in ("TX2", "NX", "AGX")),
            NONE,
            'assumption: MergeSFL Table II prints peaks only ("Jetson TX2 1.33 TFLOPs", "Jetson '
            'NX 21 TOPs", "Jetson AGX 32 TOPs"); the level is checked against §II\'s one time '
            'pair ("SFL-BR only takes 5,943s ... SFL-T takes 10,585s"), '
            "benchmarks/papers/mergesfl/calibrate_speeds.py, and swept ×0.25 / ×1 / ×4",
        ),
        Decision(
            "a worker's D2D rate (Mb/s)",
            "devices.d2d_rate",
            "its WiFi rate" if v.d2d_rate is None else v.d2d_rate / jetson.MBPS,
            NONE,
            "assumption: ParallelSFL's bottom workers reach their top worker over the same "
            "WiFi; §5.1 gives no D2D figure, so a worker's D2D rate is its own bandwidth "
            "that round (splitfl.system.jetson)",
        ),
        Decision(
            "rounds between random mode changes",
            "-",
            jetson.MODE_PERIOD,
            20,
            'MergeSFL §V-A: "we randomly change the modes for devices every 20 communication '
            'rounds"',
        ),
        *_common(config, "MergeSFL Eq. (7)"),
    ]


def _ringsfl_testbed(config: ExperimentConfig) -> list[Decision]:
    v = config.devices
    return [
        Decision(
            "server link shared",
            "devices.contention",
            resolve_contention(v.preset, v.contention),
            NONE,
            'reading: §4.1.1 measures "D2D TCP rates of 135 Mbps" per link and §4.2.3 keeps "the '
            'communication rates between the client and the server ... fixed at 135 Mbps"; '
            "whether the laptop server's link is shared by the five clients is not said (§3.3 "
            "charges no sharing)",
        ),
        Decision(
            "client-server rate (Mb/s)",
            "-",
            RINGSFL_PC.uplink * 8 / 1e6,
            135.0,
            'RingSFL §4.2.3: "keeping the communication rates between the client and the '
            'server (both RingSFL and vanilla FL) fixed at 135 Mbps"',
        ),
        Decision(
            "PC / Raspberry Pi FLOP/s",
            "-",
            (RINGSFL_PC.flops, RINGSFL_PI.flops),
            NONE,
            "assumption: the paper names the CPUs only; these two numbers set the FL "
            "crossover D2D rate (benchmarks/papers/ringsfl/crossover.py)",
        ),
        Decision(
            "server FLOP/s",
            "-",
            RINGSFL_PC.flops,
            NONE,
            'assumption: "A laptop is utilized as a parameter server" (§4.1.1), no figure; the '
            "PC's speed stands in (aggregation only: the ring trains on the clients)",
        ),
        Decision(
            "D2D rate (Mb/s)",
            "devices.d2d_rate",
            RINGSFL_PC.d2d * 8 / 1e6 if v.d2d_rate is None else v.d2d_rate * 8 / 1e6,
            135.0,
            'RingSFL §4.1.1: "allowing D2D TCP rates of 135 Mbps"; §4.2.3 sweeps 135, 40, 15, '
            "10 and 5 Mbps",
        ),
        Decision(
            "PC / Raspberry Pi power (W)",
            "-",
            (RINGSFL_PC.power, RINGSFL_PI.power),
            (65.0, 6.4),
            "RingSFL §4.1.1: Raspberry Pi 6.4 W, PC 65 W",
        ),
        *_common(config, "RingSFL §3.3"),
    ]


def _homogeneous(config: ExperimentConfig) -> list[Decision]:
    return [
        Decision(
            "identical devices (1e10 FLOP/s, 2e6 B/s)",
            "-",
            True,
            NONE,
            "assumption: a control with no system heterogeneity (no paper)",
        ),
        *_common(config, "S²FL Eq. (1)"),
    ]


PRESET_CARDS = {
    "s2fl_table1": _s2fl_table1,
    "jetson80": _jetson80,
    "ringsfl_testbed": _ringsfl_testbed,
    "homogeneous": _homogeneous,
}


def _algorithm_rows(config: ExperimentConfig) -> list[Decision]:
    """The algorithm's own clock decisions (round time and budget readings)."""
    cls, options = resolve_algorithm(config.algorithm, config.options)
    name, rows = cls.name, []
    if name == "s2fl":
        rows += [
            Decision(
                "lock-step barrier within a group",
                "options.s2fl.lockstep_barrier",
                options.lockstep_barrier,
                False,
                "S²FL Eq. (1): the round lasts as long as its slowest participant",
            ),
            Decision(
                "warm-up runs every device on each cut",
                "options.s2fl.warmup_all_devices",
                options.warmup_all_devices,
                NONE,
                'reading: §3.1 "sends W_c to all the devices and turns on a timer"; it conflicts '
                "with Table 3: the 3 warm-up rounds on 100 devices move 13,453 MB, more than "
                "S²FL's whole run to 50 % / 60 % at α 0.5 (5,142 / 9,826 MB); with the selected "
                "devices only, 1,363 MB. The traffic claims are reported under both readings "
                "(benchmarks/papers/timing_tables.py)",
            ),
            Decision(
                "the other devices' warm-up updates",
                "options.s2fl.warmup_training",
                options.warmup_training,
                NONE,
                "reading: §3.1 times the other devices (the client time table) and says nothing "
                "of aggregating them; Algorithm 1 aggregates the x selected devices (time_only: "
                "timed and charged, updates discarded; aggregate: all merged)",
            ),
        ]
    elif name == "ringsfl":
        rows.append(
            Decision(
                "round time model",
                "options.ringsfl.pipeline",
                options.pipeline,
                "ideal",
                'RingSFL §3.3, Problem (1): "the computation time consumed by the straggler"',
            )
        )
    elif name == "mergesfl":
        rows += [
            Decision(
                "Eq. (10) iteration time",
                "options.mergesfl.budget_time",
                options.budget_time,
                NONE,
                'reading: Eq. (10) is there "to prevent the PS from becoming a bottleneck" '
                "(§IV-A), so the fastest worker's iteration over its own link",
            ),
            Decision(
                "GA fills the budget among sets with KL ≤ ε",
                "options.mergesfl.fill_budget",
                options.fill_budget,
                NONE,
                'reading: "estimating the available ingress bandwidth B^h becomes vital to '
                'determine the number of selected workers and their corresponding batch sizes" '
                "(§IV-A)",
            ),
        ]
    elif name == "locfedmix_sl":
        rows.append(
            Decision(
                "the PS sends activation gradients back",
                "options.locfedmix_sl.device_update",
                options.device_update,
                NONE,
                'reading: no LocFedMix-SL code; MergeSFL §II-B describes it as "the PS ... sends '
                'the corresponding gradients back to the workers in sequence" and ParallelSFL §2 '
                'as keeping "all the benefits of SplitFed and LocSplitFed": the MergeSFL and '
                "ParallelSFL timing setups use local+server for that reason and report local "
                "(the title's local loss alone, the default here) as a row of its own",
            )
        )
    elif name == "parallelsfl":
        rows.append(
            Decision(
                "β_c in the τ_c rule",
                "options.parallelsfl.beta_c",
                options.beta_c,
                "upload",
                'ParallelSFL §4.4, Eq. (15): "the communication time for the top worker in cluster '
                'c transmitting the submodels to the PS"',
            )
        )
    return rows


def model_card(config: ExperimentConfig) -> list[Decision]:
    """Every clock decision of ``config`` (its preset's, then its algorithm's)."""
    return [*PRESET_CARDS[config.devices.preset](config), *_algorithm_rows(config)]


def _show(value: Any) -> str:
    if isinstance(value, tuple):
        return " / ".join(_show(v) for v in value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).lower() if isinstance(value, bool) else str(value)


def card_table(card: list[Decision]) -> str:
    """A Markdown table: decision, config field, value, the paper's model, source."""
    lines = [
        "| decision | field | value | paper's model | source |",
        "|---|---|---|---|---|",
    ]
    for d in card:
        paper = "none printed" if d.paper is NONE else _show(d.paper)
        mark = "" if d.follows_paper is not False else " (differs)"
        source = d.source.replace("|", "\\|")
        lines.append(f"| {d.name} | `{d.field}` | {_show(d.value)}{mark} | {paper} | {source} |")
    return "\n".join(lines)


#: The paper algorithms whose round time or budget is a decision of their own.
PAPER_ALGORITHMS = ("s2fl", "ringsfl", "mergesfl", "parallelsfl")
#: The baselines with a clock decision of their own (the papers' reading of them).
BASELINE_ALGORITHMS = ("locfedmix_sl",)


def cards_markdown() -> str:
    """``docs/model-cards.md``: each preset's card under its default config, then each paper
    algorithm's own decisions."""
    out = ["# The clock's model cards", "", __doc__.split("\n\n")[0].replace("\n", " "), ""]
    out.append("Generated by `splitfl list --model-cards > docs/model-cards.md`; do not edit.")
    for preset in PRESETS:
        config = read_config(None, [f"devices.preset={preset}"])
        out += ["", f"## Preset `{preset}`", "", card_table(PRESET_CARDS[preset](config))]
    for name in PAPER_ALGORITHMS + BASELINE_ALGORITHMS:
        rows = _algorithm_rows(read_config(None, [f"algorithm={name}"]))
        kind = "Algorithm" if name in PAPER_ALGORITHMS else "Baseline"
        out += ["", f"## {kind} `{name}`", "", card_table(rows)]
    return "\n".join(out) + "\n"

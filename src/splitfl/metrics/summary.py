"""Run summaries from per-round metric rows: final/best accuracy, time and traffic to target."""

from __future__ import annotations

import math
from typing import Any

from splitfl.config import ConfigError
from splitfl.proxies import display_name

#: Without ``eval.target_accuracy``, the common target is this fraction of the lowest best
#: accuracy among the compared runs (so every run reaches it), rounded down to 0.5 %.
DEFAULT_TARGET_FRACTION = 0.95


def target_label(target: float | None) -> str:
    """``0.915`` → ``91.5%`` (column headers of time/traffic to target)."""
    return f"{100 * target:.4g}%" if target else "target"


def check_target(target: Any, field: str = "--target") -> None:
    """An accuracy target is None or a finite number in (0, 1] (one-line ConfigError)."""
    ok = isinstance(target, int | float) and not isinstance(target, bool)
    if target is not None and not (ok and math.isfinite(target) and 0 < target <= 1):
        raise ConfigError(field, f"an accuracy in (0, 1], e.g. 0.9 (got {target!r})")


def target_for(
    best_accs: list[float | None], configured: float | None, chance: float | None = None
) -> float | None:
    """The common accuracy target of several runs (``compare`` and ``report``): the
    configured one, else :data:`DEFAULT_TARGET_FRACTION` of the lowest best accuracy — or
    none when that is not above ``chance`` (1 / number of classes): "time to 9.5 %" on ten
    classes measures nothing a random guess would not reach."""
    if configured is not None:
        return configured
    bests = [b for b in best_accs if b is not None]
    if not bests:
        return None
    automatic = int(min(bests) * DEFAULT_TARGET_FRACTION * 200) / 200
    return automatic if chance is None or automatic > chance else None


def to_target(rows: list[dict[str, Any]], target: float | None) -> dict[str, Any]:
    """First round whose test accuracy reaches ``target``: its simulated time and traffic."""
    if target is None:
        return {"round": None, "sim_time": None, "traffic_bytes": None}
    for row in rows:
        acc = row.get("test_acc")
        if acc is not None and acc >= target:
            return {
                "round": row["round"],
                "sim_time": row["sim_time"],
                "traffic_bytes": row["traffic_total_cum"],
            }
    return {"round": None, "sim_time": None, "traffic_bytes": None}


#: How a run's status begins when it ended at its communication budget
#: (``train.comm_budget_mb``): a finished run, with fewer rounds than configured.
BUDGET_STATUS = "comm budget reached"


def missing_rounds(rows: list[dict[str, Any]]) -> list[int]:
    """Rounds in ``1..last round`` that have no row (a summary must not hide them)."""
    have = {r.get("round") for r in rows}
    last = max((k for k in have if isinstance(k, int)), default=0)
    return [k for k in range(1, last + 1) if k not in have]


def checked_status(rows: list[dict[str, Any]], status: str, planned: int | None) -> str:
    """``status``, unless rows are missing (appended) or an ``ok`` run stopped short of
    ``planned`` rounds (then ``incomplete: ...``): never ``ok`` for an incomplete run."""
    missing = missing_rounds(rows)
    if missing:
        shown = ", ".join(map(str, missing[:10])) + (", ..." if len(missing) > 10 else "")
        gap = f"missing rows for {len(missing)} rounds ({shown})"
        return f"incomplete: {gap}" if status == "ok" else f"{status}; {gap}"
    done = rows[-1].get("round", len(rows)) if rows else 0
    if status == "ok" and planned is not None and done < planned:
        return f"incomplete: {done} of {planned} rounds"
    return status


#: How a finished run's status begins when its test accuracy collapsed (:func:`run_warnings`):
#: never ``ok`` (issue 51: colluders wrecked runs that said ``ok (...)``).
DEGRADED = "degraded"


def is_ok(status: str) -> bool:
    """Whether a summary's status is a finished run's: ``ok``, possibly with what went wrong
    on the way in brackets (``ok (clients 4, 5 without a connected device in 9 of 14
    rounds)``: :func:`network_warnings`), or ``degraded (...)``: finished, its accuracy
    collapsed (:data:`DEGRADED`)."""
    return status == "ok" or status.startswith(("ok (", f"{DEGRADED} ("))


def network_warnings(rows: list[dict[str, Any]]) -> list[str]:
    """What a finished networked run lost on the way, from its rows' ``dropped_reasons``:
    clients whose device was not connected (or lost) in some rounds, abandoned ring rounds,
    and (``executor_events``) ring members benched as late to start; [] for a run that lost
    nothing (and every simulated run)."""
    absent: dict[str, int] = {}
    ring = 0
    for row in rows:
        reasons = _reasons(row)
        for client, why in reasons:
            if why.startswith(ABSENT):
                absent[client] = absent.get(client, 0) + 1
        ring += any(why.startswith(RING_ABANDONED) for _, why in reasons)
    out = []
    if absent:
        worst = max(absent.values())
        clients = sorted((c for c, n in absent.items() if n == worst), key=int)
        named = ", ".join(clients[:8]) + (", ..." if len(clients) > 8 else "")
        out.append(f"clients {named} without a connected device in {worst} of {len(rows)} rounds")
    if ring:
        every = "every ring round" if ring == len(rows) else f"{ring} of {len(rows)} ring rounds"
        out.append(f"{every} abandoned")
    late = [_late_members(row) for row in rows]
    if any(late):
        members = ", ".join(sorted({m for row in late for m in row}, key=int))
        rounds = sum(1 for row in late if row)
        out.append(
            f"ring members {members} late to start in {rounds} of {len(rows)} rounds (benched; "
            f"executor_events in metrics.jsonl)"
        )
    return out


def _late_members(row: dict[str, Any]) -> list[str]:
    """The ring members a row's ``executor_events`` name as late to start
    (``ring member <k> late to start: ...``, :func:`splitfl.net.server.ring.late_starts`)."""
    found = []
    for event in row.get("executor_events") or []:
        words = str(event).split(" ", 3)
        if len(words) == 4 and words[:2] == ["ring", "member"] and words[3].startswith(LATE):
            found.append(words[2])
    return found


#: ``dropped_reasons`` that say a device was not there (:func:`network_warnings`).
ABSENT = ("device not connected", "lost:")
RING_ABANDONED = "ring round abandoned"
#: how an executor event says a ring member was late to start (``splitfl.net.server.lateness``'s
#: ``LATE_START``; ``tests/net/test_ring_late_start.py`` checks the two agree)
LATE = "late to start"


def _reasons(row: dict[str, Any]) -> list[tuple[str, str]]:
    return [(str(c), str(why)) for c, why in (row.get("dropped_reasons") or {}).items()]


def _absent(why: str) -> bool:
    return why.startswith(ABSENT) or why.startswith(RING_ABANDONED)


#: A finished run whose final test accuracy is below this share of its best (reached at
#: this accuracy or more) says so (:func:`run_warnings`): a run that trained and then broke.
#: The defaults of ``eval.collapse_share`` and ``eval.collapse_from`` (their reasons there).
COLLAPSE_SHARE, COLLAPSE_FROM = 0.5, 0.3
#: How that warning begins.
COLLAPSED = "test accuracy collapsed"
#: The default of ``eval.chance_margin`` (its reasons there), and how the warning of a run
#: left at chance while updates were dropped begins (:func:`at_chance`).
CHANCE_MARGIN = 0.05
AT_CHANCE = "test accuracy at chance"


def run_warnings(
    rows: list[dict[str, Any]],
    share: float = COLLAPSE_SHARE,
    least: float = COLLAPSE_FROM,
    chance: float | None = None,
    margin: float = CHANCE_MARGIN,
) -> list[str]:
    """What a reader of an ``ok`` run must know (``summary.json`` ``warnings``, one line
    each; the status of an ``ok`` run carries them in brackets): test accuracy that
    collapsed from its best (below ``share`` × a best of at least ``least``:
    ``eval.collapse_share``, ``eval.collapse_from``) or stayed at ``chance`` while client
    updates were rejected (:func:`at_chance`), devices absent or rings abandoned
    (:func:`network_warnings`), and other client work the server dropped
    (``dropped_reasons``: hostile or stalling devices)."""
    out = []
    evals = [(r["round"], r["test_acc"]) for r in rows if r.get("test_acc") is not None]
    rejected = [[c for c, why in _reasons(r) if not _absent(why)] for r in rows]
    if evals:
        best_round, best = max(evals, key=lambda e: e[1])
        final = evals[-1][1]
        if best >= least and final < share * best:
            out.append(
                f"{COLLAPSED}: {100 * final:.1f}% at the end, "
                f"{100 * best:.1f}% at round {best_round}"
            )
        elif any(rejected) and chance is not None:
            out += at_chance(final, len(rows), chance, margin)
    out += network_warnings(rows)
    if any(rejected):
        count = sum(len(r) for r in rejected)
        clients = sorted({int(c) for r in rejected for c in r})
        shown = ", ".join(map(str, clients[:10])) + (", ..." if len(clients) > 10 else "")
        rounds = sum(1 for r in rejected if r)
        out.append(
            f"{count} client updates dropped in {rounds} of {len(rows)} rounds "
            f"(clients {shown}; dropped_reasons in metrics.jsonl)"
        )
    return out


def at_chance(final: float, rounds: int, chance: float, margin: float) -> list[str]:
    """The warning of a run whose final test accuracy ``final`` is at most ``chance`` (1 /
    the number of classes) + ``margin`` (``eval.chance_margin``) × (1 − ``chance``), asked
    only of runs in which the server rejected client updates (:func:`run_warnings`): an
    honest run at chance (one round, a hard task) is not judged, but one whose devices were
    caught lying and that never left chance was wrecked, not slow (issue 51: one colluder of
    two kept a run at 9.2 % from round 1 with status ``ok``; the collapse rule needs a best
    of ``eval.collapse_from`` first). Empty above the bound."""
    bound = chance + margin * (1 - chance)
    if final > bound:
        return []
    return [
        f"{AT_CHANCE}: {100 * final:.1f}% after {rounds} rounds, at most {100 * bound:.1f}% "
        f"(chance {100 * chance:.1f}% + eval.chance_margin {margin:g}) while client updates "
        f"were dropped"
    ]


def warmup_summary(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A run's warm-up rounds (S²FL §3.1, logged as ``plan_split: warm-up``): how many, the
    simulated time they took, and per round the most devices timed and aggregated (all timed
    ones unless the plan logs ``warmup_aggregated``); None where the run has none."""
    warm = [r for r in rows if r.get("plan_split") == "warm-up"]
    if not warm:
        return None
    return {
        "rounds": len(warm),
        "sim_time": sum(r.get("round_time", 0.0) for r in warm),
        "devices_timed": max(len(r.get("clients", [])) for r in warm),
        "devices_aggregated": max(
            len(r.get("plan_warmup_aggregated", r.get("clients", []))) for r in warm
        ),
    }


def summarize(
    rows: list[dict[str, Any]],
    target: float | None,
    status: str = "ok",
    planned: int | None = None,
    collapse: tuple[float, float] = (COLLAPSE_SHARE, COLLAPSE_FROM),
    chance: tuple[float | None, float] = (None, CHANCE_MARGIN),
) -> dict:
    """Summary of a run (what ``summary.json`` holds and ``compare`` tabulates); ``planned``
    is the configured number of rounds (see :func:`checked_status`); ``collapse``: the run's
    ``(eval.collapse_share, eval.collapse_from)``, ``chance``: its chance accuracy (None:
    not a classifier's) and ``eval.chance_margin`` (:func:`run_warnings`)."""
    evals = [r for r in rows if r.get("test_acc") is not None]
    losses = [r for r in rows if r.get("test_loss") is not None]
    waits = [r["avg_waiting"] for r in rows]
    last = rows[-1] if rows else {}
    status = checked_status(rows, status, planned)
    warnings = run_warnings(rows, *collapse, *chance)
    if status == "ok" and warnings:
        collapsed = any(w.startswith((COLLAPSED, AT_CHANCE)) for w in warnings)
        status = f"{DEGRADED if collapsed else 'ok'} ({'; '.join(warnings)})"
    return {
        "status": status,
        "warnings": warnings,
        "rounds": len(rows),
        "missing_rounds": missing_rounds(rows),
        "final_acc": evals[-1]["test_acc"] if evals else None,
        "best_acc": max(r["test_acc"] for r in evals) if evals else None,
        "final_loss": losses[-1]["test_loss"] if losses else None,
        **final_metrics(rows),
        "sim_time": last.get("sim_time", 0.0),
        "wall_time": last.get("wall_time", 0.0),
        "traffic_bytes": last.get("traffic_total_cum", 0.0),
        "energy_j": sum(r.get("energy_j", 0.0) for r in rows),
        "avg_waiting": sum(waits) / len(waits) if waits else None,
        "target_accuracy": target,
        "to_target": to_target(rows, target),
        "warmup": warmup_summary(rows),
    }


#: Metrics-row keys that are not ``eval.metrics`` values (``test_acc``/``test_loss`` are
#: summarised as ``final_acc``, ``best_acc``, ``final_loss``).
_SUMMARISED = ("test_acc", "test_loss")


def final_metrics(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """``final_<name>``: the last recorded value of each further ``eval.metrics`` entry
    (``test_<name>`` in the rows: ``top5``, ``macro_f1``, ``mse``), and ``final_clients_*``
    of each client-side value (``eval.on: clients | both``: ``clients_acc``, ...)."""
    out: dict[str, Any] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith("test_") and key not in _SUMMARISED and value is not None:
                out[f"final_{key[5:]}"] = value
            elif key.startswith("clients_") and value is not None:  # eval.on: clients, both
                out[f"final_{key}"] = value
    return out


ENERGY_UNITS = (("MJ", 1e6), ("kJ", 1e3), ("J", 1.0))


def energy_unit(joules: float) -> tuple[str, float]:
    """The unit a figure of ``joules`` reads best in (J, kJ or MJ) and its size in J."""
    return next((u for u in ENERGY_UNITS if abs(joules) >= u[1]), ENERGY_UNITS[-1])


def format_energy(joules: float, unit: tuple[str, float] | None = None) -> str:
    """``1500`` → ``1.50 kJ``, ``3.2`` → ``3.20 J``, ``0.004`` → ``0.004 J``: three
    significant digits at least, in ``unit`` (default: :func:`energy_unit`)."""
    name, scale = unit or energy_unit(joules)
    value = joules / scale
    if value == 0 or abs(value) >= 0.01:
        return f"{value:,.2f} {name}"
    return f"{value:.3g} {name}"


def format_value(value: Any, kind: str) -> str:
    """One table cell: ``pct`` (0-1 → %), ``time`` (s), ``energy`` (J, kJ or MJ),
    ``bytes``, ``num`` (4 significant digits)."""
    if value is None:
        return "-"
    if kind == "pct":
        return f"{100 * value:.2f}"
    if kind == "time":
        return f"{value:,.0f}s" if value >= 100 else f"{value:.2f}s"
    if kind == "energy":
        return format_energy(value)
    if kind == "bytes":
        return f"{value / 1e6:,.1f}M"
    if kind == "num":
        return f"{value:.4g}"
    return str(value)


def headline_columns(summaries: dict[str, dict[str, Any]]) -> list[tuple[str, Any]]:
    """The table's quality columns ``(header, cell of a summary)``: accuracy and the time and
    traffic to the target when any run has an accuracy (or none has any metric: ``executor:
    timing``); else (regression, language models) the final loss and each other
    ``final_<metric>`` the runs recorded (``mse``, ``perplexity``, ...)."""
    first = next(iter(summaries.values()), {})
    accuracy = any(s.get("final_acc") is not None for s in summaries.values())
    untrained = all(s.get("final_loss") is None for s in summaries.values())  # executor: timing
    if accuracy or untrained:
        tgt = target_label(first.get("target_accuracy"))
        return [
            ("final acc %", lambda s: format_value(s["final_acc"], "pct")),
            ("best acc %", lambda s: format_value(s["best_acc"], "pct")),
            (f"time to {tgt}", lambda s: format_value(s["to_target"]["sim_time"], "time")),
            (f"traffic to {tgt}", lambda s: format_value(s["to_target"]["traffic_bytes"], "bytes")),
        ]
    keys = ["final_loss"] + sorted(
        {k for s in summaries.values() for k in s if k.startswith("final_")}
        - {"final_acc", "final_loss"}
    )
    return [(k.replace("_", " "), _number_cell(k)) for k in keys]


def _number_cell(key: str):
    return lambda s: format_value(s.get(key), "num")


def comparison_table(summaries: dict[str, dict[str, Any]]) -> str:
    """Markdown table of ``{algorithm: summary}`` (the ``splitfl compare`` output)."""
    quality = headline_columns(summaries)
    header = ["algorithm", *(h for h, _ in quality)]
    header += ["total sim time", "avg waiting", "energy", "status"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, s in summaries.items():
        cells = [display_name(name), *(cell(s) for _, cell in quality)]
        cells += [
            format_value(s["sim_time"], "time"),
            format_value(s["avg_waiting"], "time"),
            format_value(s.get("energy_j"), "energy"),
            s["status"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    notes = [warmup_note(display_name(n), s) for n, s in summaries.items() if s.get("warmup")]
    return "\n".join(lines + ([""] + notes if notes else []))


def warmup_note(name: str, summary: dict[str, Any]) -> str:
    """One line under the comparison table: what a run's warm-up rounds did and cost."""
    w = summary["warmup"]
    return (
        f"{name}: its first {w['rounds']} rounds are the warm-up (S²FL §3.1), each timing "
        f"{w['devices_timed']} devices at one cut point and aggregating "
        f"{w['devices_aggregated']}: {format_value(w['sim_time'], 'time')} of its "
        f"{format_value(summary['sim_time'], 'time')} simulated time."
    )

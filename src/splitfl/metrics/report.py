"""Reports over run directories (``splitfl report DIR``): a sweep, a comparison or one run.

Runs are grouped into *cells* by every varied setting except ``seed`` (a sweep's axes; for
other folders, the config keys that differ between runs). Each cell gets the mean ± std over
its seeds (std with ddof = 1, "—" for one seed) of what :func:`summarize` reports — final
and best accuracy, simulated time and traffic to a common target, final test loss, total
simulated time, waiting time, energy — as in the papers' tables. Trials that did not finish (failed,
diverged, stopped, damaged) are listed as their own rows with their error instead of
breaking the report (:mod:`splitfl.metrics.rundirs` reads the directories). Outputs:
``report.md``, ``report.csv``, ``accuracy_vs_time.png`` (mean curve per cell),
``waiting.png``, ``traffic_to_target.png`` and ``report.html``, a single file with the table
and the plots embedded as data URIs (opens in a browser without a server). Every output is
written atomically (:mod:`splitfl.core.atomic`).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import statistics
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from splitfl.config import ConfigError
from splitfl.core.atomic import creatable_dir_problem, naming, write_atomic
from splitfl.metrics.plots import plot_accuracy, plot_bars, plot_waiting
from splitfl.metrics.rundirs import RunRecord, chance_accuracy, load_runs
from splitfl.metrics.summary import (
    check_target,
    energy_unit,
    format_energy,
    format_value,
    summarize,
    target_for,
    target_label,
)
from splitfl.proxies import display_name

PLOTS = ("accuracy_vs_time.png", "waiting.png", "traffic_to_target.png")

#: (key, column header, format kind, getter on a summary); ``{t}`` is the target accuracy.
METRICS = (
    ("final_acc", "final acc %", "pct", lambda s: s["final_acc"]),
    ("best_acc", "best acc %", "pct", lambda s: s["best_acc"]),
    ("time_to_target", "time to {t}", "time", lambda s: s["to_target"]["sim_time"]),
    ("traffic_to_target", "traffic to {t}", "bytes", lambda s: s["to_target"]["traffic_bytes"]),
    ("final_loss", "final loss", "num", lambda s: s.get("final_loss")),
    ("sim_time", "total sim time", "time", lambda s: s["sim_time"]),
    ("avg_waiting", "avg waiting", "time", lambda s: s["avg_waiting"]),
    ("energy_j", "energy", "energy", lambda s: s.get("energy_j")),
)


@dataclass
class Cell:
    """Runs that differ only in their seed, and their statistics per metric."""

    values: dict[str, Any]
    runs: list[RunRecord]
    stats: dict[str, tuple[float | None, float | None, int]] = field(default_factory=dict)

    @property
    def done(self) -> list[RunRecord]:
        return [r for r in self.runs if r.status == "done"]


@dataclass
class ReportResult:
    """What :func:`report` returns."""

    out_dir: Path
    kind: str
    table: str
    target: float | None
    cells: list[Cell]
    files: dict[str, Path]
    damaged: list[str] = field(default_factory=list)  # "<run>: <file>: <what>" per damaged run


# ----------------------------------------------------------------------------- statistics


def mean_std(values: list[float | None]) -> tuple[float | None, float | None, int]:
    """Mean and sample std (ddof = 1; None for fewer than 2) of the non-None values, and
    how many there were."""
    xs = [float(v) for v in values if v is not None]
    if not xs:
        return None, None, 0
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) >= 2 else None), len(xs)


def group_cells(records: list[RunRecord], axes: list[str]) -> list[Cell]:
    """Runs grouped by every axis except ``seed``, in first-appearance order."""
    keys = [a for a in axes if a != "seed"]
    cells: dict[str, Cell] = {}
    for r in records:
        values = {k: r.values.get(k) for k in keys}
        key = json.dumps(values, sort_keys=True, default=str)
        cells.setdefault(key, Cell(values, [])).runs.append(r)
    return list(cells.values())


def common_configured_target(records: list[RunRecord]) -> float | None:
    """``eval.target_accuracy`` if every finished run sets the same one."""
    targets = {
        ((r.config or {}).get("eval") or {}).get("target_accuracy")
        for r in records
        if r.status == "done"
    }
    return targets.pop() if len(targets) == 1 else None


def _label(values: dict[str, Any], fallback: str) -> str:
    parts = [
        display_name(str(v)) if k == "algorithm" else f"{k.split('.')[-1]}={v}"
        for k, v in values.items()
    ]
    return ", ".join(parts) or fallback


def _cell_id(key: str, value: Any) -> str:
    """A table cell naming an axis value; proxy baselines are marked (``ifca (proxy)``)."""
    return display_name(str(value)) if key == "algorithm" else str(value)


def _mean_curve(runs: list[RunRecord]) -> list[dict[str, Any]]:
    """Mean test accuracy (and its std over the runs) and simulated time per evaluated round
    (rounds all runs share)."""
    evals = [{r["round"]: r for r in run.rows if r.get("test_acc") is not None} for run in runs]
    rounds = sorted(set.intersection(*(set(e) for e in evals))) if evals else []
    return [
        {
            "round": k,
            "sim_time": statistics.fmean(e[k]["sim_time"] for e in evals),
            "test_acc": statistics.fmean(e[k]["test_acc"] for e in evals),
            # the band plotted around the mean (sample std, ddof = 1, as the tables'); none
            # for one seed
            "test_acc_std": (
                statistics.stdev(e[k]["test_acc"] for e in evals) if len(evals) >= 2 else None
            ),
        }
        for k in rounds
    ]


# ----------------------------------------------------------------------------- tables


def _cell_text(stat: tuple[float | None, float | None, int], kind: str, n: int) -> str:
    mean, std, k = stat
    if mean is None:
        return "-"
    if kind == "energy":  # the spread in the mean's unit: 1.50 ± 0.02 kJ
        unit = energy_unit(mean)
        spread = "—" if std is None else format_energy(std, unit).split(" ")[0]
        text = f"{format_energy(mean, unit).split(' ')[0]} ± {spread} {unit[0]}"
    else:
        text = f"{format_value(mean, kind)} ± {format_value(std, kind) if std is not None else '—'}"
    return text + (f" ({k}/{n})" if k < n else "")


def _table(cells: list[Cell], axes: list[str], target: float | None) -> tuple[list, list]:
    """Header and rows (strings) of the report table: one row per cell with a finished run,
    then one per run that did not finish."""
    keys = [a for a in axes if a != "seed"] or ["run"]
    tgt = target_label(target)
    header = [*keys, "n", *(h.format(t=tgt) for _, h, _, _ in METRICS), "status"]
    rows, failed = [], []
    for cell in cells:
        ids = (
            [_cell_id(k, cell.values[k]) for k in keys]
            if cell.values
            else [_label({}, cell.runs[0].name)]
        )
        n_ok = len(cell.done)
        not_done = len(cell.runs) - n_ok
        stats = [_cell_text(cell.stats[key], kind, n_ok) for key, _, kind, _ in METRICS]
        count = str(n_ok) if not not_done else f"{n_ok}/{len(cell.runs)}"
        if n_ok:  # a cell with no finished run shows only as its failed rows
            rows.append([*ids, count, *stats, "ok" if not not_done else f"{not_done} not done"])
        for run in cell.runs:
            if run.status != "done":
                error = (run.error or "").replace("\n", " ")[:160]
                dash = ["—"] * len(METRICS)
                failed.append([*ids, "—", *dash, f"{run.status} ({run.name}): {error}"])
    return header, rows + failed


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, row)) + " |" for row in rows]
    return "\n".join(lines)


def write_csv(cells: list[Cell], axes: list[str], path: Path) -> Path:
    """Raw numbers: per cell the mean and std of each metric; per unfinished run its error."""
    keys = [a for a in axes if a != "seed"]
    header = [*keys, "n_done", "n_runs"]
    header += [f"{m}_{s}" for m, _, _, _ in METRICS for s in ("mean", "std")]
    header += ["status", "run", "error"]
    fh = io.StringIO(newline="")
    out = csv.writer(fh)
    out.writerow(header)
    for cell in cells:
        ids = [cell.values.get(k) for k in keys]
        stats = [x for m, _, _, _ in METRICS for x in cell.stats[m][:2]]
        out.writerow([*ids, len(cell.done), len(cell.runs), *stats, "ok", "", ""])
        for run in cell.runs:
            if run.status != "done":
                blank = [""] * (2 * len(METRICS))
                out.writerow([*ids, 0, 1, *blank, run.status, run.name, run.error or ""])
    return write_atomic(path, fh.getvalue())


# ----------------------------------------------------------------------------- outputs


def write_plots(cells: list[Cell], out: Path, target: float | None, title: str) -> dict[str, Path]:
    """Mean accuracy-vs-time curves, waiting-time bars and traffic-to-target bars per cell."""
    done = [c for c in cells if c.done]
    if not done:
        return {}
    labels = [_label(c.values, c.done[0].name) for c in done]
    curves = {lab: _mean_curve(c.done) for lab, c in zip(labels, done, strict=True)}
    files = {"accuracy_vs_time.png": plot_accuracy(curves, out / "accuracy_vs_time.png", title)}
    waits = {
        lab: {"avg_waiting": c.stats["avg_waiting"][0]} for lab, c in zip(labels, done, strict=True)
    }
    files["waiting.png"] = plot_waiting(
        waits,
        out / "waiting.png",
        {lab: c.stats["avg_waiting"][1] for lab, c in zip(labels, done, strict=True)},
    )
    mb = lambda v: None if v is None else v / 1e6  # noqa: E731
    tgt = target_label(target)
    files["traffic_to_target.png"] = plot_bars(
        {lab: mb(c.stats["traffic_to_target"][0]) for lab, c in zip(labels, done, strict=True)},
        out / "traffic_to_target.png",
        f"traffic to {tgt} (MB)",
        {lab: mb(c.stats["traffic_to_target"][1]) for lab, c in zip(labels, done, strict=True)},
        color="tab:blue",
    )
    return files


def html_page(title: str, intro: str, header: list[str], rows: list[list[str]], plots: dict) -> str:
    """A self-contained HTML page: the table and the PNGs inlined as base64 data URIs."""
    e = html.escape
    head = "".join(f"<th>{e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{e(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    images = "".join(
        f'<figure><img alt="{e(name)}" src="data:image/png;base64,'
        f'{base64.b64encode(path.read_bytes()).decode()}"><figcaption>{e(name)}</figcaption></figure>'
        for name, path in plots.items()
    )
    style = (
        "body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}"
        "td,th{border:1px solid #ccc;padding:4px 8px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}img{max-width:100%}"
    )
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{e(title)}</title>'
        f"<style>{style}</style></head><body><h1>{e(title)}</h1><p>{e(intro)}</p>"
        f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>{images}"
        "</body></html>\n"
    )


def report(
    path: str | Path, out_dir: str | Path | None = None, target: float | None = None
) -> ReportResult:
    """Tabulate and plot a sweep, comparison or run directory (``splitfl report``).

    Args:
        path: The directory to report on.
        out_dir: Where to write the report files (default: ``path`` itself).
        target: Accuracy target (0-1) for time/traffic to target; default: the runs' common
            ``eval.target_accuracy``, else 95 % of the lowest best accuracy (as ``compare``;
            none when that is not above chance, 1 / classes).
    """
    check_target(target)
    folder = Path(path)
    kind, records, axes = load_runs(folder)
    out = Path(out_dir) if out_dir is not None else folder
    problem = creatable_dir_problem(out)
    if problem:
        raise ConfigError("--out", f"{out}: {problem}")
    with naming(out):
        out.mkdir(parents=True, exist_ok=True)
    done = [r for r in records if r.status == "done"]
    target = target_for(
        [
            max((x["test_acc"] for x in r.rows if x.get("test_acc") is not None), default=None)
            for r in done
        ],
        target if target is not None else common_configured_target(records),
        chance_accuracy([r.run_dir for r in done]),
    )
    for r in done:
        r.summary = summarize(r.rows, target, "ok")
    cells = group_cells(records, axes)
    for cell in cells:
        cell.stats = {
            key: mean_std([get(r.summary) for r in cell.done]) for key, _, _, get in METRICS
        }
    header, rows = _table(cells, axes, target)
    table = markdown_table(header, rows)
    n_seeds = "mean ± std over seeds" if "seed" in axes else "one run per row"
    intro = (
        f"{kind} {folder.resolve().name}: {len(done)} of {len(records)} runs finished; "
        f"{n_seeds}; target accuracy {'-' if target is None else f'{100 * target:.1f} %'}; "
        f"written {datetime.now():%Y-%m-%d %H:%M}."
    )
    files = {"report.md": out / "report.md", "report.csv": out / "report.csv"}
    write_atomic(files["report.md"], f"{intro}\n\n{table}\n")
    write_csv(cells, axes, files["report.csv"])
    plots = write_plots(cells, out, target, f"{kind} {folder.resolve().name}")
    files.update(plots)
    files["report.html"] = out / "report.html"
    write_atomic(
        files["report.html"],
        html_page(f"splitfl report: {folder.resolve().name}", intro, header, rows, plots),
    )
    damaged = [f"{r.name}: {r.error}" for r in records if r.status == "damaged"]
    return ReportResult(out, kind, table, target, cells, files, damaged)

"""PNG plots: accuracy vs round and vs simulated time, for one run or several."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from splitfl.core.atomic import write_atomic


def _pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend, imported on first use (a command
    that draws nothing, such as ``splitfl list``, does not pay for it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    """Save ``fig`` as ``path`` atomically (a kill or a full disk leaves no half PNG)."""
    plt = _pyplot()
    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    finally:
        plt.close(fig)


def plot_accuracy(
    runs: dict[str, list[dict[str, Any]]],
    path: Path,
    title: str = "",
    key: str = "test_acc",
    label: str = "test accuracy (%)",
    scale: float = 100.0,
) -> Path:
    """Two panels — test accuracy (or the metrics-row ``key``, times ``scale``, as ``label``)
    vs round and vs simulated time — one line per run."""
    many = len(runs) > 6  # legend beside the panels, and line styles beyond 10 colours
    plt = _pyplot()
    fig, (ax_round, ax_time) = plt.subplots(1, 2, figsize=(14 if many else 11, 4))
    styles = ("-", "--", ":", "-.")
    plotted = False  # runs without evaluations (executor: timing) draw no line
    for k, (name, rows) in enumerate(runs.items()):
        evals = [r for r in rows if r.get(key) is not None]
        if not evals:
            continue
        plotted = True
        acc = [scale * r[key] for r in evals]
        style = {"label": name, "linestyle": styles[(k // 10) % len(styles)]}
        ax_round.plot([r["round"] for r in evals], acc, **style)
        ax_time.plot([r["sim_time"] for r in evals], acc, **style)
    round_axis(ax_round)
    ax_time.set_xlabel("simulated time (s)")
    for ax in (ax_round, ax_time):
        ax.set_ylabel(label)
    return _finish(fig, (ax_round, ax_time), path, title, plotted, many)


def round_axis(ax: Any) -> None:
    """Label an x axis "round", ticks on whole rounds only (no 2.5 with few rounds)."""
    from matplotlib.ticker import MaxNLocator

    ax.set_xlabel("round")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _finish(fig: Any, axes: tuple, path: Path, title: str, plotted: bool, many: bool) -> Path:
    """Grid, legends (beside the last panel for many runs), title; save."""
    for ax in axes:
        ax.grid(alpha=0.3)
    if plotted and many:
        axes[-1].legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    elif plotted:
        for ax in axes:
            if ax.get_lines():
                ax.legend()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return _save(fig, path)


def plot_loss(runs: dict[str, list[dict[str, Any]]], path: Path, title: str = "") -> Path:
    """Two panels — training loss and test loss vs round — one line per run (rounds without
    the value, e.g. between evaluations, are skipped)."""
    many = len(runs) > 6
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(14 if many else 11, 4))
    styles = ("-", "--", ":", "-.")
    plotted = False
    for k, (name, rows) in enumerate(runs.items()):
        style = {"label": name, "linestyle": styles[(k // 10) % len(styles)]}
        for ax, key in zip(axes, ("train_loss", "test_loss"), strict=True):
            points = [(r["round"], r[key]) for r in rows if r.get(key) is not None]
            if points:
                plotted = True
                ax.plot(*zip(*points, strict=True), **style)
    for ax, label in zip(axes, ("training loss", "test loss"), strict=True):
        round_axis(ax)
        ax.set_ylabel(label)
    return _finish(fig, tuple(axes), path, title, plotted, many)


def plot_bars(
    values: dict[str, float | None],
    path: Path,
    ylabel: str,
    errors: dict[str, float | None] | None = None,
    color: str = "tab:orange",
) -> Path:
    """Bar chart, one bar per name (``None`` → 0), optional error bars (e.g. std over seeds)."""
    names = list(values)
    heights = [values[n] or 0.0 for n in names]
    yerr = [(errors or {}).get(n) or 0.0 for n in names] if errors else None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(4, 1.2 * len(names)), 3.5))
    ax.bar(names, heights, yerr=yerr, capsize=4 if yerr else 0, color=color)
    ax.set_ylabel(ylabel)
    ax.grid(axis="y", alpha=0.3)
    if max((len(n) for n in names), default=0) > 12:
        ax.tick_params(axis="x", labelrotation=30)
        plt.setp(ax.get_xticklabels(), ha="right")
    fig.tight_layout()
    return _save(fig, path)


def plot_waiting(
    summaries: dict[str, dict[str, Any]],
    path: Path,
    errors: dict[str, float | None] | None = None,
) -> Path:
    """Bar chart of average waiting time per algorithm (or per cell, with std error bars)."""
    values = {n: s["avg_waiting"] for n, s in summaries.items()}
    return plot_bars(values, path, "avg waiting time per round (s)", errors)

"""PNG plots: accuracy vs round and vs simulated time, for one run or several; loss; bars."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from splitfl.core.atomic import write_atomic


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the file-only Agg backend, imported on first use (a command
    that draws nothing, such as ``splitfl list``, does not pay for it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, path: Path) -> Path:
    """Save ``fig`` as ``path`` atomically (a kill or a full disk leaves no half PNG)."""
    plt = pyplot()
    try:
        return write_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    finally:
        plt.close(fig)


def plot_run(rows: list[dict[str, Any]], run_dir: Path, name: str, metric: str, key: str) -> None:
    """One run's end-of-run plots in ``run_dir``: ``accuracy.png`` (without an accuracy, e.g.
    a regression, ``<metric>.png`` of the metrics-row ``key``; no evaluations, as under
    ``executor: timing``: none) and ``loss.png``, titled ``name`` (the algorithm)."""
    run_dir = Path(run_dir)
    if any(r.get("test_acc") is not None for r in rows):
        plot_accuracy({name: rows}, run_dir / "accuracy.png", name)
    elif any(r.get("test_loss") is not None for r in rows):  # no accuracy metric
        label = f"test {metric}"
        plot_accuracy({name: rows}, run_dir / f"{metric}.png", name, key, label, scale=1.0)
    if any(r.get(k) is not None for r in rows for k in ("train_loss", "test_loss")):
        plot_loss({name: rows}, run_dir / "loss.png", name)


def plot_accuracy(
    runs: dict[str, list[dict[str, Any]]],
    path: Path,
    title: str = "",
    key: str = "test_acc",
    label: str = "test accuracy (%)",
    scale: float = 100.0,
) -> Path:
    """Two panels — test accuracy (or the metrics-row ``key``, times ``scale``, as ``label``)
    vs round and vs simulated time — one line per run, in colour ``C<k>`` (the k-th run's, as
    :func:`plot_waiting`'s bars), with a ± std band where rows hold ``<key>_std`` (a
    report's mean over seeds); a run whose line is another's per round says so in its
    legend entry (it hides under that line)."""
    many = len(runs) > 6  # legend beside the panels, and line styles beyond 10 colours
    plt = pyplot()
    fig, (ax_round, ax_time) = plt.subplots(1, 2, figsize=(14 if many else 11, 4))
    styles = ("-", "--", ":", "-.")
    plotted = False  # runs without evaluations (executor: timing) draw no line
    drawn: dict[tuple, str] = {}  # each line's points → the first run that drew them
    for k, (name, rows) in enumerate(runs.items()):
        evals = [r for r in rows if r.get(key) is not None]
        if not evals:
            continue
        plotted = True
        acc = [scale * r[key] for r in evals]
        points = tuple((r["round"], a) for r, a in zip(evals, acc, strict=True))
        same = drawn.setdefault(points, name)
        shown = name if same == name else f"{name} (= {same} every round: lines coincide)"
        style = {"label": shown, "linestyle": styles[(k // 10) % len(styles)], "color": _colour(k)}
        ax_round.plot([r["round"] for r in evals], acc, **style)
        ax_time.plot([r["sim_time"] for r in evals], acc, **style)
        _band(ax_round, evals, key, scale, _colour(k))
    round_axis(ax_round)
    ax_time.set_xlabel("simulated time (s)")
    for ax in (ax_round, ax_time):
        ax.set_ylabel(label)
    return _finish(fig, (ax_round, ax_time), path, title, plotted, many)


def _colour(k: int) -> str:
    """The k-th run's colour: matplotlib's default cycle, ``C0``..``C9``."""
    return f"C{k % 10}"


def _band(ax: Any, evals: list[dict[str, Any]], key: str, scale: float, colour: str) -> None:
    """Mean ± std of ``key`` per round where the rows hold ``<key>_std`` (over seeds)."""
    rows = [r for r in evals if r.get(f"{key}_std") is not None]
    if rows:
        mean = [scale * r[key] for r in rows]
        std = [scale * r[f"{key}_std"] for r in rows]
        lo = [m - s for m, s in zip(mean, std, strict=True)]
        hi = [m + s for m, s in zip(mean, std, strict=True)]
        ax.fill_between([r["round"] for r in rows], lo, hi, color=colour, alpha=0.2, lw=0)


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
    plt = pyplot()
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
    color: str | list[str] = "tab:orange",
) -> Path:
    """Bar chart, one bar per name (``None`` → 0), optional error bars (e.g. std over seeds);
    ``color`` one for all bars or one per bar."""
    names = list(values)
    heights = [values[n] or 0.0 for n in names]
    yerr = [(errors or {}).get(n) or 0.0 for n in names] if errors else None
    plt = pyplot()
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
    """Bar chart of average waiting time per algorithm (or per cell, with std error bars),
    each bar in its run's line colour of :func:`plot_accuracy` (runs in the same order)."""
    values = {n: s["avg_waiting"] for n, s in summaries.items()}
    colours = [_colour(k) for k in range(len(values))]
    return plot_bars(values, path, "avg waiting time per round (s)", errors, colours)

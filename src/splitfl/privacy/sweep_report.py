"""The privacy–utility sweep's outputs (:mod:`splitfl.privacy.sweep`): ``table.json``
(strict JSON), ``table.md`` and ``privacy_utility.png`` (best attack performance on the
most-leaking device against main-task accuracy, one point per algorithm and defence)."""

from __future__ import annotations

import json
from pathlib import Path

#: ``round``: the recorded round attacked (``target: recorded``; — : the final model).
COLUMNS = ("algorithm", "cut_option", "defence", "round", "device", "cut", "group",
           "batch_size", "attack", "ap", "mp", "dcs", "time_to_target", "traffic_to_target",
           "params")  # fmt: skip


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "—" if value is None else str(value)


def markdown_table(rows: list[dict]) -> str:
    """The rows as a markdown table (one line per device × attack of each run)."""
    lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


#: The attacks of each panel of the plot and what their performance measures.
PANELS = (
    (("unsplit", "unsplit_estimated", "inverse"), "input reconstruction: SSIM"),
    (("labels",), "label inference: AUC"),
)
MARKERS = "osD^vP*X"


def worst_cases(rows: list[dict], attacks: tuple[str, ...]) -> dict[tuple[str, str], tuple]:
    """Per (algorithm, defence): (the best of ``attacks`` on the device it leaks most from,
    main-task accuracy): a defence judged against its best attack on its weakest device."""
    out: dict[tuple[str, str], tuple] = {}
    for r in rows:
        if r["attack"] not in attacks or r["ap"] is None or r["mp"] is None:
            continue
        key = (r["algorithm"], r["defence"])
        if key not in out or r["ap"] > out[key][0]:
            out[key] = (r["ap"], r["mp"])
    return out


def plot_privacy_utility(rows: list[dict], path: Path) -> Path:
    """Attack performance (x) against main-task accuracy (y): a panel per kind of attack
    (:data:`PANELS`, those with rows), a point per algorithm (colour) and defence (marker)
    at its worst case (:func:`worst_cases`); every device's row is in ``table.md``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = [(a, title, worst_cases(rows, a)) for a, title in PANELS]
    panels = [p for p in panels if p[2]] or panels[:1]
    algorithms = sorted({r["algorithm"] for r in rows})
    defences = sorted({r["defence"] for r in rows})
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.2), squeeze=False)
    for ax, (_, title, points) in zip(axes[0], panels, strict=True):
        for (algorithm, defence), (ap, mp) in sorted(points.items()):
            colour = f"C{algorithms.index(algorithm) % 10}"
            marker = MARKERS[defences.index(defence) % len(MARKERS)]
            ax.scatter(ap, mp, color=colour, marker=marker, s=40)
        ax.set_xlabel(f"best attack, most-leaking device ({title.split(': ')[1]})")
        ax.set_title(title, fontsize=10)
        ax.set_xlim(-0.03, 1.03)
    axes[0][0].set_ylabel("main-task accuracy")
    handles = [Patch(color=f"C{i % 10}", label=a) for i, a in enumerate(algorithms)] + [
        plt.Line2D([], [], color="grey", marker=MARKERS[i % len(MARKERS)], linestyle="", label=d)
        for i, d in enumerate(defences)
    ]
    axes[0][-1].legend(handles=handles, fontsize=7, loc="best")
    fig.suptitle("privacy–utility: up-left is better (accurate, little leaked)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_report(result: dict, out: Path) -> None:
    """``table.json``, ``table.md`` and ``privacy_utility.png`` in ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.json").write_text(json.dumps(result, indent=1, allow_nan=False))
    t = "\n".join(f"| {k} | {v:.4f} |" for k, v in result["t_dcs"].items())
    md = markdown_table(result["rows"]) + "\n| cell · attack type | T-DCS |\n|---|---|\n" + t + "\n"
    (out / "table.md").write_text(md)
    plot_privacy_utility(result["rows"], out / "privacy_utility.png")

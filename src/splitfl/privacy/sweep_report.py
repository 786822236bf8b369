"""The privacy–utility sweep's outputs (:mod:`splitfl.privacy.sweep`): ``table.json``
(strict JSON), ``table.md`` and ``privacy_utility.png`` (best attack performance against
main-task accuracy, one point per cell and device)."""

from __future__ import annotations

import json
from pathlib import Path

COLUMNS = ("algorithm", "cut_option", "defence", "device", "cut", "group", "batch_size",
           "attack", "ap", "mp", "dcs", "time_to_target", "traffic_to_target",
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


def plot_privacy_utility(rows: list[dict], path: Path) -> Path:
    """Attack performance (x) against main-task accuracy (y), labelled by cell."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for r in rows:
        if r["ap"] is None or r["mp"] is None:
            continue
        ax.scatter(r["ap"], r["mp"])
        label = f"{r['algorithm']}/{r['defence']}/{r['attack']}/d{r['device']}"
        ax.annotate(label, (r["ap"], r["mp"]), fontsize=6)
    ax.set_xlabel("best attack performance (SSIM or AUC)")
    ax.set_ylabel("main-task accuracy")
    ax.set_title("privacy–utility: up-left is better (accurate, little leaked)")
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

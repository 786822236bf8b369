"""The attack experiment's outputs: ``results.json`` and ``attack.png`` (RingSFL Fig. 15-16)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch


def results_to_json(results: dict) -> dict:
    """``results`` with tensors turned into nested lists (for ``results.json``)."""

    def convert(value):
        if isinstance(value, torch.Tensor):
            return value.tolist()
        if isinstance(value, np.ndarray):
            return value.tolist()
        if isinstance(value, dict):
            return {str(k): convert(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [convert(v) for v in value]
        if isinstance(value, float) and not math.isfinite(value):
            return None
        return value

    return convert(results)


def write_results(results: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``results.json`` and ``attack.png`` to ``out_dir``; returns both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "results.json"
    json_path.write_text(json.dumps(results_to_json(results), indent=1))
    return json_path, plot_attack(results, out / "attack.png")


def _display(img: torch.Tensor) -> np.ndarray:
    """``[C, H, W]`` → an image in [0, 1] for ``imshow`` (min–max scaled)."""
    arr = img.detach().double().numpy()
    lo, hi = arr.min(), arr.max()
    arr = (arr - lo) / (hi - lo) if hi > lo else np.zeros_like(arr)
    return arr[0] if arr.shape[0] == 1 else np.transpose(arr[:3], (1, 2, 0))


def plot_attack(results: dict, path: str | Path) -> Path:
    """Cosine similarity vs iteration for both scenarios (as RingSFL Fig. 15) and the true image
    beside the FedAvg and RingSFL reconstructions (as Fig. 16)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = plt.figure(figsize=(11, 3.4))
    grid = fig.add_gridspec(1, 5)
    ax = fig.add_subplot(grid[0, :2])
    for name, label in (("fedavg", "FedAvg"), ("ringsfl", "RingSFL")):
        cos = results[name]["cosine"]
        ax.plot(
            range(1, len(cos) + 1), cos, label=f"{label} (final {cos[-1]:.3f})" if cos else label
        )
    ax.set_xlabel("attack iteration")
    ax.set_ylabel("cosine similarity (Eq. 9)")
    ax.set_ylim(-1.05, 1.05)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="lower right")
    panels = [
        ("true image", results["true_x"][0]),
        ("FedAvg", results["fedavg"]["reconstruction"][0]),
        ("RingSFL", results["ringsfl"]["reconstruction"][0]),
    ]
    for k, (title, img) in enumerate(panels):
        sub = fig.add_subplot(grid[0, 2 + k])
        sub.imshow(_display(torch.as_tensor(img)), cmap="gray")
        sub.set_title(title)
        sub.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_reconstruction(true_x: torch.Tensor, reconstruction: torch.Tensor, path) -> Path:
    """An image grid: the true inputs (top row) above their reconstructions (bottom row),
    at most 16 columns, each image min–max scaled."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = min(16, len(true_x))
    fig, axes = plt.subplots(2, n, figsize=(1.1 * n + 0.6, 2.6), squeeze=False)
    for row, (title, images) in enumerate((("true", true_x), ("attack", reconstruction))):
        for k in range(n):
            ax = axes[row][k]
            ax.imshow(_display(torch.as_tensor(images[k])), cmap="gray")
            ax.axis("off")
        axes[row][0].set_title(title, fontsize=8, loc="left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path

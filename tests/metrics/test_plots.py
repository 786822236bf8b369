"""Plots: whole-round ticks on round axes, and the loss plot (training and test loss); the
end-of-run plots drawn by a background process (the run's own process never imports
matplotlib; waiting for them, from the API and the command line)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import splitfl
import splitfl.metrics.plots as plots
from splitfl.testing import tiny_config


def rows(n: int, evaluated: bool = True) -> list[dict]:
    return [
        {
            "round": k,
            "sim_time": 10.0 * k,
            "test_acc": 0.1 * k if evaluated else None,
            "test_loss": 2.0 / k if evaluated else None,
            "train_loss": 3.0 / k,
        }
        for k in range(1, n + 1)
    ]


@pytest.fixture
def figures(monkeypatch):
    """The figures the plot functions draw, kept open instead of saved."""
    kept = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: kept.append(fig) or path)
    yield kept
    plt = plots.pyplot()
    for fig in kept:
        plt.close(fig)


def round_ticks(ax) -> list[float]:
    ax.figure.canvas.draw()
    low, high = ax.get_xlim()
    return [t for t in ax.get_xticks() if low <= t <= high]


@pytest.mark.parametrize("n", [2, 3, 5])
def test_round_axes_tick_whole_rounds(figures, tmp_path, n):
    plots.plot_accuracy({"a": rows(n)}, tmp_path / "acc.png")
    plots.plot_loss({"a": rows(n)}, tmp_path / "loss.png")
    acc, loss = figures
    for ax in (acc.axes[0], *loss.axes):
        ticks = round_ticks(ax)
        assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_loss_plot_draws_training_and_test_loss_per_run(figures, tmp_path):
    plots.plot_loss({"a": rows(3), "b": rows(2, evaluated=False)}, tmp_path / "loss.png")
    (fig,) = figures
    train, test = fig.axes
    assert train.get_ylabel() == "training loss" and test.get_ylabel() == "test loss"
    assert [list(line.get_ydata()) for line in train.get_lines()] == [
        [3.0, 1.5, 1.0],
        [3.0, 1.5],
    ]
    assert [list(line.get_ydata()) for line in test.get_lines()] == [[2.0, 1.0, 2.0 / 3]]
    assert [line.get_label() for line in train.get_lines()] == ["a", "b"]


@pytest.mark.parametrize("plots", [True, False])
def test_output_plots_draws_the_run_plots_or_none(tmp_path, plots):
    """``output.plots`` (on by default) draws ``accuracy.png`` and ``loss.png`` when the run
    ends; off, the run directory holds no PNG and the metrics are the same."""
    assert splitfl.ExperimentConfig().output.plots is True
    cfg = tiny_config(algorithm="fedavg", rounds=1, **{"output.plots": plots})
    result = splitfl.run(cfg, run_dir=tmp_path / "r")
    assert result.wait_plots() is True
    pngs = sorted(p.name for p in result.run_dir.glob("*.png"))
    assert pngs == (["accuracy.png", "loss.png"] if plots else [])
    assert result.metrics[0]["test_acc"] is not None


def test_coinciding_lines_say_so_and_bars_take_the_lines_colours(figures, tmp_path):
    """Issue 52 item 10: FedAvg's line hidden under SplitFed V1's (identical per round) is
    named in the legend; ``waiting.png``'s bars have the lines' colours."""
    runs = {"fedavg": rows(3), "splitfed_v1": rows(3), "s2fl": rows(4)}
    plots.plot_accuracy(runs, tmp_path / "a.png")
    ax = figures[0].axes[0]
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels == ["fedavg", "splitfed_v1 (= fedavg every round: lines coincide)", "s2fl"]
    colours = [line.get_color() for line in ax.get_lines()]
    summaries = {name: {"avg_waiting": 1.0 + k} for k, name in enumerate(runs)}
    plots.plot_waiting(summaries, tmp_path / "w.png")
    from matplotlib.colors import to_hex

    bars = [to_hex(bar.get_facecolor()) for bar in figures[1].axes[0].patches]
    assert bars == [to_hex(c) for c in colours]


def test_a_mean_curve_with_a_std_draws_a_band(figures, tmp_path):
    curve = [{**r, "test_acc_std": 0.02} for r in rows(3)]
    plots.plot_accuracy({"cell": curve, "one seed": rows(3)}, tmp_path / "a.png")
    bands = figures[0].axes[0].collections
    assert len(bands) == 1  # the cell's band; one seed draws none


def test_the_compare_title_names_the_partitions_parameter():
    from splitfl.config import DataConfig
    from splitfl.experiment.compare import partition_label

    assert partition_label(DataConfig(alpha=0.5)) == "dirichlet α=0.5"
    assert partition_label(DataConfig(p=2.0)) == "dirichlet p=2"
    assert partition_label(DataConfig(partition="shards")) == "shards (2 classes per client)"


def test_the_run_returns_before_its_plots_and_never_imports_matplotlib(tmp_path):
    """``splitfl.run`` returns once ``summary.json`` is written: the plots are drawn by a
    background process, so the run's own process never imports matplotlib (it did, 0.6 s a
    run: issue 54); :meth:`RunResult.wait_plots` then finds both PNGs written, and they are
    the PNGs :func:`plots.plot_run` draws from the run's rows (same sizes: same pixels)."""
    cfg = tiny_config(algorithm="fedavg", rounds=2, **{"output.plots": True})
    script = textwrap.dedent(
        """
        import json, sys
        import splitfl
        result = splitfl.run(json.loads(sys.argv[1]), run_dir=sys.argv[2])
        print(json.dumps({
            "matplotlib": "matplotlib" in sys.modules,
            "summary": (result.run_dir / "summary.json").is_file(),
            "drawn": result.wait_plots(),
            "pngs": sorted(p.name for p in result.run_dir.glob("*.png")),
        }))
        """
    )
    run_dir = tmp_path / "r"
    out = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cfg), str(run_dir)],
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(out.stdout.splitlines()[-1])
    assert seen == {
        "matplotlib": False,
        "summary": True,
        "drawn": True,
        "pngs": ["accuracy.png", "loss.png"],
    }
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    plots.plot_run(rows, tmp_path, "fedavg", "accuracy", "test_acc")
    for name in ("accuracy.png", "loss.png"):
        assert (tmp_path / name).read_bytes() == (run_dir / name).read_bytes()


def test_the_command_line_waits_for_the_plots(tmp_path, capsys):
    """``splitfl run`` exits only once the plots are written (the background process's
    pending plots are waited for before the command returns)."""
    from splitfl.cli.main import main

    cfg = tmp_path / "c.yaml"
    cfg.write_text(json.dumps(tiny_config(algorithm="fedavg", rounds=1, **{"output.plots": True})))
    assert main(["run", str(cfg), "--out", str(tmp_path / "r")]) == 0
    assert sorted(p.name for p in (tmp_path / "r").glob("*.png")) == ["accuracy.png", "loss.png"]
    assert splitfl.wait_plots() is True  # nothing left pending


def test_a_plot_that_cannot_be_drawn_is_one_warning(tmp_path, capsys):
    """A plot process that fails (here: the run directory is gone before it draws) is one
    ``warning:`` line when waited for, not a traceback; the run's result stands."""
    from splitfl.metrics.background import start_plotter

    (tmp_path / "gone").mkdir()
    plotter = start_plotter(tmp_path / "gone", {"name": "a", "metric": "accuracy", "key": "x"})
    (tmp_path / "gone").rmdir()
    plotter.draw()
    assert splitfl.wait_plots(tmp_path / "gone") is False
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"warning: {tmp_path / 'gone'}: plots not drawn: ")
    assert "FileNotFoundError" in err[0]

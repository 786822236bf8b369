"""Progress without a terminal (issue 34, item 9): one line per round instead of a bar's
carriage-return frames; a bar on a terminal."""

from __future__ import annotations

import io

import splitfl
from conftest import tiny_config
from splitfl.experiment.progress import RoundLines, round_figures, round_progress
from splitfl.experiment.runner import as_config


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_run_without_a_terminal_prints_one_line_per_round(tmp_path, capsys):
    cfg = tiny_config(algorithm="fedavg", rounds=3, **{"output.progress": True})
    splitfl.run(cfg, run_dir=tmp_path / "r")
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("fedavg: round")]
    assert [line.split()[2] for line in lines] == ["1/3", "2/3", "3/3"]
    assert all(" acc=" in line and " sim=" in line for line in lines)
    assert "\r" not in err


def test_a_terminal_gets_a_bar_and_progress_false_prints_nothing():
    config = as_config(tiny_config(rounds=4))
    bar = round_progress(config, 1, True, stream=Terminal())
    assert type(bar).__name__ == "tqdm" and list(bar) == [1, 2, 3]
    quiet = round_progress(config, 0, False, stream=io.StringIO())
    assert type(quiet).__name__ == "tqdm" and quiet.disable


def test_round_lines_and_figures_by_hand():
    out = io.StringIO()
    lines = RoundLines(2, 4, "s2fl", out)
    for r in lines:
        lines.set_postfix(**round_figures({"test_acc": 0.5 + r / 10, "test_loss": 1.0}, 150.0))
    assert (
        out.getvalue() == "s2fl: round 3/4 acc=0.700 sim=150s\ns2fl: round 4/4 acc=0.800 sim=150s\n"
    )
    assert round_figures({"test_acc": None, "test_loss": 0.123456}, 1.5) == {
        "loss": "0.1235",
        "sim": "1.50s",
    }
    assert round_figures({"test_loss": None, "train_loss": 2.0}, 0.0)["train_loss"] == "2"

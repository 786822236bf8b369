"""An interrupt in the middle of a round keeps every finished round (issue 34 item 4): the
checkpoint holds the last recorded round, and a resume equals the uninterrupted run."""

from __future__ import annotations

import pytest
import torch

import splitfl
import splitfl.experiment.loop as loop
from splitfl.cli.main import main
from splitfl.experiment.guards import RunInterrupted
from splitfl.testing import tiny_config


def test_ctrl_c_mid_round_checkpoints_the_last_finished_round(tmp_path, monkeypatch):
    cfg = tiny_config(rounds=5, **{"output.checkpoint_every": 10})  # no periodic checkpoint
    full = splitfl.run(cfg, run_dir=tmp_path / "full")
    real = loop.play_round

    def interrupted(prep, executor, st, r, *args):
        if r == 3:  # the fourth round has begun: the first three are recorded
            raise KeyboardInterrupt
        return real(prep, executor, st, r, *args)

    monkeypatch.setattr(loop, "play_round", interrupted)
    with pytest.raises(RunInterrupted, match="checkpoint at round 3 kept"):
        splitfl.run(cfg, run_dir=tmp_path / "cut")
    monkeypatch.setattr(loop, "play_round", real)
    saved = torch.load(tmp_path / "cut" / "checkpoints" / "last.pt", weights_only=True)
    assert saved["round"] == 3
    resumed = splitfl.resume(tmp_path / "cut")
    drop = ("wall_time",)
    rows = [
        [{k: v for k, v in r.items() if k not in drop} for r in x.metrics] for x in (full, resumed)
    ]
    assert rows[0] == rows[1]
    a = torch.load(full.run_dir / "model.pt", weights_only=True)
    b = torch.load(resumed.run_dir / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_more_rounds_extend_a_finished_run_exactly(tmp_path, capsys):
    """Issue 34 item 7: ``splitfl run --resume DIR rounds=N`` continues a finished run to N
    rounds, equal to a run of N rounds; ``config.yaml`` records N; fewer rounds than the
    checkpoint's are refused in one line and leave ``config.yaml`` as it was."""
    cfg = tiny_config(rounds=4, **{"output.checkpoint_every": 2})
    full = splitfl.run(cfg, run_dir=tmp_path / "full")
    short = splitfl.run(
        tiny_config(rounds=2, **{"output.checkpoint_every": 2}), run_dir=tmp_path / "short"
    )
    before = (short.run_dir / "config.yaml").read_text()
    assert main(["run", "--resume", str(short.run_dir), "rounds=1", "--no-progress"]) == 2
    assert "--resume" in capsys.readouterr().err
    assert (short.run_dir / "config.yaml").read_text() == before
    assert main(["run", "--resume", str(short.run_dir), "rounds=4", "--no-progress"]) == 0
    assert "rounds: 4" in (short.run_dir / "config.yaml").read_text()
    a = torch.load(full.run_dir / "model.pt", weights_only=True)
    b = torch.load(short.run_dir / "model.pt", weights_only=True)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert main(["run", "--resume", str(short.run_dir), "seed=1"]) == 2  # only rounds

"""splitfl report on hand-made run directories: cells, mean ± std over seeds, failed rows,
CSV, plots and a self-contained HTML page."""

import csv
import json
import re

import pytest
import yaml

import splitfl
from splitfl.cli.main import main
from splitfl.config import ConfigError
from splitfl.metrics.report import mean_std


def _run_dir(folder, algorithm, seed, accs, rounds=None, alpha=0.5, waiting=1.0):
    """A finished run directory with one evaluated row per accuracy."""
    folder.mkdir(parents=True)
    rounds = rounds or len(accs)
    config = {"algorithm": algorithm, "seed": seed, "rounds": rounds, "data": {"alpha": alpha}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config))
    rows = [
        {
            "round": i + 1,
            "sim_time": 10.0 * (i + 1) * (2 if algorithm == "fedavg" else 1),
            "wall_time": 0.1,
            "test_acc": acc,
            "test_loss": 1.0,
            "avg_waiting": waiting,
            "energy_j": 100.0,
            "traffic_total_cum": 1e6 * (i + 1),
        }
        for i, acc in enumerate(accs)
    ]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    status = {"status": "ok", "rounds": len(rows)}
    (folder / "summary.json").write_text(json.dumps(status))
    return folder


def _grid(root):
    _run_dir(root / "s2fl-0", "s2fl", 0, [0.4, 0.6], waiting=1.0)
    _run_dir(root / "s2fl-1", "s2fl", 1, [0.5, 0.8], waiting=3.0)
    _run_dir(root / "fedavg-0", "fedavg", 0, [0.3, 0.7])
    failed = root / "fedavg-1"
    failed.mkdir()
    (failed / "error.json").write_text(json.dumps({"status": "failed", "error": "disk full"}))
    stopped = _run_dir(root / "fedavg-2", "fedavg", 2, [0.2], rounds=2)
    (stopped / "summary.json").unlink()


def test_mean_std_uses_sample_std():
    assert mean_std([0.5, 0.7, None]) == pytest.approx((0.6, 0.1414213, 2))
    assert mean_std([0.5]) == (0.5, None, 1)
    assert mean_std([None]) == (None, None, 0)


def test_report_groups_seeds_into_cells_with_mean_and_std(tmp_path):
    _grid(tmp_path / "runs")
    result = splitfl.report(tmp_path / "runs", target=0.5)
    assert result.kind == "runs"
    lines = result.table.splitlines()
    assert lines[0].startswith("| algorithm | n | final acc % | best acc % | time to 50% |")
    # fedavg-1 failed before writing its config, so only fedavg-0/-2 are known to be fedavg
    fedavg = next(line for line in lines if line.startswith("| fedavg | 1/2 |"))
    s2fl = next(line for line in lines if line.startswith("| s2fl | 2 |"))
    # s2fl: final 0.6, 0.8 -> 70.00 ± 14.14; time to 50 %: 20 s and 10 s -> 15.00s ± 7.07s
    assert "| 70.00 ± 14.14 |" in s2fl and "| 15.00s ± 7.07s |" in s2fl
    assert "| 2.00s ± 1.41s |" in s2fl  # waiting 1 and 3
    assert "| 70.00 ± — |" in fedavg and "| 40.00s ± — |" in fedavg and "1 not done" in fedavg
    assert any("failed (fedavg-1): disk full" in line for line in lines)
    assert any("incomplete (fedavg-2): stopped after 1 of 2 rounds" in line for line in lines)

    with open(result.files["report.csv"]) as fh:
        rows = list(csv.DictReader(fh))
    s2fl_row = next(r for r in rows if r["algorithm"] == "s2fl")
    assert float(s2fl_row["final_acc_mean"]) == pytest.approx(0.7)
    assert float(s2fl_row["final_acc_std"]) == pytest.approx(0.1414213)
    assert {r["status"] for r in rows} == {"ok", "failed", "incomplete"}

    for name in ("accuracy_vs_time.png", "waiting.png", "traffic_to_target.png", "report.md"):
        assert (tmp_path / "runs" / name).stat().st_size > 0
    page = result.files["report.html"].read_text()
    sources = re.findall(r'(?:src|href)="([^"]*)"', page)
    assert len(sources) == 3 and all(s.startswith("data:image/png;base64,") for s in sources)
    assert 'src="http' not in page and "<table>" in page and "disk full" in page


def test_report_reads_sweep_compare_and_single_run_directories(tmp_path, capsys):
    run = _run_dir(tmp_path / "one", "s2fl", 0, [0.5, 0.9])
    single = splitfl.report(run)
    assert single.kind == "run" and "| s2fl-0 |" not in single.table
    assert "| one | 1 | 90.00 ± — |" in single.table

    cmp = tmp_path / "cmp"
    _run_dir(cmp / "fedavg", "fedavg", 0, [0.5])
    _run_dir(cmp / "s2fl", "s2fl", 0, [0.6])
    (cmp / "comparison.md").write_text("")
    assert main(["report", str(cmp), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert "| fedavg | 1 | 50.00 ± — |" in out and (tmp_path / "r" / "report.html").exists()

    sweep = tmp_path / "sweep"
    _run_dir(sweep / "a0", "s2fl", 0, [0.5], alpha=0.1)
    _run_dir(sweep / "a1", "s2fl", 1, [0.7], alpha=0.1)
    trials = [
        {"name": "a0", "dir": "a0", "values": {"data.alpha": 0.1, "seed": 0}, "status": "done"},
        {"name": "a1", "dir": "a1", "values": {"data.alpha": 0.1, "seed": 1}, "status": "done"},
        {
            "name": "b0",
            "dir": "b0",
            "values": {"data.alpha": -1, "seed": 0},
            "status": "failed",
            "error": "data.alpha: must be > 0",
        },
    ]
    index = {"name": "s", "axes": ["data.alpha", "seed"], "trials": trials}
    (sweep / "trials.json").write_text(json.dumps(index))
    result = splitfl.report(sweep)
    assert result.kind == "sweep"
    assert "| 0.1 | 2 | 60.00 ± 14.14 |" in result.table
    assert "failed (b0): data.alpha: must be > 0" in result.table


def test_report_of_a_folder_without_runs_is_a_one_line_error(tmp_path):
    with pytest.raises(ConfigError, match="holds no run"):
        splitfl.report(tmp_path)

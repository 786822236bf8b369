"""The trained reproductions of the papers' headline claims (issue 50 item 7;
``benchmarks/papers/trained.py``): time to target on a hand-made metrics series, the pair
ratios and verdict words by hand, every variant's config valid, and the tiny mode runs and
resumes."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from splitfl.experiment.runner import as_config

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "papers"))
from trained import (  # noqa: E402
    DIRECTION,
    FAILS,
    HOLDS,
    UNREACHED,
    config_for,
    load_run,
    main,
    pair_rows,
    resolve_targets,
    time_to_target,
    verdict,
)
from trained_setups import CLAIMS, MODES  # noqa: E402


def _rows(accs, dt=10.0, mb=5.0):
    """Rounds 1.. with ``accs`` (None: no evaluation), ``dt`` s and ``mb`` MB per round."""
    return [
        {"round": k, "sim_time": dt * k, "traffic_total_cum": mb * k * 1e6, "test_acc": a}
        for k, a in enumerate(accs, 1)
    ]


def test_time_to_target_is_the_first_evaluated_round_reaching_it():
    rows = _rows([0.5, None, 0.79, None, 0.80, 0.95, 0.7])
    assert time_to_target(rows, 0.8) == {"round": 5, "time": 50.0, "mb": 25.0}
    assert time_to_target(rows, 0.9) == {"round": 6, "time": 60.0, "mb": 30.0}
    assert time_to_target(rows, 0.5) == {"round": 1, "time": 10.0, "mb": 5.0}
    assert time_to_target(rows, 0.96) is None  # never reached, though later rows exist


def test_pair_ratios_are_baseline_over_method_per_seed_by_hand():
    # s2fl against splitfed_v1: 3.54× time, 2.57× traffic (the warm-up reading left out)
    claim = dataclasses.replace(CLAIMS["s2fl"], readings={})
    runs = {
        ("s2fl", 0): {"rows": _rows([0.5, 0.9], dt=10.0, mb=4.0)},  # round 2: 20 s, 8 MB
        ("splitfed_v1", 0): {"rows": _rows([0.5, 0.6, 0.9], dt=30.0, mb=10.0)},  # 90 s, 30 MB
        ("s2fl", 1): {"rows": _rows([0.9], dt=10.0, mb=4.0)},  # 10 s, 4 MB
        ("splitfed_v1", 1): {"rows": _rows([0.95], dt=20.0, mb=12.0)},  # 20 s, 12 MB
    }
    (pair,) = pair_rows(claim, runs, 0.9, [0, 1])
    assert pair["time_ratio"] == pytest.approx([4.5, 2.0])
    assert pair["traffic_ratio"] == pytest.approx([3.75, 3.0])
    # time: mean 3.25 < 3.54 but > 1; traffic: mean 3.375 ≥ 2.57, both seeds
    assert pair["time_verdict"] == f"{DIRECTION} (1 of 2 seeds ≥ 3.54×)"
    assert pair["traffic_verdict"] == f"{HOLDS} (2 of 2 seeds ≥ 2.57×)"
    runs[("splitfed_v1", 1)] = {"rows": _rows([0.5])}
    (pair,) = pair_rows(claim, runs, 0.9, [0, 1])
    assert pair["time_ratio"][1] is None and pair["time_verdict"] == UNREACHED


def test_auto_target_is_95_percent_of_the_lowest_best_rounded_down_to_half_a_percent():
    runs = [_rows([0.5, 0.93, 0.9]), _rows([None, 0.97]), _rows([0.8, 0.91])]
    # lowest best 0.91; 0.95 × 0.91 = 0.8645 → 86.0 % (0.5 % steps, rounded down)
    assert resolve_targets(["auto", 0.9], runs) == pytest.approx([0.86, 0.9])
    assert resolve_targets([0.86, "auto"], runs) == pytest.approx([0.86])  # no duplicate


def test_verdict_words():
    assert verdict([0.5, 0.9], 2.0).startswith(FAILS)
    assert verdict([2.0, 2.2], 2.0) == f"{HOLDS} (2 of 2 seeds ≥ 2.00×)"
    assert verdict([1.2, None], 2.0) == UNREACHED
    assert verdict([1.2], None) == "reported (no figure)"


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", sorted(CLAIMS))
def test_every_variant_is_a_valid_config(name, mode):
    claim = CLAIMS[name]
    for algorithm in claim.algorithms:
        cfg = config_for(claim, mode, algorithm, 0, None)
        if mode == "full":
            assert cfg["device"] == "cuda" and cfg["data"]["dataset"] == "cifar10"
            cfg["device"] = "cpu"  # no GPU here: the rest is checked as written
        as_config(cfg)
    assert claim.targets[mode] and claim.quote


def test_the_tiny_mode_runs_and_resumes(tmp_path, capsys):
    assert main(["--mode", "tiny", "--only", "s2fl", "--seeds", "0", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    block = summary["claims"]["s2fl"]["targets"]["0.2"]
    assert set(block["cells"]) == {"s2fl", "s2fl-warmup-selected", "splitfed_v1"}
    pairs = {(p["method"], p["baseline"]) for p in block["pairs"]}
    assert pairs == {("s2fl", "splitfed_v1"), ("s2fl-warmup-selected", "splitfed_v1")}
    assert "### S²FL" in (tmp_path / "summary.md").read_text()
    capsys.readouterr()
    main(["--mode", "tiny", "--only", "s2fl", "--seeds", "0", "--out", str(tmp_path)])
    assert capsys.readouterr().out.count("done before") == 3
    assert not list(tmp_path.glob("*.lock"))  # every claim released


def test_a_reused_run_is_the_longer_runs_first_rounds_and_only_that(tmp_path):
    """ParallelSFL's LocFedMix-SL run is MergeSFL's (same config, 40 rounds against 20)."""
    claim = CLAIMS["parallelsfl"]
    theirs = config_for(CLAIMS["mergesfl"], "cpu", "locfedmix_sl", 1, None)
    assert (
        theirs["rounds"] == 40 and config_for(claim, "cpu", "locfedmix_sl", 1, None)["rounds"] == 20
    )
    record = {"rows": _rows([0.1 * (k % 10) for k in range(40)]), "config": theirs}
    (tmp_path / "mergesfl-locfedmix_sl-s1.json").write_text(json.dumps(record))
    run = load_run(claim, "cpu", "locfedmix_sl", 1, tmp_path)
    assert run["rows"] == record["rows"][:20] and run["reused_from"] == "mergesfl"
    record["config"]["train"]["lr"] = 0.05  # any other difference: not the same run
    (tmp_path / "mergesfl-locfedmix_sl-s1.json").write_text(json.dumps(record))
    with pytest.raises(ValueError, match="cannot reuse"):
        load_run(claim, "cpu", "locfedmix_sl", 1, tmp_path)


def test_a_run_longer_than_its_claim_is_cut_and_a_missing_run_is_none(tmp_path):
    """A grid shortened after some runs finished: a longer run of the same config is cut to
    the claim's rounds (its first rounds are the shorter run's); a run not made is None."""
    claim = CLAIMS["ringsfl"]
    cfg = config_for(claim, "cpu", "fedavg", 0, None)
    longer = {**cfg, "rounds": cfg["rounds"] + 8}
    record = {"rows": _rows([0.5] * longer["rounds"]), "config": longer}
    (tmp_path / "ringsfl-fedavg-s0.json").write_text(json.dumps(record))
    assert load_run(claim, "cpu", "fedavg", 0, tmp_path)["rows"] == record["rows"][: cfg["rounds"]]
    assert load_run(claim, "cpu", "fedavg", 1, tmp_path) is None

"""``benchmarks/bench_attacks.py --untrusted-aggregation RULE`` (issue 51): the rule reaches
every run's config, the attack cases' honest controls and the false-positive runs (the
server freeze and the resumed run included); without it each case keeps its own rule."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest
import torch

from splitfl.config.network import NetworkConfig
from splitfl.net.device import clusters

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture
def bench(monkeypatch, tmp_path):
    """The bench module with its runs replaced by a recorder: ``bench.seen`` gets (case,
    honest) per run. Its import-time patch of the ring session and ``main``'s thread count
    are undone after the test."""
    monkeypatch.setattr(clusters, "ring_session", clusters.ring_session)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = importlib.import_module("bench_attacks")
    module.seen = []

    def record(case, folder, rounds, honest):
        module.seen.append((case, honest))
        return module.outcome("ok", [], 0.0)

    monkeypatch.setattr(module, "networked", record)
    monkeypatch.setattr(module, "resumed", lambda case, f, r: record(case, f, r, True))
    yield module
    sys.modules.pop("bench_attacks", None)


def _rules(bench) -> dict[str, str]:
    """Each recorded run's ``network.untrusted_aggregation`` as its config has it."""
    return {c.name: bench.config(c, 4)["network"]["untrusted_aggregation"] for c, _ in bench.seen}


@pytest.mark.parametrize("mode", [["--false-positive-rate"], ["--only", "default-"]])
def test_the_rule_reaches_every_run_and_its_honest_control(bench, tmp_path, mode):
    out = tmp_path / "r.json"
    bench.main([*mode, "--rounds", "4", "--untrusted-aggregation", "fltrust", "--out", str(out)])
    rules = _rules(bench)
    assert set(rules.values()) == {"fltrust"}
    if mode[0] == "--only":  # 12 attacks, each judged against an honest control
        assert [h for _, h in bench.seen].count(False) == 12
        assert True in {h for _, h in bench.seen}
    else:  # 7 runs at 2 alphas, the freeze and the resume
        assert len(rules) == 16 and {bench.FROZEN, bench.RESUMED} <= set(rules)
    assert '"untrusted_aggregation": "fltrust"' in out.read_text()


def test_without_the_option_the_cases_keep_their_own_rule(bench, tmp_path):
    bench.main(["--false-positive-rate", "--rounds", "4", "--out", str(tmp_path / "r.json")])
    assert set(_rules(bench).values()) == {NetworkConfig.untrusted_aggregation}
    bench.seen.clear()
    bench.main(["--only", "flipped-part/mean", "--rounds", "4", "--out", str(tmp_path / "a.json")])
    assert set(_rules(bench).values()) == {"mean"}  # config_for's pin, as before the option

"""Readable tables: no automatic accuracy target at or below chance, energy in J/kJ/MJ."""

from __future__ import annotations

import json

import pytest

import splitfl
from conftest import tiny_config
from splitfl.metrics.report import _cell_text
from splitfl.metrics.summary import format_value, target_for


def test_automatic_target_is_above_chance_or_none():
    assert target_for([0.10, 0.9], None, chance=0.1) is None  # 95 % of 10 % = 9.5 %
    assert target_for([0.106, 0.9], None, chance=0.1) is None  # 10.07 % → 10.0 %: not above
    assert target_for([0.112, 0.9], None, chance=0.1) == 0.105  # 10.64 % → 10.5 %
    assert target_for([0.5, 0.9], None, chance=0.1) == 0.475
    assert target_for([0.5], None, chance=0.5) is None  # two classes
    assert target_for([0.10], 0.05, chance=0.1) == 0.05  # a configured target is the user's
    assert target_for([0.10], None) == 0.095  # chance unknown: as before


def test_chance_comes_from_the_label_histograms(tmp_path):
    from splitfl.metrics.rundirs import chance_accuracy

    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for folder, classes in ((a, 10), (b, 4)):
        folder.mkdir()
        hist = {"clients": [{"label_histogram": [1] * classes}]}
        (folder / "clients.json").write_text(json.dumps(hist))
    c.mkdir()
    (c / "clients.json").write_text("{damaged")
    assert chance_accuracy([a]) == 0.1
    assert chance_accuracy([a, b, c]) == 0.25  # the strictest
    assert chance_accuracy([c, tmp_path / "missing"]) is None


def test_report_of_a_run_at_chance_shows_no_target(tmp_path):
    run_dir = splitfl.run(tiny_config(rounds=1), run_dir=tmp_path / "run").run_dir
    path = run_dir / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for row in rows:
        row["test_acc"] = 0.1  # ten classes: what a random guess scores
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = splitfl.report(run_dir, out_dir=tmp_path / "report")
    assert result.target is None
    assert "time to 9.5" not in result.table


@pytest.mark.parametrize(
    "joules,text",
    [
        (0.0, "0.00 J"),
        (0.004, "0.004 J"),
        (3.2, "3.20 J"),
        (999.0, "999.00 J"),
        (1500.0, "1.50 kJ"),
        (2.5e6, "2.50 MJ"),
        (1.25e9, "1,250.00 MJ"),
    ],
)
def test_energy_is_shown_in_a_unit_that_fits(joules, text):
    assert format_value(joules, "energy") == text


def test_energy_spread_is_in_the_unit_of_its_mean():
    assert _cell_text((1500.0, 20.0, 3), "energy", 3) == "1.50 ± 0.02 kJ"
    assert _cell_text((3.0, None, 1), "energy", 1) == "3.00 ± — J"
    assert _cell_text((4.0, 0.5, 2), "energy", 3) == "4.00 ± 0.50 J (2/3)"

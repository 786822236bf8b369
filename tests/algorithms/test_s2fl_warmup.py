"""S²FL's all-device warm-up (§3.1): every device is timed at each cut point; with
``warmup_training: time_only`` (default) only the round's selected devices are aggregated."""

import pytest
import torch

import splitfl
from conftest import tiny_config
from splitfl.algorithms.s2fl import S2FLOptions
from splitfl.config import ConfigError
from splitfl.metrics.summary import comparison_table, summarize

WARMUP = 3  # cnn_digits has three candidate cut points


def _run(tmp_path, name: str, **options):
    changes = {f"options.s2fl.{k}": v for k, v in options.items()}
    return splitfl.run(tiny_config(rounds=WARMUP, **changes), run_dir=tmp_path / name)


def _model(run) -> dict[str, torch.Tensor]:
    return torch.load(run.run_dir / "model.pt")


@pytest.fixture(scope="module")
def timed(tmp_path_factory):
    """The default warm-up run (every device timed, the selected aggregated), read by two
    tests."""
    return _run(tmp_path_factory.mktemp("warmup"), "timed")


def test_time_only_warmup_aggregates_the_selected_devices_and_times_all(tmp_path, timed):
    selected = _run(tmp_path, "selected", warmup_all_devices=False)
    merged = _run(tmp_path, "merged", warmup_training="aggregate")
    a, b, c = _model(timed), _model(selected), _model(merged)
    # the model is the one the selected devices alone give (same selection, groups, batches)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)
    for t, s in zip(timed.metrics, selected.metrics, strict=True):
        # ... while the clock charges every device, as the paper's warm-up runs them all
        assert t["clients"] == list(range(12)) and None not in t["client_times"]
        assert t["plan_warmup_aggregated"] == s["clients"]
        assert t["round_time"] >= max(t["client_times"]) > 0
        assert t["traffic_total"] > s["traffic_total"]
        by_client = dict(zip(t["clients"], t["client_times"], strict=True))
        assert [by_client[k] for k in s["clients"]] == pytest.approx(s["client_times"], rel=1e-12)


def test_default_reads_the_paper_as_timing_only_and_bad_values_are_one_line():
    assert S2FLOptions().warmup_training == "time_only"
    with pytest.raises(ConfigError, match=r"^options\.s2fl\.warmup_training: "):
        S2FLOptions(warmup_training="train")


def test_comparison_notes_what_the_warmup_did_and_cost(timed):
    rows = timed.metrics
    summary = summarize(rows, 0.5)
    w = summary["warmup"]
    assert (w["rounds"], w["devices_timed"], w["devices_aggregated"]) == (WARMUP, 12, 6)
    assert w["sim_time"] == pytest.approx(sum(r["round_time"] for r in rows), rel=1e-12)
    table = comparison_table({"fedavg": {**summary, "warmup": None}, "s2fl": summary})
    notes = [line for line in table.splitlines() if line.startswith("s2fl: ")]
    assert len(notes) == 1
    assert f"first {WARMUP} rounds are the warm-up" in notes[0] and "timing 12 devices" in notes[0]
    assert "aggregating 6" in notes[0]

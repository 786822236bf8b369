"""End-to-end behaviour of the round loop, executor and algorithms on tiny digits runs."""

import json

import numpy as np
import pytest
import torch

import splitfl
from conftest import tiny_config
from splitfl.algorithms.s2fl import closest_to_median
from splitfl.data.partition import batch_sizes
from splitfl.executors import NonFiniteLossError
from splitfl.executors.sequential import SequentialExecutor
from splitfl.experiment.runner import as_config, prepare
from splitfl.testing import config_for

cfg_for = config_for
# Every algorithm's determinism and checkpoint round trip: tests/conformance/test_algorithms.py.


def _final_state(run_dir):
    return torch.load(run_dir / "model.pt", weights_only=True)


def test_fedavg_equals_splitfed_v1(tmp_path):
    """One server copy per client trained on that client's own loss is SGD on the full model:
    SplitFed V1 and FedAvg give the same parameters (S²FL §5.2: 'SFL is equivalent to FedAvg')."""
    fed = splitfl.run(tiny_config(algorithm="fedavg", rounds=2), run_dir=tmp_path / "f")
    sfl = splitfl.run(tiny_config(algorithm="splitfed_v1", rounds=2), run_dir=tmp_path / "s")
    a, b = _final_state(fed.run_dir), _final_state(sfl.run_dir)
    for key in a:
        assert torch.allclose(a[key].float(), b[key].float(), atol=1e-5), key


def test_s2fl_without_mechanisms_equals_splitfed_v1(tmp_path):
    r = splitfl.run(tiny_config(algorithm="s2fl+R", rounds=2), run_dir=tmp_path / "r")
    s = splitfl.run(tiny_config(algorithm="sfl", rounds=2), run_dir=tmp_path / "s")
    a, b = _final_state(r.run_dir), _final_state(s.run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert r.metrics[-1]["sim_time"] == s.metrics[-1]["sim_time"]


def test_s2fl_warmup_cycles_cut_points_then_adapts(tmp_path):
    res = splitfl.run(tiny_config(rounds=5), run_dir=tmp_path / "s")
    prep = prepare(res.config)
    cuts = prep.ctx.cut_points
    for r in range(len(cuts)):
        assert set(res.metrics[r]["cuts"]) == {cuts[r]}
        assert res.metrics[r]["plan_split"] == "warm-up"
    assert res.metrics[3]["plan_split"] == "adaptive"
    # grouping: clients_per_round 6, group_size 5 -> 2 groups of 3
    assert sorted(np.bincount(res.metrics[3]["groups"]).tolist()) == [3, 3]


def test_s2fl_adaptive_cuts_follow_the_time_table(tmp_path):
    """After warm-up each device's cut is the one closest to the median of the table."""
    res = splitfl.run(
        tiny_config(rounds=4, **{"options.s2fl.time_table_update": "last"}), run_dir=tmp_path / "s"
    )
    prep = prepare(res.config)
    row = res.metrics[3]

    # the round-4 plan used the times observed in rounds 1-3 (every device warms up every cut)
    prior = {}
    for r in res.metrics[:3]:
        for c, k, t in zip(r["clients"], r["cuts"], r["client_times"], strict=True):
            prior.setdefault(c, {})[k] = t
    full = {c: {k: prior[c][k] for k in prep.ctx.cut_points} for c in row["clients"]}
    expected, _ = closest_to_median(full)
    assert [expected[c] for c in row["clients"]] == row["cuts"]


def test_resume_gives_the_same_result_as_an_uninterrupted_run(tmp_path):
    cfg = tiny_config(rounds=5, **{"output.checkpoint_every": 2})
    full = splitfl.run(cfg, run_dir=tmp_path / "full")
    # simulate a crash after round 4: keep the round-4 checkpoint, extra metric rows
    part = splitfl.run(
        tiny_config(rounds=4, **{"output.checkpoint_every": 2}), run_dir=tmp_path / "part"
    )
    (part.run_dir / "config.yaml").write_text((full.run_dir / "config.yaml").read_text())
    (part.run_dir / "model.pt").unlink()
    resumed = splitfl.resume(part.run_dir)
    drop = ("wall_time",)
    strip = lambda rows: [{k: v for k, v in r.items() if k not in drop} for r in rows]  # noqa: E731
    assert strip(resumed.metrics) == strip(full.metrics)
    a, b = _final_state(full.run_dir), _final_state(resumed.run_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_resume_after_midway_checkpoint_truncates_metrics(tmp_path):
    cfg = tiny_config(rounds=3, **{"output.checkpoint_every": 2})
    run_dir = tmp_path / "cut"
    full = splitfl.run(cfg, run_dir=run_dir)  # uninterrupted; its checkpoint is replaced below
    # roll the checkpoint back to round 2 by re-running 2 rounds into a fresh directory
    two = splitfl.run(
        tiny_config(rounds=2, **{"output.checkpoint_every": 2}), run_dir=tmp_path / "two"
    )
    (run_dir / "checkpoints" / "last.pt").write_bytes(
        (two.run_dir / "checkpoints" / "last.pt").read_bytes()
    )
    resumed = splitfl.resume(run_dir)
    assert [r["round"] for r in resumed.metrics] == [1, 2, 3]
    assert resumed.metrics[-1]["test_acc"] == full.metrics[-1]["test_acc"]


def test_non_finite_loss_stops_with_checkpoint_kept(tmp_path):
    cfg = tiny_config(
        algorithm="fedavg", model="mlp", rounds=6, **{"train.lr": 1e8, "output.checkpoint_every": 1}
    )
    with pytest.raises(NonFiniteLossError, match="last good checkpoint"):
        splitfl.run(cfg, run_dir=tmp_path / "d")
    summary = json.loads((tmp_path / "d" / "summary.json").read_text())
    assert summary["status"].startswith("diverged")
    assert (tmp_path / "d" / "checkpoints" / "last.pt").exists()


def test_same_selection_and_devices_across_algorithms(tmp_path):
    a = splitfl.run(tiny_config(algorithm="fedavg", rounds=2), run_dir=tmp_path / "a")
    # S²FL's default warm-up times every device (§3.1); with it on the participants only, the
    # selection is FedAvg's
    s2fl = tiny_config(algorithm="s2fl", rounds=2, **{"options.s2fl.warmup_all_devices": False})
    b = splitfl.run(s2fl, run_dir=tmp_path / "b")
    assert [r["clients"] for r in a.metrics] == [r["clients"] for r in b.metrics]
    assert (a.run_dir / "clients.json").read_text() == (b.run_dir / "clients.json").read_text()


def test_threads_limits_torch_and_blas_during_the_run_only(tmp_path, monkeypatch):
    """``threads: 1`` holds BLAS (numpy/scipy) to one thread while the run lasts, so scipy's
    optimisers give the same digits in a shell and in a Ray worker; limits are restored."""
    from threadpoolctl import threadpool_info, threadpool_limits

    seen = []
    original = SequentialExecutor.run_round

    def spy(self, *args, **kwargs):
        seen.extend(p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas")
        return original(self, *args, **kwargs)

    monkeypatch.setattr(SequentialExecutor, "run_round", spy)
    with threadpool_limits(limits=2, user_api="blas"):
        splitfl.run(tiny_config(rounds=1, threads=1), run_dir=tmp_path / "r")
        after = [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]
    assert seen and set(seen) == {1}
    assert after and set(after) == {2}  # back to the outer limit


def test_each_row_counts_the_samples_the_round_trained(tmp_path):
    """``samples``: Σ over the round's clients of the samples their local steps processed
    (batch sizes over ``local_steps`` passes through each client's data), the work a round
    buys (issue 32 item 5: per-round tables compared algorithms training very different
    amounts); the timing executor counts the same."""
    cfg = tiny_config(algorithm="splitfed_v1", rounds=2, **{"train.local_steps": 3})
    runs = {
        ex: splitfl.run({**cfg, "executor": ex}, run_dir=tmp_path / ex)
        for ex in ("sequential", "timing")
    }
    ctx = prepare(as_config(cfg)).ctx
    for ex, run in runs.items():
        assert len(run.metrics) == 2
        for row in run.metrics:
            # 3 batches of 16 per client, the last one short where a client holds fewer
            want = sum(sum(batch_sizes(int(ctx.data_sizes[c]), 16, 3)) for c in row["clients"])
            assert want > 0
            assert row["samples"] == want, ex

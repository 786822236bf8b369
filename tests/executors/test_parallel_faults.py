"""``executor: parallel`` survives lost workers (issue 35.11).

A worker killed (SIGKILL, SIGTERM, SIGINT) or stopped past ``parallel.timeout_s`` is replaced
by a fresh one and its units are trained again: units are deterministic, so the run equals one
without the loss, bit for bit. A unit lost more than ``parallel.max_retries`` times stops the
run with one line (exit 2) and keeps the checkpoint of the finished rounds; ``--resume``
continues. A worker whose driver died exits quietly.
"""

import json
import os
import signal
import socket
import subprocess
import sys

import pytest
import torch

import splitfl
from splitfl.cli.main import main
from splitfl.config import ParallelConfig
from splitfl.core.seeding import rng_for
from splitfl.executors import ParallelExecutor, SequentialExecutor, WorkersLostError
from splitfl.executors.pools import LocalPool
from splitfl.experiment.runner import as_config, prepare
from splitfl.testing import config_for

ROUNDS = 3


def _pool(timeout_s: float = 60, max_retries: int = 2, backend: str = "local"):
    """Two started workers and a two-group FedAvg round of the tiny digits config."""
    prep = prepare(as_config(config_for("fedavg")))
    c = ParallelConfig(workers=2, timeout_s=timeout_s, max_retries=max_retries, backend=backend)
    ex = ParallelExecutor(parallel=c)
    ex.open(prep.ctx)
    alg = prep.algorithm
    plan = alg.plan_round(0, alg.select_clients(0, rng_for(3, "select", 0)), rng_for(3, "p", 0))
    return ex, prep.ctx, plan


def _same(ref, got) -> None:
    assert [u.client for u in ref.updates] == [u.client for u in got.updates]
    for u, v in zip(ref.updates, got.updates, strict=True):
        assert all(torch.equal(u.state[k], v.state[k]) for k in u.state), u.client


def test_a_killed_worker_is_replaced_and_its_units_rerun(capfd):
    """SIGKILL, SIGTERM, SIGINT in turn: the worker dies (its stderr is the test's: no
    traceback), the next round finds it gone, a fresh one takes its place and the round
    equals the sequential executor's."""
    ex, ctx, plan = _pool()
    state = ctx.model.state_dict()
    ref = SequentialExecutor().run_round(ctx, state, plan, 5)
    try:
        for n, sig in enumerate([signal.SIGKILL, signal.SIGTERM, signal.SIGINT], 1):
            pid = ex.pool.procs[1].pid
            os.kill(pid, sig)
            ex.pool.procs[1].wait(timeout=30)
            got = ex.run_round(ctx, state, plan, 5)
            _same(ref, got)
            assert ex.pool.procs[1].pid != pid and ex.stats["restarts"] == n
            (event,) = got.events
            assert f"parallel worker 1 (local process {pid}) exited with code {-sig}" in event
            assert "replaced by parallel worker 1 (local process" in event
        assert ex.run_round(ctx, state, plan, 5).events == []  # recorded once
    finally:
        ex.close()
    assert "Traceback" not in capfd.readouterr().err


def test_a_stopped_worker_is_replaced_after_the_timeout():
    ex, ctx, plan = _pool(timeout_s=120)  # start-up (imports) takes longer than the bound
    ex.pool.set_timeout(10)
    stopped = ex.pool.procs[0]
    os.kill(stopped.pid, signal.SIGSTOP)
    try:
        got = ex.run_round(ctx, ctx.model.state_dict(), plan, 5)
        _same(SequentialExecutor().run_round(ctx, ctx.model.state_dict(), plan, 5), got)
        assert any("no answer within parallel.timeout_s=10 s" in e for e in got.events)
        assert stopped.poll() == -signal.SIGKILL  # the stopped one was killed
    finally:
        if stopped.poll() is None:
            stopped.kill()
        ex.close()


def test_a_stalled_worker_past_max_retries_is_one_line():
    ex, ctx, plan = _pool(timeout_s=120, max_retries=0)
    ex.pool.set_timeout(1)
    pid = ex.pool.procs[0].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        with pytest.raises(WorkersLostError) as err:
            ex.run_round(ctx, ctx.model.state_dict(), plan, 5)
        line = str(err.value)
        assert "no answer within parallel.timeout_s=1 s" in line, line
        assert "lost 1 times while training group" in line and "max_retries=0" in line
        assert "\n" not in line
    finally:
        os.kill(pid, signal.SIGKILL)
        ex.close()


def _kill_on_submits(monkeypatch, which: set[int]) -> list[int]:
    """Kill the worker right after the ``which``-th messages (counted from 1) are sent to
    workers: mid-round, before or while it trains the unit just sent. Returns the pids."""
    real, count, killed = LocalPool.submit, [0], []

    def submit(self, w, ops):  # noqa: ANN001
        real(self, w, ops)
        count[0] += 1
        if count[0] in which:
            killed.append(self.procs[w].pid)
            os.kill(self.procs[w].pid, signal.SIGKILL)

    monkeypatch.setattr(LocalPool, "submit", submit)
    return killed


def test_a_worker_lost_at_start_up_is_replaced(monkeypatch):
    """Killed right after it was sent its start (config and data): a fresh worker is started
    in its place before the first round, which equals the sequential executor's."""
    killed = _kill_on_submits(monkeypatch, {1})
    ex, ctx, plan = _pool()
    try:
        assert len(killed) == 1 and ex.stats["restarts"] == 1
        state = ctx.model.state_dict()
        got = ex.run_round(ctx, state, plan, 5)
        _same(SequentialExecutor().run_round(ctx, state, plan, 5), got)
        (event,) = got.events  # recorded with the first round
        assert f"(local process {killed[0]}) exited with code -9" in event
        assert "killed it) while starting; replaced by parallel worker 0" in event
    finally:
        ex.close()


def test_a_worker_killed_mid_round_leaves_the_run_bit_identical(
    tmp_path, sequential_run, monkeypatch
):
    """``splitfl run`` with a worker SIGKILLed in the middle of round 2 finishes ok and
    equals the run without the kill (the sequential run, which parallel equals bit for bit);
    the round's row records the event."""
    config = config_for("splitfed_v1", rounds=ROUNDS)
    killed = _kill_on_submits(monkeypatch, {9})  # 2 starts, 6 units of round 1, then round 2
    result = splitfl.run({**config, "executor": "parallel"}, run_dir=tmp_path / "p")
    ref = sequential_run(config)
    assert result.summary["status"] == "ok" and len(killed) == 1
    a, b = (torch.load(r.run_dir / "model.pt", weights_only=True) for r in (ref, result))
    assert all(torch.equal(a[k], b[k]) for k in a)
    events = [row.pop("executor_events") for row in result.metrics]
    assert events[0] == [] and len(events[1]) == 1 and f"process {killed[0]})" in events[1][0]
    drop = ("wall_time", "executor_events")
    assert [{k: v for k, v in row.items() if k not in drop} for row in ref.metrics] == [
        {k: v for k, v in row.items() if k != "wall_time"} for row in result.metrics
    ]


def test_repeated_losses_stop_in_one_line_and_resume_continues(
    tmp_path, sequential_run, monkeypatch, capsys
):
    """Every message after round 1 kills its worker: the unit is lost max_retries + 1 times,
    the run stops with one ``error:`` line and exit 2, its checkpoint holds round 1 (written
    on the stop: ``checkpoint_every`` is 2), and ``--resume`` finishes it as if nothing
    happened."""
    config = config_for("splitfed_v1", rounds=ROUNDS)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({**config, "executor": "parallel"}))
    _kill_on_submits(monkeypatch, set(range(9, 100)))
    run_dir = tmp_path / "run"
    code = main(["run", str(path), "--out", str(run_dir), "parallel.max_retries=1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert "Traceback" not in "\n".join(err)
    assert err[-1].startswith("error: stopped at round 1 of 3: parallel worker"), err[-1]
    assert "lost 2 times while training group" in err[-1] and "max_retries=1" in err[-1]
    assert f"checkpoint at round 1 kept in {run_dir / 'checkpoints'}" in err[-1]
    assert all(line.startswith("warning: parallel worker") for line in err[:-1])
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"].startswith("stopped at round 1: parallel worker")
    monkeypatch.undo()
    result = splitfl.resume(run_dir)
    ref = sequential_run(config)
    a, b = (torch.load(r.run_dir / "model.pt", weights_only=True) for r in (ref, result))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_a_worker_whose_driver_died_exits_quietly():
    """The driver goes away while the worker works on its message: the answer has nowhere to
    go (a broken pipe), and the worker ends with status 0 and nothing on stderr."""
    mine, theirs = socket.socketpair()
    proc = subprocess.Popen(
        [sys.executable, "-m", "splitfl.executors.worker_process", str(theirs.fileno())],
        pass_fds=(theirs.fileno(),),
        stderr=subprocess.PIPE,
    )
    theirs.close()
    frame = b"not a channel message"
    mine.sendall((1).to_bytes(8, "little") + len(frame).to_bytes(8, "little") + frame)
    mine.close()  # before the worker (still importing) reads it and answers
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0 and stderr == b"", stderr.decode()[-500:]


def test_a_lost_ray_actor_is_replaced(ray_instance):
    ex, ctx, plan = _pool(timeout_s=180, backend="ray")
    try:
        ray_instance.kill(ex.pool.actors[1])
        state = ctx.model.state_dict()
        got = ex.run_round(ctx, state, plan, 5)
        _same(SequentialExecutor().run_round(ctx, state, plan, 5), got)
        (event,) = got.events
        assert "parallel worker 1 (Ray actor) died while training group" in event
    finally:
        ex.close()

"""The round loop: select → plan → execute → cost → observe → aggregate → evaluate → record.

A run directory holds ``config.yaml`` (resolved), ``clients.json`` (label histograms and device
profiles), ``metrics.jsonl`` (one row per round), ``summary.json``, ``accuracy.png`` and
``checkpoints/last.pt``. Optimisers are created afresh each round and every random stream is
derived from ``(seed, purpose, round)`` (see :mod:`splitfl.seeding`), so a checkpoint of
the global model, the algorithm state and the clock is all a resume needs to reproduce an
uninterrupted run exactly. The checkpoint also holds the metric rows up to its round and is
the source of truth on resume (:mod:`splitfl.engine.checkpoint`); a run directory is locked
while a process works in it (:mod:`splitfl.dirlock`); Ctrl-C/SIGTERM and exploding losses are
handled in :mod:`splitfl.engine.guards`.
"""

from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from splitfl.algorithms import Algorithm, resolve_algorithm
from splitfl.config import (
    ConfigError,
    ExperimentConfig,
    dump_config,
    load_config,
    resolve_device,
)
from splitfl.dirlock import hold_lock
from splitfl.engine.checkpoint import load_checkpoint, save_checkpoint
from splitfl.engine.context import RunContext, build_context
from splitfl.engine.executor import NonFiniteLossError, evaluate, make_executor
from splitfl.engine.guards import RunInterrupted, check_explosion, sigterm_as_interrupt
from splitfl.metrics.plots import plot_accuracy
from splitfl.metrics.summary import summarize
from splitfl.metrics.tracking import make_trackers
from splitfl.plan import RoundReport
from splitfl.seeding import derive_seed, rng_for
from splitfl.system import LINKS, SimClock, Traffic, jitter_factors


@dataclass
class RunResult:
    """What :func:`run` returns: the run directory, its per-round metrics and its summary."""

    run_dir: Path
    config: ExperimentConfig
    metrics: list[dict[str, Any]]
    summary: dict[str, Any]


@dataclass
class Prepared:
    config: ExperimentConfig
    ctx: RunContext
    algorithm: Algorithm


def prepare(config: ExperimentConfig, dtype: torch.dtype | None = None) -> Prepared:
    """Build the context and the algorithm; every check that needs the data runs here.

    ``dtype`` (tests only, e.g. ``torch.float64``) converts the model and the data before the
    algorithm copies anything from them. Executor equivalence is checked in float64: there the
    rounding noise of different kernel choices (oneDNN's grouped convolutions under vmap vs.
    one convolution per client differ by ~1e-7 in fp32, amplified by small-batch BatchNorm)
    falls to ~1e-16, while a real discrepancy stays of the order of the update itself."""
    ctx = build_context(config)
    if dtype is not None:
        ctx.model.to(dtype)
        for split in (ctx.bundle.train, ctx.bundle.test):
            split.x = split.x.to(dtype)
    cls, options = resolve_algorithm(config.algorithm, config.options)
    if getattr(options, "cut", None) is not None:
        ctx.resolve_cut(options.cut, config.algorithm)
    for name in config.options:  # a non-selected algorithm's cut must fit the model too
        cut = getattr(resolve_algorithm(name, config.options)[1], "cut", None)
        if cut is not None:
            ctx.resolve_cut(cut, name)
    return Prepared(config, ctx, cls(options, ctx))


def validate(
    config: ExperimentConfig | str | Path | dict, overrides: list[str] | None = None
) -> str:
    """Check a config and that it fits its data and model, without running (``splitfl
    validate``). Returns a one-line description; raises ConfigError / DatasetError."""
    cfg = as_config(config, overrides)
    ctx = prepare(cfg).ctx
    return (
        f"ok: {cfg.algorithm} on {cfg.data.dataset} ({len(ctx.bundle.train)} train samples, "
        f"{ctx.num_clients} clients), model {cfg.model} ({ctx.num_blocks} blocks, "
        f"cut points {list(ctx.cut_points)}), devices {cfg.devices.preset}, {cfg.rounds} rounds"
    )


def new_run_dir(config: ExperimentConfig, parent: Path | None = None) -> Path:
    base = parent or Path(config.output.out_dir)
    name = config.output.name or (
        f"{config.algorithm}-{config.data.dataset}-{datetime.now():%Y%m%d-%H%M%S}"
    )
    path, i = base / name, 1
    while path.exists():
        path, i = base / f"{name}-{i}", i + 1
    return path


def _write_clients(ctx: RunContext, path: Path) -> None:
    clients = [
        {
            "client": c,
            "samples": int(ctx.data_sizes[c]),
            "label_histogram": ctx.label_hist[c].tolist(),
            "device": ctx.population.devices[c].to_dict(),
        }
        for c in range(ctx.num_clients)
    ]
    path.write_text(json.dumps({"server": ctx.population.server.to_dict(), "clients": clients}))


def _save_checkpoint(run_dir: Path, state: dict[str, Any]) -> None:
    save_checkpoint(run_dir, state)


def run(
    config: ExperimentConfig | str | Path | dict,
    overrides: list[str] | None = None,
    run_dir: str | Path | None = None,
    progress: bool | None = None,
) -> RunResult:
    """Run one experiment (the Python twin of ``splitfl run``).

    Args:
        config: An :class:`ExperimentConfig`, a YAML path, or a mapping of fields.
        overrides: ``key=value`` overrides (``train.lr=0.05``).
        run_dir: Where to write; default ``output.out_dir/<algorithm>-<dataset>-<time>``.
        progress: Show a progress bar (default: ``output.progress``).
    """
    config = as_config(config, overrides)
    prepared = prepare(config)
    path = Path(run_dir) if run_dir is not None else new_run_dir(config)
    path.mkdir(parents=True, exist_ok=False)
    with hold_lock(path):
        dump_config(config, path / "config.yaml")
        _write_clients(prepared.ctx, path / "clients.json")
        return _loop(prepared, path, start=None, progress=progress)


def resume(run_dir: str | Path, progress: bool | None = None) -> RunResult:
    """Continue a stopped run from ``run_dir/checkpoints/last.pt`` (``splitfl run --resume``)."""
    path = Path(run_dir)
    if not (path / "config.yaml").exists():
        raise ConfigError("--resume", f"{path} is not a run directory (no config.yaml)")
    with hold_lock(path):
        config = load_config(path / "config.yaml")
        prepared = prepare(config)
        ckpt_path = path / "checkpoints" / "last.pt"
        start = None
        if ckpt_path.exists():
            shapes = {k: v.shape for k, v in prepared.ctx.model.state_dict().items()}
            start = load_checkpoint(ckpt_path, shapes, config.rounds)
        return _loop(prepared, path, start=start, progress=progress)


def as_config(config: Any, overrides: list[str] | None = None) -> ExperimentConfig:
    from splitfl.config import apply_overrides, from_dict, validate

    if isinstance(config, ExperimentConfig):
        if overrides:
            config = from_dict(ExperimentConfig, apply_overrides(config.to_dict(), overrides))
        validate(config)
        return config
    if isinstance(config, dict):
        cfg = from_dict(ExperimentConfig, apply_overrides(config, overrides or []))
        validate(cfg)
        return cfg
    return load_config(config, overrides)


def _measure(config, algorithm, plan, result, r: int) -> tuple[RoundReport, dict[int, float]]:
    """The simulated clock's view of a round: each client's cost (shared cost model or the
    algorithm's topology), seeded jitter, round time and waiting times."""
    tasks = {t.client: t for t in plan.tasks}
    costs = {
        u.client: algorithm.client_cost(tasks[u.client], u.samples, r, plan) for u in result.updates
    }
    costs = algorithm.share_links(costs, plan, r)
    samples = {u.client: u.samples for u in result.updates}
    losses = {u.client: u.loss_sum / max(u.samples, 1) for u in result.updates}
    jitter = jitter_factors(sorted(costs), config.devices.jitter, rng_for(config.seed, "jitter", r))
    times = {c: cost.time * jitter[c] for c, cost in costs.items()}
    round_time, waits = algorithm.round_time(times)
    idle = algorithm.idle_costs(plan, r)  # non-participants' transfers (e.g. deferred uploads)
    if idle:
        rng = rng_for(config.seed, "jitter-idle", r)
        jitter.update(jitter_factors(sorted(idle), config.devices.jitter, rng))
        idle_times = {c: cost.time * jitter[c] for c, cost in idle.items()}
        round_time, all_waits = algorithm.round_time({**times, **idle_times})
        waits = {c: all_waits[c] for c in times}
        costs = {**costs, **idle}
    return RoundReport(times, costs, jitter, samples, losses, round_time), waits


def _round_row(ctx, plan, result, report: RoundReport, waits, traffic: Traffic, r: int) -> dict:
    """Per-round metrics (test accuracy is filled in by the caller when evaluated). Energy:
    busy device compute time × power per client (jitter applied), plus helpers' compute
    energy (``ClientCost.helper_energy``: a ParallelSFL top worker serving the client)."""
    energy = {
        k: c.device_time * report.jitter[k] * ctx.population.at(k, r).power
        for k, c in report.costs.items()
    }
    helpers = sum(c.helper_energy for c in report.costs.values())
    return {
        "round_time": report.round_time,
        "train_loss": result.train_loss,
        "test_acc": None,
        "test_loss": None,
        "avg_waiting": sum(waits.values()) / len(waits),
        # device compute of the participants plus that of helpers (ParallelSFL's top workers)
        "energy_j": sum(energy.values()) + helpers,
        # per participant, aligned with "clients" (RingSFL Fig. 14); idle transfers use none
        "energy_j_by_client": [energy.get(t.client, 0.0) for t in plan.tasks],
        "energy_j_helpers": helpers,
        **{f"bytes_{link}": getattr(traffic, link) for link in LINKS},
        "traffic_total": traffic.total,
        "clients": [t.client for t in plan.tasks],
        "cuts": [t.cut for t in plan.tasks],
        "groups": [t.group for t in plan.tasks],
        "client_times": [report.times[t.client] for t in plan.tasks],
    }


@dataclass
class LoopState:
    """What the round loop carries and a checkpoint stores."""

    global_state: dict[str, torch.Tensor]
    clock: SimClock
    cum: Traffic
    rows: list[dict[str, Any]]
    lines: list[str]  # rows as written to metrics.jsonl (the checkpoint keeps the same text)
    initial_loss: float | None
    checkpoint_round: int = 0

    def checkpoint(self, run_dir: Path, algorithm: Algorithm) -> None:
        """Checkpoint after the last recorded round (rows and model agree)."""
        done = len(self.rows)
        _save_checkpoint(
            run_dir,
            {
                "round": done,
                "global_state": self.global_state,
                "algorithm": algorithm.state_dict(),
                "clock": self.clock.now,
                "traffic": self.cum.to_dict(),
                "initial_loss": self.initial_loss,
                "metrics": "".join(self.lines),
                "seed_rule": "streams derived from (seed, purpose, round)",
            },
        )
        self.checkpoint_round = done


def _start_state(prep: Prepared, start: dict | None, eval_model, run_dir: Path) -> LoopState:
    """A fresh loop state, or the checkpoint's (its rows replace ``metrics.jsonl``)."""
    config, ctx, algorithm = prep.config, prep.ctx, prep.algorithm
    if start is None:
        global_state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
        initial = None
        if config.train.explode_factor and config.train.explode_rounds:
            eval_model.load_state_dict(global_state)
            test = ctx.bundle.test
            initial = evaluate(eval_model, test.x, test.y, config.eval.batch_size)[1]
        st = LoopState(global_state, SimClock(), Traffic(), [], [], initial)
    else:
        clock = SimClock()
        clock.now = start["clock"]
        lines = str(start["metrics"]).splitlines(keepends=True)
        try:
            algorithm.load_state_dict(start["algorithm"])
            cum = Traffic(**start["traffic"])
        except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as err:
            raise ConfigError(
                "--resume",
                f"the checkpoint's state does not fit {config.algorithm} "
                f"({type(err).__name__}: {err}); damaged or from another run?",
            ) from None
        st = LoopState(
            start["global_state"],
            clock,
            cum,
            start["rows"],
            lines,
            start.get("initial_loss"),
            start["round"],
        )
        _note_restored(run_dir / "metrics.jsonl", lines)
    (run_dir / "metrics.jsonl").write_text("".join(st.lines))
    return st


def _note_restored(path: Path, lines: list[str]) -> None:
    """Say so when ``metrics.jsonl`` lost rows the checkpoint has (they are restored)."""
    old = path.read_text().splitlines(keepends=True) if path.exists() else []
    if old[: len(lines)] != lines:
        print(
            f"note: {path} disagreed with the checkpoint (missing, truncated or damaged rows); "
            f"restored its {len(lines)} rows from the checkpoint",
            file=sys.stderr,
        )


def _play_round(prep: Prepared, executor, st: LoopState, r: int, eval_model, t0: float) -> dict:
    """One round: select → plan → execute → cost → observe → aggregate → evaluate; returns
    its metrics row (``st`` holds the new model, clock and traffic)."""
    config, ctx, algorithm = prep.config, prep.ctx, prep.algorithm
    torch.manual_seed(derive_seed(config.seed, "torch", r))
    clients = algorithm.select_clients(r, rng_for(config.seed, "select", r))
    plan = algorithm.plan_round(r, clients, rng_for(config.seed, "plan", r))
    result = executor.run_round(ctx, st.global_state, plan, derive_seed(config.seed, "b", r))
    report, waits = _measure(config, algorithm, plan, result, r)
    algorithm.observe(r, plan, report)
    st.global_state = algorithm.aggregate(st.global_state, plan, result)
    st.clock.advance(report.round_time)
    traffic = Traffic()
    for cost in report.costs.values():
        traffic.add(cost.traffic)
    st.cum.add(traffic)
    row = {
        "round": r + 1,
        "sim_time": st.clock.now,
        "wall_time": time.perf_counter() - t0,
        **_round_row(ctx, plan, result, report, waits, traffic, r),
        "traffic_total_cum": st.cum.total,
        **{f"plan_{k}": v for k, v in plan.info.items()},
    }
    if (r + 1) % config.eval.every == 0 or r + 1 == config.rounds:
        eval_model.load_state_dict(st.global_state)
        test = ctx.bundle.test
        row["test_acc"], row["test_loss"] = evaluate(
            eval_model, test.x, test.y, config.eval.batch_size
        )
    return row


def _record(run_dir: Path, st: LoopState, row: dict[str, Any]) -> None:
    line = json.dumps(row) + "\n"
    st.rows.append(row)
    st.lines.append(line)
    with open(run_dir / "metrics.jsonl", "a") as fh:
        fh.write(line)


def _loop(prep: Prepared, run_dir: Path, start: dict | None, progress: bool | None) -> RunResult:
    config, ctx, algorithm = prep.config, prep.ctx, prep.algorithm
    device = resolve_device(config.device)
    executor = make_executor(config.executor, device, config.precision, config.channels_last)
    blas = None
    if config.threads is not None:
        # torch's and the BLAS libraries' (numpy/scipy: MergeSFL's SLSQP, …) thread counts:
        # a run gives the same numbers wherever it runs (Ray workers default BLAS to 1 thread)
        torch.set_num_threads(config.threads)
        blas = threadpool_limits(limits=config.threads, user_api="blas")
    eval_model = ctx.model if device == "cpu" else copy.deepcopy(ctx.model).to(device)
    st = _start_state(prep, start, eval_model, run_dir)
    first_round = len(st.rows)
    show = config.output.progress if progress is None else progress
    bar = tqdm(
        range(first_round, config.rounds),
        initial=first_round,
        total=config.rounds,
        desc=config.algorithm,
        disable=not show,
        leave=False,
        dynamic_ncols=True,
    )
    t0 = time.perf_counter() - (st.rows[-1]["wall_time"] if st.rows else 0.0)
    status, consistent = "ok", True  # False while a round has changed the model or algorithm
    if start is None:
        st.checkpoint(run_dir, algorithm)
    trackers = make_trackers(config, run_dir)  # output.tracking (none by default)
    try:
        with sigterm_as_interrupt():
            for r in bar:
                consistent = False
                row = _play_round(prep, executor, st, r, eval_model, t0)
                _record(run_dir, st, row)
                consistent = True  # model, algorithm, clock and rows all after round r + 1
                if row["test_acc"] is not None:
                    bar.set_postfix(acc=f"{row['test_acc']:.3f}", sim=f"{st.clock.now:.0f}s")
                trackers.log_round(row)
                check_explosion(st.rows, st.initial_loss, config.train)
                if (r + 1) % config.output.checkpoint_every == 0 or r + 1 == config.rounds:
                    st.checkpoint(run_dir, algorithm)
    except NonFiniteLossError as err:
        status = f"diverged at round {r + 1}: {err}"
        raise NonFiniteLossError(
            f"{status}; last good checkpoint kept in {run_dir / 'checkpoints'}"
        ) from err
    except KeyboardInterrupt as err:
        status = f"interrupted at round {len(st.rows)}"
        if consistent and st.checkpoint_round < len(st.rows):
            st.checkpoint(run_dir, algorithm)  # nothing is lost; mid-round, the last one stays
        raise RunInterrupted(
            f"{status} of {config.rounds}; checkpoint at round {st.checkpoint_round} kept in "
            f"{run_dir / 'checkpoints'}; continue with: splitfl run --resume {run_dir}"
        ) from err
    finally:
        bar.close()
        if blas is not None:
            blas.restore_original_limits()
        trackers.close()
        summary = summarize(st.rows, config.eval.target_accuracy, status, config.rounds)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if st.rows:
            plot_accuracy({config.algorithm: st.rows}, run_dir / "accuracy.png", config.algorithm)
    ctx.model.load_state_dict(st.global_state)
    torch.save(st.global_state, run_dir / "model.pt")
    return RunResult(run_dir, config, st.rows, summary)

"""The round loop: select → plan → execute → cost → observe → aggregate → evaluate → record.

A run directory holds ``config.yaml`` (resolved), ``clients.json`` (label histograms and device
profiles), ``metrics.jsonl`` (one row per round), ``summary.json``, ``accuracy.png`` and
``checkpoints/last.pt``. Optimisers are created afresh each round and every random stream is
derived from ``(seed, purpose, round)`` (see :mod:`splitfl.seeding`), so a checkpoint of
the global model, the algorithm state and the clock is all a resume needs to reproduce an
uninterrupted run exactly.
"""

from __future__ import annotations

import copy
import json
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import torch
from threadpoolctl import threadpool_limits
from tqdm import tqdm

from splitfl.algorithms import Algorithm, resolve_algorithm
from splitfl.algorithms.base import RoundReport
from splitfl.config import (
    ConfigError,
    ExperimentConfig,
    dump_config,
    load_config,
    resolve_device,
)
from splitfl.engine.context import RunContext, build_context
from splitfl.engine.executor import NonFiniteLossError, evaluate, make_executor
from splitfl.metrics.plots import plot_accuracy
from splitfl.metrics.summary import read_metrics, summarize, write_metrics
from splitfl.metrics.tracking import make_trackers
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


def prepare(config: ExperimentConfig) -> Prepared:
    """Build the context and the algorithm; every check that needs the data runs here."""
    ctx = build_context(config)
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
    validate``). Returns a one-line description; raises ConfigError / DatasetNotFoundError."""
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
    folder = run_dir / "checkpoints"
    folder.mkdir(exist_ok=True)
    tmp = folder / "last.pt.tmp"
    torch.save(state, tmp)
    tmp.replace(folder / "last.pt")


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
    dump_config(config, path / "config.yaml")
    _write_clients(prepared.ctx, path / "clients.json")
    return _loop(prepared, path, start=None, progress=progress)


def resume(run_dir: str | Path, progress: bool | None = None) -> RunResult:
    """Continue a stopped run from ``run_dir/checkpoints/last.pt`` (``splitfl run --resume``)."""
    path = Path(run_dir)
    if not (path / "config.yaml").exists():
        raise ConfigError("--resume", f"{path} is not a run directory (no config.yaml)")
    config = load_config(path / "config.yaml")
    prepared = prepare(config)
    ckpt_path = path / "checkpoints" / "last.pt"
    start = torch.load(ckpt_path, weights_only=False) if ckpt_path.exists() else None
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
    samples = {u.client: u.samples for u in result.updates}
    losses = {u.client: u.loss_sum / max(u.samples, 1) for u in result.updates}
    jitter = jitter_factors(sorted(costs), config.devices.jitter, rng_for(config.seed, "jitter", r))
    times = {c: cost.time * jitter[c] for c, cost in costs.items()}
    round_time, waits = algorithm.round_time(times)
    return RoundReport(times, costs, jitter, samples, losses, round_time), waits


def _round_row(ctx, plan, result, report: RoundReport, waits, traffic: Traffic, r: int) -> dict:
    """Per-round metrics (test accuracy is filled in by the caller when evaluated)."""
    return {
        "round_time": report.round_time,
        "train_loss": result.train_loss,
        "test_acc": None,
        "test_loss": None,
        "avg_waiting": sum(waits.values()) / len(waits),
        "energy_j": sum(
            c.device_time * report.jitter[k] * ctx.population.at(k, r).power
            for k, c in report.costs.items()
        ),
        **{f"bytes_{link}": getattr(traffic, link) for link in LINKS},
        "traffic_total": traffic.total,
        "clients": [t.client for t in plan.tasks],
        "cuts": [t.cut for t in plan.tasks],
        "groups": [t.group for t in plan.tasks],
        "client_times": [report.times[t.client] for t in plan.tasks],
    }


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
    global_state = {k: v.clone() for k, v in ctx.model.state_dict().items()}
    clock, cum = SimClock(), Traffic()
    first_round, wall_offset = 0, 0.0
    rows: list[dict[str, Any]] = []
    if start is not None:
        global_state = start["global_state"]
        algorithm.load_state_dict(start["algorithm"])
        clock.now = start["clock"]
        cum = Traffic(**start["traffic"])
        first_round = start["round"]
        rows = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["round"] <= first_round]
        wall_offset = rows[-1]["wall_time"] if rows else 0.0
    write_metrics(run_dir / "metrics.jsonl", rows)
    eval_model = ctx.model if device == "cpu" else copy.deepcopy(ctx.model).to(device)
    test = ctx.bundle.test
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
    t0 = time.perf_counter() - wall_offset
    status = "ok"

    def checkpoint(rounds_done: int) -> None:
        _save_checkpoint(
            run_dir,
            {
                "round": rounds_done,
                "global_state": global_state,
                "algorithm": algorithm.state_dict(),
                "clock": clock.now,
                "traffic": cum.to_dict(),
                "seed_rule": "streams derived from (seed, purpose, round)",
            },
        )

    if start is None:
        checkpoint(0)
    trackers = make_trackers(config, run_dir)  # output.tracking (none by default)
    try:
        for r in bar:
            torch.manual_seed(derive_seed(config.seed, "torch", r))
            clients = algorithm.select_clients(r, rng_for(config.seed, "select", r))
            plan = algorithm.plan_round(r, clients, rng_for(config.seed, "plan", r))
            result = executor.run_round(ctx, global_state, plan, derive_seed(config.seed, "b", r))
            report, waits = _measure(config, algorithm, plan, result, r)
            algorithm.observe(r, plan, report)
            global_state = algorithm.aggregate(global_state, plan, result)
            clock.advance(report.round_time)
            traffic = Traffic()
            for cost in report.costs.values():
                traffic.add(cost.traffic)
            cum.add(traffic)
            row = {
                "round": r + 1,
                "sim_time": clock.now,
                "wall_time": time.perf_counter() - t0,
                **_round_row(ctx, plan, result, report, waits, traffic, r),
                "traffic_total_cum": cum.total,
                **{f"plan_{k}": v for k, v in plan.info.items()},
            }
            if (r + 1) % config.eval.every == 0 or r + 1 == config.rounds:
                eval_model.load_state_dict(global_state)
                row["test_acc"], row["test_loss"] = evaluate(
                    eval_model, test.x, test.y, config.eval.batch_size
                )
                bar.set_postfix(acc=f"{row['test_acc']:.3f}", sim=f"{clock.now:.0f}s")
            rows.append(row)
            with open(run_dir / "metrics.jsonl", "a") as fh:
                fh.write(json.dumps(row) + "\n")
            trackers.log_round(row)
            if (r + 1) % config.output.checkpoint_every == 0 or r + 1 == config.rounds:
                checkpoint(r + 1)
    except NonFiniteLossError as err:
        status = f"diverged at round {r + 1}: {err}"
        raise NonFiniteLossError(
            f"{status}; last good checkpoint kept in {run_dir / 'checkpoints'}"
        ) from err
    finally:
        bar.close()
        if blas is not None:
            blas.restore_original_limits()
        trackers.close()
        summary = summarize(rows, config.eval.target_accuracy, status)
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        if rows:
            plot_accuracy({config.algorithm: rows}, run_dir / "accuracy.png", config.algorithm)
    if status == "ok":
        ctx.model.load_state_dict(global_state)
        torch.save(global_state, run_dir / "model.pt")
    return RunResult(run_dir, config, rows, summary)

"""The round loop around :func:`~splitfl.experiment.round_step.play_round`: thread limits, the
start state (fresh or from a checkpoint), progress, recording and divergence handling.

Optimisers are created afresh each round and every random stream is derived from
``(seed, purpose, round)``, so a checkpoint of the global model, the algorithm state, the
server optimiser's state (``train.server_optimizer``, kept across rounds) and the clock is all
a resume needs to reproduce an uninterrupted run exactly. Ctrl-C/SIGTERM and
exploding losses are handled in :mod:`splitfl.experiment.guards`.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from threadpoolctl import threadpool_limits

from splitfl.config import ConfigError, ExperimentConfig, resolve_device
from splitfl.core.atomic import error_line
from splitfl.executors import NonFiniteLossError, WorkersLostError
from splitfl.experiment.device_data import adopt_device_data, write_devices
from splitfl.experiment.guards import RunInterrupted, check_explosion, sigterm_as_interrupt
from splitfl.experiment.model_errors import ModelRoundError, model_round_error
from splitfl.experiment.progress import round_figures, round_progress
from splitfl.experiment.recorder import Recorder
from splitfl.experiment.round_step import LoopState, evaluate_state, play_round, trains
from splitfl.experiment.runtimes import RUNTIMES, build_runtime
from splitfl.metrics.summary import BUDGET_STATUS
from splitfl.models.base import moving_state, user_state_dict
from splitfl.models.hf_export import exported_state
from splitfl.roles.cut_record import CutRecorder
from splitfl.roles.dp_sgd import history_from_rows
from splitfl.system import SimClock, Traffic
from splitfl.training import import_optimizers

if TYPE_CHECKING:
    from splitfl.experiment.context import Prepared


@contextlib.contextmanager
def thread_limits(threads: int | None) -> Iterator[None]:
    """torch's and the BLAS libraries' (numpy/scipy: MergeSFL's SLSQP, …) thread counts: a
    run gives the same numbers wherever it runs (Ray workers default BLAS to 1 thread)."""
    if threads is None:
        yield
        return
    torch.set_num_threads(threads)
    blas = threadpool_limits(limits=threads, user_api="blas")
    try:
        yield
    finally:
        blas.restore_original_limits()


def start_state(
    prep: Prepared, start: dict | None, eval_model, run_dir: Path, evaluate: bool = True
):
    """A fresh loop state and recorder, or the checkpoint's (its rows replace
    ``metrics.jsonl``); ``evaluate=False`` (nothing is trained) skips the initial model's test
    loss that the explosion check compares with."""
    config, algorithm = prep.config, prep.algorithm
    if start is None:
        global_state = {k: v.clone() for k, v in prep.ctx.model.state_dict().items()}
        initial = None
        if evaluate and config.train.explode_factor and config.train.explode_rounds:
            initial = evaluate_state(prep.ctx, eval_model, global_state)["loss"]
        st = LoopState(global_state, SimClock(), Traffic(), initial)
        rec = Recorder(run_dir, config, [], [], 0)
        rec.state_keys = set(moving_state(prep.ctx.model, prep.ctx.model))
        rec.data_fingerprint, rec.chance = prep.data_fingerprint, chance_of(prep)
        return st, rec
    clock = SimClock()
    clock.now = start["clock"]
    try:
        algorithm.load_state_dict(start["algorithm"])
        cum = Traffic(**start["traffic"])
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as err:
        raise ConfigError(
            "--resume",
            f"the checkpoint's state does not fit {config.algorithm} "
            f"({type(err).__name__}: {err}); damaged or from another run?",
        ) from None
    # a LoRA model's frozen base is not in the checkpoint: the freshly built model's
    base = {k: v.clone() for k, v in prep.ctx.model.state_dict().items()}
    st = LoopState({**base, **start["global_state"]}, clock, cum, start.get("initial_loss"))
    st.server_opt = start.get("server_optimizer", {})  # absent: written without one
    rec = Recorder.restored(run_dir, config, start)
    st.dp_history = history_from_rows(rec.rows)  # DP-SGD's accountant, from the rows
    st.executor = start.get("executor")  # absent: written by an executor that keeps none
    rec.state_keys = set(moving_state(prep.ctx.model, prep.ctx.model))
    rec.data_fingerprint, rec.chance = prep.data_fingerprint, chance_of(prep)
    return st, rec


def executor_state(executor) -> dict | None:  # noqa: ANN001
    """The executor's run-spanning state to checkpoint (``state_dict``), None without one."""
    state_dict = getattr(executor, "state_dict", None)
    return None if state_dict is None else state_dict()


def restore_executor(executor, state: dict | None) -> None:  # noqa: ANN001
    """Give a resumed run's executor the state its checkpoint kept (nothing for a fresh run,
    an executor that keeps none, or a checkpoint written without it)."""
    if state is None or not hasattr(executor, "load_state_dict"):
        return
    try:
        executor.load_state_dict(state)
    except (AttributeError, KeyError, TypeError, ValueError) as err:
        raise ConfigError(
            "--resume", f"the checkpoint's executor state is damaged ({type(err).__name__}: {err})"
        ) from None


def chance_of(prep: Prepared) -> float | None:
    """A guess's test accuracy, 1 / the number of classes, for a ``cross_entropy`` run (as
    ``splitfl.metrics.rundirs.chance_accuracy`` reads it back); None otherwise."""
    classes = prep.ctx.bundle.num_classes
    return 1 / classes if prep.config.train.loss == "cross_entropy" and classes else None


@contextlib.contextmanager
def executor_session(executor, ctx, run_dir: Path) -> Iterator[None]:
    """Open the executor for the run (a networked one starts listening and waits for its
    devices) and close it however the run ends."""
    opener = getattr(executor, "open", None)
    if opener is None:
        yield
        return
    opener(ctx, run_dir)
    try:
        yield
    finally:
        executor.close()


def resume_command(config, run_dir: Path) -> str:  # noqa: ANN001
    """The command that continues a stopped run: a server waiting for remote devices resumes
    as ``splitfl server --resume`` (with its network flags), any other run as ``splitfl run``."""
    if config.executor == "networked" and config.network.devices == 0:
        return f"splitfl server --resume {run_dir} (with the same --listen/--tls/--tokens flags)"
    return f"splitfl run --resume {run_dir}"


def run_loop(prep: Prepared, run_dir: Path, start: dict | None, progress: bool | None):
    """Play the rounds from ``start`` (None: a fresh run) to ``config.rounds``; returns the
    summary and the final loop state.

    A finished run writes ``model.pt`` and then ``summary.json`` (status ``ok``) while
    SIGTERM is still turned into an interrupt: a SIGTERM before the summary is written is
    recorded as ``interrupted at round k`` (the last checkpoint holds every round, so a
    resume only writes the two files). Any other end writes the summary of where it stopped.
    """
    config = prep.config
    device = resolve_device(config.device)
    executor = build_runtime(config, device)
    with thread_limits(config.threads), executor_session(executor, prep.ctx, run_dir):
        adopt_device_data(prep, executor, run_dir, resuming=start is not None)
        config = prep.config  # adopted from the devices' data where they hold it
        if config.privacy.record is not None and trains(executor):
            prep.ctx.cut_record = CutRecorder(
                config.privacy.record,
                run_dir,
                prep.ctx.client_indices,
                prep.ctx.config.train.drop_last,
            )
        if RUNTIMES[config.executor].trains_here:
            import_optimizers()
        eval_model = prep.ctx.model if device == "cpu" else copy.deepcopy(prep.ctx.model).to(device)
        st, rec = start_state(prep, start, eval_model, run_dir, trains(executor))
        restore_executor(executor, st.executor)
        bar = round_progress(config, len(rec.rows), progress)
        status = None  # set by the handlers below; never "ok" unless the run finished
        try:
            with sigterm_as_interrupt():
                ended = _play_rounds(prep, executor, st, rec, eval_model, bar, start is None)
                state = user_state_dict(prep.ctx.model, st.global_state)
                rec.finish(ended, exported_state(prep.ctx.model, state, run_dir))
        except NonFiniteLossError as err:
            status = f"diverged at round {len(rec.rows) + (not rec.consistent)}: {err}"
            raise NonFiniteLossError(
                f"{status}; last good checkpoint kept in {run_dir / 'checkpoints'}"
            ) from err
        except KeyboardInterrupt as err:
            status = f"interrupted at round {len(rec.rows)}"
            line = f"{status} of {config.rounds}"
            raise RunInterrupted(_kept(line, prep, st, rec, run_dir)) from err
        except WorkersLostError as err:  # parallel workers lost past parallel.max_retries
            status = f"stopped at round {len(rec.rows)}: {err}"
            line = f"stopped at round {len(rec.rows)} of {config.rounds}: {err}"
            raise WorkersLostError(_kept(line, prep, st, rec, run_dir)) from None
        except ModelRoundError as err:  # the user's model raised (one line)
            status = f"stopped at round {len(rec.rows) + 1}: {err}"
            if err.rounds_done == 0:  # nothing trained: the runner removes the directory
                raise
            kept = _kept(err.message, prep, st, rec, run_dir)
            raise ModelRoundError(kept, err.rounds_done) from None
        except Exception as err:  # an OS error (a full disk), a lost network, a bug
            status = f"stopped at round {len(rec.rows)}: {error_line(err)}"
            raise
        finally:
            bar.close()
            if rec.summary is None:
                _record_stop(rec, status or f"stopped at round {len(rec.rows)}")
    return rec.summary, st, rec.rows


def _kept(line: str, prep: Prepared, st, rec: Recorder, run_dir: Path) -> str:  # noqa: ANN001
    """Checkpoint every finished round (an end in the middle of a round keeps the rounds
    before it); ``line`` (where the run stopped) with the checkpoint and how to continue."""
    if rec.consistent and rec.checkpoint_round < len(rec.rows):
        rec.checkpoint(st, prep.algorithm)  # nothing is lost
    elif not rec.consistent:  # mid-round: the rounds before it are kept
        rec.checkpoint_last()
    return (
        f"{line}; checkpoint at round {rec.checkpoint_round} kept in "
        f"{run_dir / 'checkpoints'}; continue with: {resume_command(prep.config, run_dir)}"
    )


def _play_rounds(prep: Prepared, executor, st, rec: Recorder, eval_model, bar, fresh: bool) -> str:  # noqa: ANN001
    """The rounds of ``bar``: play, record, check, checkpoint (``rec.consistent`` is False
    while a round has changed the model or the algorithm but is not recorded yet); the
    finished run's status: ``ok``, or why it ended early (:func:`budget_status`)."""
    config, algorithm = prep.config, prep.algorithm
    t0 = time.perf_counter() - (rec.rows[-1]["wall_time"] if rec.rows else 0.0)
    if fresh:
        rec.checkpoint(st, algorithm)
    rec.open_trackers()
    for r in bar:
        rec.consistent = False
        try:
            row = play_round(prep, executor, st, r, eval_model, t0)
        except (ConfigError, NonFiniteLossError, WorkersLostError, OSError):
            raise  # splitfl's own one-line errors, and the disk's
        except Exception as err:  # the user's model raised: one line (else as it is)
            line = model_round_error(err, prep.ctx.model, r)
            if line is None:
                raise
            raise ModelRoundError(line, len(rec.rows)) from None
        rec.record(row)
        st.executor = executor_state(executor)
        write_devices(config, executor, rec.run_dir, rec.rows)  # with the devices' own data
        rec.consistent = True  # model, algorithm, clock and rows all after round r + 1
        rec.remember(st, algorithm)
        bar.set_postfix(**round_figures(row, st.clock.now))
        rec.log(row)
        check_explosion(rec.rows, st.initial_loss, config.train)
        ended = budget_status(config, st.cum.total, r)
        if ended or (r + 1) % config.output.checkpoint_every == 0 or r + 1 == config.rounds:
            rec.checkpoint(st, algorithm)
        if ended:
            return ended
    return "ok"


def budget_status(config: ExperimentConfig, traffic_bytes: float, r: int) -> str:
    """``train.comm_budget_mb``: why the run ends after round ``r`` (its cumulative traffic
    reached the budget, FSL-SAGE's ``comm_threshold_mb`` test), or "" to go on."""
    budget = config.train.comm_budget_mb
    if budget is None or traffic_bytes / 2**20 < budget:
        return ""
    return (
        f"{BUDGET_STATUS}: {traffic_bytes / 2**20:.3f} MiB >= train.comm_budget_mb = {budget} "
        f"after round {r + 1} of {config.rounds}"
    )


def _record_stop(rec: Recorder, status: str) -> None:
    """The summary of a run that stopped early; an OS error while writing it (a full disk)
    must not hide the error that stopped the run."""
    try:
        rec.finish(status)
    except OSError:
        pass

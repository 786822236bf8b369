"""Conformance: every registered algorithm keeps the framework's contract (issue 47 item 4).

One list, :data:`ALL`, read from the registry (``splitfl.catalog()``, the names ``splitfl list``
prints: every algorithm and alias, installed plugins included), so that a newly registered
algorithm is checked by every test here without an edit. For each, on its tiniest config
(:func:`conform_config`):

* determinism: a rerun with the same seed gives the same metrics rows (but the wall clock) and
  the same ``model.pt``, byte for byte; the rows ``splitfl.run`` returns are the recorded ones;
* checkpoint round trip: stopped after round 2 and resumed ≡ the uninterrupted 3-round run;
* executors: ``parallel`` ≡ ``sequential`` bit for bit (the same roles run the same
  operations); ``vectorized``, forced to batch, ≈ ``sequential`` in float64 within
  :data:`F64_ATOL` (a different code path), or bit for bit where its documented fallback ran
  the reference executor;
* ``executor: timing`` charges every round the sequential run's simulated time and traffic
  (every row field that is not trained) for an algorithm that declares no
  ``training_signals``, and runs its declared stand-in otherwise.

Algorithm-specific behaviour stays in the algorithm's own test file; the executors' round by
round equivalence on harder settings (momentum, weight decay, dropout) in
``tests/executors/test_vectorized.py`` and ``tests/executors/test_parallel.py``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math

import pytest
import torch

import splitfl
from conftest import force_batching
from splitfl.algorithms import ALIASES, resolve_algorithm
from splitfl.executors import ParallelExecutor
from splitfl.executors.parallel import coupled
from splitfl.executors.pools import LocalPool
from splitfl.experiment import loop, runner
from splitfl.testing import config_for

#: Every name the registry runs (algorithms and aliases), plugins included.
ALL = list(splitfl.catalog()["algorithms"])
ROUNDS = 3
#: Row fields that depend on training (or on the wall clock), not on the plan and the clock.
TRAINED = {"wall_time", "train_loss", "train_loss_median", "test_acc", "test_loss"}
#: Vectorised vs sequential, 3 rounds end to end in float64: the two paths differ only in
#: summation order (batched rows vs one client at a time), ~1e-16 per operation (measured:
#: at most 3.4e-16 on the final model, 9e-16 on the losses); a real discrepancy is far above
#: (ARCHITECTURE.md, "Testing numbers: exact or close").
F64_ATOL = 1e-12
#: Participants the tiniest config needs for a round of several groups (each a unit that
#: ``executor: parallel`` deals), by algorithm (its aliases too) or alias: ParallelSFL's
#: clustering and S²FL's grouping by data balance alone put 3 participants in one group.
#: Default 3 of 6; RingSFL 4 of 4 (``config_for``).
FLEETS = {"parallelsfl": (12, 6), "s2fl+B": (12, 6)}


#: MergeSFL's batch regulation gives a merged group's members unequal batches; the
#: vectorised executor then scales their activation gradients (``device_grad: own``) by
#: sum(sizes)/size rounded to float32 (``executors/split_step.py``: ``torch.tensor(scale)``
#: takes the default dtype), the sequential executor by the Python float: in float64 the
#: final models differ by 7e-10 (train_loss by 1.6e-9) instead of ~1e-16.
def cls_of(name: str):
    return resolve_algorithm(name, {})[0]


def resolve_base(name: str) -> str:
    """The registered algorithm that ``name`` (an algorithm or an alias) runs."""
    return ALIASES[name][0] if name in ALIASES else name


def conform_config(name: str, **changes) -> dict:
    """The tiniest config that runs ``name``: ``config_for``'s fast options, 3 rounds of 2 local
    steps, 3 of 6 clients per round (:data:`FLEETS`; RingSFL: its ring-sized 4 of 4 on the
    MLP)."""
    small = {"rounds": ROUNDS, "train.local_steps": 2}
    if not name.startswith("ringsfl"):
        clients, per_round = FLEETS.get(name, FLEETS.get(resolve_base(name), (6, 3)))
        small |= {"data.num_clients": clients, "train.clients_per_round": per_round}
    return config_for(name, **{**small, **changes})


def strip(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if k != "wall_time"} for row in rows]


def sha256(path) -> str:  # noqa: ANN001
    return hashlib.sha256(path.read_bytes()).hexdigest()


def final_state(result) -> dict[str, torch.Tensor]:  # noqa: ANN001
    return torch.load(result.run_dir / "model.pt", weights_only=True)


def recorded(result) -> list[dict]:  # noqa: ANN001
    """The rows of the run's ``metrics.jsonl``, as a resume reads them back."""
    return [
        json.loads(line) for line in (result.run_dir / "metrics.jsonl").read_text().splitlines()
    ]


def strict_json(text: str) -> None:
    """Every line parses as JSON without NaN/Infinity."""

    def refuse(constant):  # noqa: ANN001
        raise ValueError(constant)

    for line in text.splitlines():
        json.loads(line, parse_constant=refuse)


# -- (a) determinism ------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALL)
def test_every_algorithm_runs_deterministically(algorithm, tmp_path, sequential_run):
    cfg = conform_config(algorithm)
    a = sequential_run(cfg)  # made once (the round trip and timing tests read it)
    b = splitfl.run(cfg, run_dir=tmp_path / "b")
    assert strip(a.metrics) == strip(b.metrics)
    assert sha256(a.run_dir / "model.pt") == sha256(b.run_dir / "model.pt")
    times = [r["sim_time"] for r in a.metrics]
    assert all(t2 > t1 for t1, t2 in zip(times, times[1:], strict=False))
    assert a.metrics[-1]["test_acc"] is not None
    for name in (
        "config.yaml",
        "data.json",
        "clients.json",
        "metrics.jsonl",
        "summary.json",
        "model.pt",
        "checkpoints/last.pt",
    ):
        assert (a.run_dir / name).exists(), name


#: AdaSampling's ``plan_draws`` and ``plan_q`` are keyed by int client ids in the rows
#: ``splitfl.run`` returns, by strings in ``metrics.jsonl`` (JSON keys), so a resumed run's
#: ``metrics`` (its first rows read back from the file) differ from an uninterrupted run's.


@pytest.mark.parametrize("algorithm", ALL)
def test_returned_rows_are_the_recorded_rows(algorithm, sequential_run):
    """``RunResult.metrics`` holds what ``metrics.jsonl`` holds (a resume returns rows read
    back from it), wall clock included."""
    a = sequential_run(conform_config(algorithm))
    assert a.metrics == recorded(a)


# -- (b) checkpoint round trip --------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALL)
def test_checkpoint_round_trip_for_every_algorithm(algorithm, tmp_path, sequential_run):
    """Stopping after round 2 and resuming gives the uninterrupted 3-round run: the same
    recorded rows (``metrics.jsonl``, but the wall clock) and the same final model."""
    full = sequential_run(conform_config(algorithm))
    part = splitfl.run(conform_config(algorithm, rounds=ROUNDS - 1), run_dir=tmp_path / "p")
    (part.run_dir / "config.yaml").write_text((full.run_dir / "config.yaml").read_text())
    resumed = splitfl.resume(part.run_dir)
    assert strip(recorded(resumed)) == strip(recorded(full))
    a, b = final_state(full), final_state(resumed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)


# -- (c) executors ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def float64_runs(tmp_path_factory):
    """``run(config, monkeypatch)`` in float64 (``prepare(..., dtype=torch.float64)``, as the
    executor tests compare), made once per config; returns the result and the executor that
    ran it."""
    made = {}

    def run(config: dict, monkeypatch, build=None):  # noqa: ANN001
        key = json.dumps(config, sort_keys=True)
        if build is None and key in made:
            return made[key]
        built = []

        def build_executor(cfg, device):  # noqa: ANN001
            built.append(build(cfg, device) if build else real_build(cfg, device))
            return built[-1]

        real_build = loop.build_runtime
        with monkeypatch.context() as m:
            m.setattr(runner, "prepare", functools.partial(runner.prepare, dtype=torch.float64))
            m.setattr(loop, "build_runtime", build_executor)
            result = splitfl.run(config, run_dir=tmp_path_factory.mktemp("f64") / "run")
        (executor,) = built
        assert next(iter(final_state(result).values())).dtype == torch.float64
        if build is None:
            made[key] = result, executor
        return result, executor

    return run


@pytest.fixture(scope="module")
def warm_pool():
    """Two local worker processes for the module's parallel runs. A fresh pool starts in
    seconds (a Python and torch import per worker), which 27 runs cannot afford; each run
    still sends its workers the whole start (``init``, which rebuilds the model, and every
    partition) as a fresh pool gets it, and a fresh pool's own start is tested in
    ``tests/executors/test_parallel.py``."""
    pool = LocalPool(2, threads=1, timeout_s=120)
    yield pool
    pool.close()


class WarmParallel(ParallelExecutor):
    """``executor: parallel`` on :func:`warm_pool`'s workers: :meth:`open` starts them as
    ``ParallelExecutor.open`` starts fresh ones; :meth:`close` leaves them running."""

    def __init__(self, pool: LocalPool, *args):
        super().__init__(*args)
        self.warm = pool
        self.why_coupled: list[str] = []  # per round: why it ran in the driver, or ""

    def open(self, ctx, run_dir=None) -> None:  # noqa: ANN001
        self.pool = self.warm
        workers = self.config.workers
        assert workers == len(self.warm.procs)
        self.held = [set(range(w, ctx.num_clients, workers)) for w in range(workers)]
        self._start(ctx)

    def close(self) -> None:
        self.pool = None

    def run_round(self, ctx, global_state, plan, round_seed):  # noqa: ANN001
        self.why_coupled.append(coupled(plan))
        return super().run_round(ctx, global_state, plan, round_seed)


@pytest.mark.parametrize("algorithm", ALL)
def test_parallel_run_equals_sequential_run(algorithm, float64_runs, warm_pool, monkeypatch):
    """Bit for bit: the same model and the same rows (but the wall clock). A round that is one
    coupled unit runs in the driver, as sequential (documented: ``splitfl list`` says
    ``[parallel: coupled: ...]``); an algorithm that declares none deals its rounds."""
    ref, _ = float64_runs(conform_config(algorithm), monkeypatch)

    def build(cfg, device):  # noqa: ANN001
        return WarmParallel(warm_pool, device, cfg.precision, cfg.channels_last, cfg.parallel)

    got, ex = float64_runs(conform_config(algorithm, executor="parallel"), monkeypatch, build)
    assert strip(got.metrics) == strip(ref.metrics)
    a, b = final_state(ref), final_state(got)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    why = ex.why_coupled
    assert len(why) == ROUNDS and ex.stats["coupled_rounds"] == sum(map(bool, why))
    assert (ex.stats["bytes_to_workers"]["units"] > 0) == (not all(why))  # dealt, or not sent
    if not cls_of(algorithm).coupled_round:  # its rounds are units unless one group trains
        assert set(why) <= {"", "one group"} and not all(why), why


@pytest.mark.parametrize("algorithm", ALL)
def test_vectorized_run_equals_sequential_run(algorithm, float64_runs, monkeypatch):
    """``executor: vectorized`` forced to batch (vmap; on CPU its default is the reference
    loop): close in float64 (:data:`F64_ATOL`), its plans and clock identical. Rounds it
    cannot batch (documented: sequential server, mixup pairs) run on the reference executor;
    a run of those only is bit-identical."""
    ref, _ = float64_runs(conform_config(algorithm), monkeypatch)
    force_batching(monkeypatch, use_vmap=True)
    got, ex = float64_runs(conform_config(algorithm, executor="vectorized"), monkeypatch, None)
    a, b = final_state(ref), final_state(got)
    assert a.keys() == b.keys()
    if ex.fallbacks == ROUNDS:
        assert strip(got.metrics) == strip(ref.metrics)
        assert all(torch.equal(a[k], b[k]) for k in a)
        return
    for k in a:
        torch.testing.assert_close(
            b[k], a[k], atol=F64_ATOL, rtol=0, msg=lambda m, k=k: f"{k}: {m}"
        )
    # the plans and the clock: identical; what an algorithm's training signals (gradient
    # norms, losses) put into its plan info is as close as the training
    signals = cls_of(algorithm).training_signals
    for r, s in zip(strip(ref.metrics), strip(got.metrics), strict=True):
        assert r.keys() == s.keys()
        for k in r:
            if k in TRAINED or (signals and k.startswith("plan_")):
                assert close(r[k], s[k]), (k, r[k], s[k])
            else:
                assert r[k] == s[k], k


def close(a, b) -> bool:  # noqa: ANN001
    """``a`` ≈ ``b``: floats within :data:`F64_ATOL`, everything else (and the structure) equal."""
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=0, abs_tol=F64_ATOL)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(close(x, y) for x, y in zip(a, b, strict=True))
    return a == b


# -- (d) executor: timing -------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALL)
def test_timing_charges_what_sequential_charges(algorithm, tmp_path, sequential_run):
    """Same plans, same clock: every metrics field but the trained ones is identical, for an
    algorithm without ``training_signals``; one with signals runs its declared stand-in
    (its plans may then differ). Neither records a trained value."""
    cls = cls_of(algorithm)
    timing = conform_config(algorithm, executor="timing", **{"output.plots": True})
    got = splitfl.run(timing, run_dir=tmp_path / "t")
    for b in got.metrics:
        assert (b["test_acc"], b["test_loss"], b["train_loss"]) == (None, None, None)
        assert b["round_time"] > 0 and b["traffic_total"] > 0
    assert got.summary["final_acc"] is None and got.summary["best_acc"] is None
    strict_json((got.run_dir / "metrics.jsonl").read_text())
    strict_json((got.run_dir / "summary.json").read_text().replace("\n", " "))
    assert got.wait_plots() and not (got.run_dir / "accuracy.png").exists()
    if cls.training_signals:
        # else ``executor: timing`` refuses it (tests/system/test_timing.py)
        assert cls.timing_stand_in
        return
    ref = sequential_run(conform_config(algorithm))
    for a, b in zip(ref.metrics, got.metrics, strict=True):
        assert a.keys() == b.keys()
        for key in a.keys() - TRAINED:
            assert a[key] == b[key], key

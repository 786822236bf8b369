"""A paper's device preset reproduces that paper's time model by default (``devices.contention``
null): S²FL Eq. (1) and the RingSFL ring charge each device its own link; MergeSFL's and
ParallelSFL's testbed shares the PS / top-worker ingress. Contention is an opt-in otherwise."""

from pathlib import Path

import pytest
import yaml

import splitfl
from conftest import tiny_config
from splitfl.experiment.runner import as_config, prepare
from splitfl.experiment.validation import resolve_config
from splitfl.sweeps.directory import same_config
from splitfl.sweeps.spec import expand, load_sweep
from splitfl.system.devices import PAPER_CONTENTION, PRESETS

ROOT = Path(__file__).resolve().parents[2]
#: What each preset's paper charges (written out here, not read from the code under test).
PAPER_MODEL = {
    "s2fl_table1": False,
    "homogeneous": False,
    "ringsfl_testbed": False,
    "jetson80": True,
}
#: S²FL Table 1 (FLOP/s and B/s) and the server.
FLOPS = {"High": 2e10, "Mid": 1e10, "Low": 5e9}
RATE = {"High": 5e6, "Mid": 2e6, "Low": 1e6}
SERVER_FLOPS = 5e10


def _shipped_configs() -> list[Path]:
    files = [*ROOT.glob("configs/*.yaml"), *ROOT.glob("benchmarks/papers/*/*.yaml")]
    return sorted(p for p in files if "attack" not in p.name)  # privacy attacks: no clock


@pytest.mark.parametrize("path", _shipped_configs(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_config_resolves_to_its_papers_time_model(path):
    if path.name.startswith("sweep_"):
        configs = [t.config for t in expand(load_sweep(path))]
    else:
        text = path.read_text()
        # a config of pre-trained weights the user brings: the same architecture, random weights
        stand_in = ["model=hf-config:" + str(ROOT / "benchmarks/papers/parallelsfl/roberta-base")]
        configs = [as_config(path, stand_in if "model: hf:" in text else None)]
    assert configs
    for config in configs:
        resolved = resolve_config(config).devices
        assert resolved.contention is PAPER_MODEL[resolved.preset], resolved.preset


def test_every_preset_states_its_papers_model():
    assert PAPER_CONTENTION == PAPER_MODEL and set(PAPER_CONTENTION) == set(PRESETS)


def _eq1(ctx, client: int, cut: int) -> float:
    """S²FL Eq. (1) by hand from the client's Table 1 levels."""
    kind = dict(part.split("=") for part in ctx.population.devices[client].kind.split(","))
    rate, flops = RATE[kind["rate"]], FLOPS[kind["flops"]]
    b = ctx.config.train.batch_size
    p = ctx.round_samples(client, b, ctx.local_steps(client, b))
    prof = ctx.profile
    transfer = (2 * prof.device_bytes(cut) + 2 * p * prof.activation_bytes(cut)) / rate
    return transfer + p * prof.device_flops(cut) / flops + p * prof.server_flops(cut) / SERVER_FLOPS


def test_default_s2fl_table1_client_times_are_eq1_by_hand(tmp_path):
    """All 12 clients at once: a 1e7 B/s server shared would cut every rate to 8.3e5 B/s."""
    cfg = tiny_config(algorithm="splitfed_v1", rounds=1, **{"train.clients_per_round": 12})
    row = splitfl.run(cfg, run_dir=tmp_path / "r").metrics[0]
    ctx = prepare(as_config(cfg)).ctx
    levels = {ctx.population.devices[c].kind.split("rate=")[1] for c in row["clients"]}
    assert levels == {"High", "Mid", "Low"}
    for client, cut, t in zip(row["clients"], row["cuts"], row["client_times"], strict=True):
        assert t == pytest.approx(_eq1(ctx, client, cut), rel=1e-12)
    assert row["round_time"] == pytest.approx(max(row["client_times"]), rel=1e-12)


@pytest.mark.parametrize("barrier", [False, True], ids=["default", "lockstep_barrier"])
def test_default_s2fl_and_sfl_runs_are_charged_eq1(tmp_path, barrier):
    """Replay of the quickstart's pair: S²FL (all-device warm-up, then adaptive cuts) and
    SplitFed V1 are charged each client's own-link Eq. (1) time in every round, and the round
    lasts the slowest client's; with ``lockstep_barrier`` (a sensitivity) S²FL's rounds are
    longer where its groups' step counts differ."""
    if barrier:
        cfg = tiny_config(algorithm="s2fl", rounds=6, **{"options.s2fl.lockstep_barrier": True})
        rows = splitfl.run(cfg, run_dir=tmp_path / "barrier").metrics
        assert any(r["round_time"] > max(r["client_times"]) * (1 + 1e-9) for r in rows)
        return
    for algorithm in ("s2fl", "splitfed_v1"):
        cfg = tiny_config(algorithm=algorithm, rounds=4)
        rows = splitfl.run(cfg, run_dir=tmp_path / algorithm).metrics
        ctx = prepare(as_config(cfg)).ctx
        assert len(rows) == 4  # the loops below run
        for row in rows:
            times = zip(row["clients"], row["cuts"], row["client_times"], strict=True)
            for client, cut, t in times:
                assert t == pytest.approx(_eq1(ctx, client, cut), rel=1e-12), (algorithm, row)
            # §3.1: the round ends with the last upload (no group barrier on top of Eq. 1)
            assert row["round_time"] == pytest.approx(max(row["client_times"]), rel=1e-12)


def test_resolved_model_is_written_shown_and_overridable(tmp_path):
    run = splitfl.run(tiny_config(rounds=1), run_dir=tmp_path / "a")
    held = yaml.safe_load((run.run_dir / "config.yaml").read_text())
    assert held["devices"]["contention"] is False
    jetson = tiny_config(rounds=1, **{"devices.preset": "jetson80"})
    assert prepare(as_config(jetson)).config.devices.contention is True
    on = tiny_config(rounds=1, **{"devices.contention": True})
    assert prepare(as_config(on)).config.devices.contention is True
    assert "server link not shared" in splitfl.validate(tiny_config())
    # a sweep resumes over a run directory that holds the resolved value
    assert same_config(run.run_dir, as_config(tiny_config(rounds=1)))

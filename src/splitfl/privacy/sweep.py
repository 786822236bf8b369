"""The privacy–utility sweep (``splitfl privacy eval SWEEP.yaml``, :func:`evaluate_sweep`):
algorithms × cuts × defences × attacks on real splitfl runs.

Each (algorithm, cut, defence) cell is one run (:func:`splitfl.experiment.run`); each attack
is then run on it (:func:`splitfl.privacy.on_run.attack_run`) for every point of its small
hyper-parameter grid, and the best attack performance (AP) is kept — a defence is judged
against its best attack, as SecretFlow's autoattack tunes attacks per defence. AP is SSIM
(clipped to [0, 1]) for reconstructions and the larger of the norm and direction AUCs for
label inference. Main-task performance (MP) is the run's final test accuracy; time and
traffic to ``target_accuracy`` come from the run's ``summary.json``.

VFLAIR's Defense Capability Score (Zou et al., "VFLAIR: A Research Library and Benchmark for
Vertical Federated Learning", ICLR 2024, Eq. 1):

    DCS = 1 / (1 + sqrt((1 − β)(AP − AP*)² + β(MP − MP*)²))

with the ideal defence AP* = 0 and MP* = the undefended cell's MP (same algorithm and cut);
T-DCS is DCS averaged over the attacks of one type (``reconstruction``, ``labels``).

Per device: every client of the run's last round is attacked at its own cut, so algorithms
whose cut varies per device (S²FL's sliding split) get one row per device; each row also
names the device's group (ParallelSFL's cluster) and batch size (MergeSFL's heterogeneous
batches), :func:`device_columns`.

Target: ``final`` (the default) attacks what each device would send the server with the final
model (:func:`~splitfl.privacy.on_run.attack_run` on ``model.pt``); ``recorded`` attacks the
tensors the server received during training (the run's ``privacy.record``, which the base
config sets: :mod:`splitfl.roles.cut_record`), of each of ``rounds`` (default: every round
the record names), every client recorded in that round at its cut there — the same
``attack_run`` with ``recorded`` and ``round`` set, as
:func:`~splitfl.privacy.on_run.attack_recorded` calls it. MP stays the final accuracy.
"""

from __future__ import annotations

import itertools
import json
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from splitfl.config import ConfigError, read_yaml_mapping
from splitfl.experiment.runner import as_config, run
from splitfl.metrics.records import read_metrics
from splitfl.privacy.on_run import RunAttack, attack_run
from splitfl.privacy.sweep_report import write_report
from splitfl.roles.cut_record import read_record

#: VFLAIR's default weighting of MP against AP in DCS (Zou et al., ICLR 2024, §4: β = 0.5).
DEFAULT_BETA = 0.5
#: Each sweep attack name and the :class:`RunAttack` fields it fixes: ``unsplit_estimated``
#: is UnSplit by the paper's server that knows only the device part's architecture
#: (Erdogan et al., WPES 2022, Alg. 1), ``unsplit`` the SplitFed server that holds the part.
SWEEP_ATTACKS = {
    "unsplit": {"attack": "unsplit"},
    "unsplit_estimated": {"attack": "unsplit", "device_part": "estimated"},
    "inverse": {"attack": "inverse"},
    "labels": {"attack": "labels"},
}
#: The attack type of each attack, for T-DCS (VFLAIR groups attacks by type).
ATTACK_TYPES = {
    "unsplit": "reconstruction", "unsplit_estimated": "reconstruction",
    "inverse": "reconstruction", "labels": "labels",
}  # fmt: skip
#: RunAttack fields a grid may not set: the victim's (per device), the attack's own and the
#: sweep's ``target`` (``recorded``, ``round``).
FIXED_FIELDS = ("run_dir", "attack", "client", "cut", "samples", "device_part", "recorded", "round")
SWEEP_FIELDS = (
    "base", "algorithms", "cuts", "defences", "attacks", "reference", "beta", "out", "samples",
    "only", "target", "rounds",
)  # fmt: skip
#: What the attacks read: each device's smashed data recomputed with the final model, or
#: the tensors the server recorded during training (``privacy.record``).
TARGETS = ("final", "recorded")


def dcs(ap: float, mp: float, mp_ideal: float, beta: float = DEFAULT_BETA, ap_ideal=0.0):
    """VFLAIR's Defense Capability Score (Zou et al., ICLR 2024, Eq. 1), in (0, 1]."""
    return 1.0 / (1.0 + math.sqrt((1 - beta) * (ap - ap_ideal) ** 2 + beta * (mp - mp_ideal) ** 2))


@dataclass(frozen=True)
class Sweep:
    """A sweep: ``base`` config mapping (or a YAML path); ``algorithms``; ``cuts``
    (``options.<alg>.cut``;
    ``[null]`` keeps each algorithm's own); ``defences`` (name → dotted overrides);
    ``reference``: the defence whose MP is DCS's MP* (the undefended one); ``attacks``
    (name → field → list of values, the per-attack grid); ``samples`` attacked per device;
    ``beta`` of DCS; ``out`` folder; ``only``: defence → the algorithms it runs with (a
    defence not named runs with every algorithm): the label defences (``label_noise``)
    apply only to U-shaped algorithms, whose labels stay on the device. ``target``:
    ``final`` (the final model) or ``recorded`` (what ``privacy.record`` kept) of
    ``rounds`` (recorded rounds from 1; null: every round the record names)."""

    base: dict
    algorithms: list
    defences: dict
    attacks: dict
    cuts: list = field(default_factory=lambda: [None])
    reference: str = "none"
    samples: int = 8
    beta: float = DEFAULT_BETA
    out: str = "runs/privacy-sweep"
    only: dict = field(default_factory=dict)
    target: str = "final"
    rounds: list | None = None


def _need(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ConfigError(name, message)


def load_sweep(data: Mapping[str, Any] | str | Path) -> Sweep:
    """A validated :class:`Sweep` from a mapping or YAML file; a bad field is one ConfigError
    naming it, raised before anything runs or is written."""
    raw = read_yaml_mapping(data) if isinstance(data, str | Path) else dict(data)
    for key in raw:
        _need(
            key in SWEEP_FIELDS, str(key), f"unknown sweep field; one of {', '.join(SWEEP_FIELDS)}"
        )
    for key in ("base", "algorithms", "defences", "attacks"):
        _need(key in raw, key, "missing")
    if isinstance(raw.get("base"), str):  # a config file, read as `splitfl run` reads it
        raw["base"] = read_yaml_mapping(raw["base"])
    sweep = Sweep(**raw)
    _need(isinstance(sweep.base, dict), "base", "must be a config mapping")
    _need(
        isinstance(sweep.algorithms, list) and bool(sweep.algorithms),
        "algorithms",
        "a non-empty list",
    )
    _need(isinstance(sweep.cuts, list) and bool(sweep.cuts), "cuts", "a non-empty list")
    _need(
        isinstance(sweep.defences, dict) and bool(sweep.defences), "defences", "a non-empty mapping"
    )
    _need(isinstance(sweep.attacks, dict) and bool(sweep.attacks), "attacks", "a non-empty mapping")
    _need(sweep.reference in sweep.defences, "reference", "must name one of the defences")
    _need(isinstance(sweep.samples, int) and sweep.samples >= 2, "samples", "an integer >= 2")
    _need(isinstance(sweep.beta, int | float) and 0 <= sweep.beta <= 1, "beta", "in [0, 1]")
    for name, grid in sweep.attacks.items():
        _need(name in SWEEP_ATTACKS, f"attacks.{name}", f"one of {', '.join(SWEEP_ATTACKS)}")
        _need(isinstance(grid, dict), f"attacks.{name}", "a mapping field -> list of values")
        for key, values in grid.items():
            where = f"attacks.{name}.{key}"
            _need(
                key in RunAttack.__dataclass_fields__ and key not in FIXED_FIELDS,
                where,
                "not a tunable attack field",
            )
            _need(isinstance(values, list) and bool(values), where, "a non-empty list")
    _check_only(sweep)
    _check_target(sweep)
    for alg, cut, defence in cells(sweep):
        _check_recorded(sweep, _cell_config(sweep, alg, cut, defence))
    return sweep


def _cell_config(sweep: Sweep, alg: str, cut, defence: str):
    """One cell's validated config; a defence's error names the defence."""
    try:
        return as_config(sweep.base, cell_overrides(sweep, alg, cut, defence))
    except ConfigError as err:
        if not sweep.defences[defence]:
            raise  # the base config or the algorithm's, not a defence's
        hint = f"; only.{defence} lists the algorithms a defence applies to"
        raise ConfigError(f"defences.{defence}", f"with {alg}: {err}{hint}") from err


def _check_target(sweep: Sweep) -> None:
    """``target`` one of :data:`TARGETS`; ``rounds`` (only with ``recorded``) distinct
    integers >= 1."""
    _need(sweep.target in TARGETS, "target", f"final or recorded (got {sweep.target!r})")
    if sweep.rounds is None:
        return
    _need(sweep.target == "recorded", "rounds", "names recorded rounds: give target: recorded")
    rounds = sweep.rounds if isinstance(sweep.rounds, list) else []
    ok = all(isinstance(r, int) and not isinstance(r, bool) and r >= 1 for r in rounds)
    _need(ok and bool(rounds), "rounds", f"a non-empty list of rounds from 1 (got {sweep.rounds})")
    _need(len(set(rounds)) == len(rounds), "rounds", f"entries must be distinct ({rounds})")


def _check_recorded(sweep: Sweep, config) -> None:
    """``target: recorded``: the cell's run records (``privacy.record``) every round it
    attacks."""
    if sweep.target != "recorded":
        return
    record = config.privacy.record
    _need(
        record is not None,
        "target",
        "recorded attacks what privacy.record keeps: the base config records nothing "
        "(set privacy.record.rounds)",
    )
    for r in attacked_rounds(sweep, config):
        _need(
            r in record.rounds,
            "rounds",
            f"round {r} is not recorded (privacy.record.rounds: {list(record.rounds)})",
        )


def attacked_rounds(sweep: Sweep, config) -> list[int]:
    """The recorded rounds ``target: recorded`` attacks in a cell of ``config``: the sweep's
    ``rounds``, else every round its ``privacy.record`` names."""
    return list(sweep.rounds if sweep.rounds is not None else config.privacy.record.rounds)


def _check_only(sweep: Sweep) -> None:
    """``only``: defence → a non-empty list of the sweep's algorithms; never the reference
    (every algorithm needs its MP*)."""
    _need(isinstance(sweep.only, dict), "only", "a mapping defence -> list of algorithms")
    for name, algs in sweep.only.items():
        where = f"only.{name}"
        _need(name in sweep.defences, where, "must name one of the defences")
        _need(name != sweep.reference, where, "the reference defence runs with every algorithm")
        _need(isinstance(algs, list) and bool(algs), where, "a non-empty list of algorithms")
        for alg in algs:
            _need(alg in sweep.algorithms, where, f"{alg!r} is not one of the sweep's algorithms")


def cells(sweep: Sweep):
    """(algorithm, cut, defence) of every run of the sweep (a defence in ``only`` with its
    algorithms alone)."""
    for alg, cut, defence in itertools.product(sweep.algorithms, sweep.cuts, sweep.defences):
        if defence not in sweep.only or alg in sweep.only[defence]:
            yield alg, cut, defence


def cell_overrides(sweep: Sweep, alg: str, cut, defence: str) -> list[str]:
    """The dotted overrides of one cell's run."""
    over = [f"algorithm={alg}"] + ([f"options.{alg}.cut={cut}"] if cut is not None else [])
    spec = sweep.defences[defence] or {}
    if not isinstance(spec, dict):
        raise ConfigError(f"defences.{defence}", "a mapping of dotted config keys -> values")
    return over + [f"{k}={v}" for k, v in spec.items()]


def _best(run_dir: Path, name: str, grid: dict, device: dict, samples: int) -> dict:
    """The best AP of attack ``name`` over its grid on ``device`` (its client, cut and, for
    ``target: recorded``, the recorded round; None: the final model)."""
    best: dict | None = None
    keys = list(grid)
    r = device["round"]
    victim = {"client": device["device"], "cut": device["cut"], "recorded": r is not None}
    for values in itertools.product(*(grid[k] for k in keys)) if keys else [()]:
        params = dict(zip(keys, values, strict=True))
        fixed = SWEEP_ATTACKS[name]
        spec = RunAttack(str(run_dir), **victim, round=r, samples=samples, **fixed, **params)
        try:
            out = attack_run(spec)
        except ConfigError as err:  # e.g. labels on a run that is not U-shaped
            return {"ap": None, "note": str(err)}
        if name == "labels":
            ap = max(out["auc_norm"], out["auc_direction"])
        else:
            ap = min(1.0, max(0.0, out["ssim"]))
        if best is None or ap > best["ap"]:
            best = {"ap": ap, "params": params, "psnr": out.get("psnr"), "mse": out.get("mse")}
    return best


def _run_cell(sweep: Sweep, alg: str, cut, defence: str, run_dir: Path) -> list[dict]:
    """One run and its attack rows (one per attacked device, :func:`attacked_devices`, and
    attack)."""
    overrides = cell_overrides(sweep, alg, cut, defence)
    run(sweep.base, overrides, run_dir=run_dir, progress=False)
    summary = json.loads((run_dir / "summary.json").read_text())
    base = {
        "algorithm": alg, "cut_option": cut, "defence": defence,
        "mp": summary["final_acc"], "sim_time": summary["sim_time"],
        "traffic_bytes": summary["traffic_bytes"],
        "time_to_target": summary["to_target"]["sim_time"],
        "traffic_to_target": summary["to_target"]["traffic_bytes"],
    }  # fmt: skip
    rows = []
    for device in attacked_devices(sweep, as_config(sweep.base, overrides), run_dir):
        for name, grid in sweep.attacks.items():
            best = _best(run_dir, name, grid, device, sweep.samples)
            rows.append({**base, **device, "attack": name, **best})
    return rows


def attacked_devices(sweep: Sweep, config, run_dir: Path) -> list[dict]:
    """Each device a cell attacks (``round``, ``device``, ``cut``, :func:`device_columns`):
    ``target: final``, every client of the run's last round (``round`` None: the final
    model); ``recorded``, per :func:`attacked_rounds` round the clients the run's record
    holds there, in the order of that round's metrics row."""
    metrics = read_metrics(run_dir / "metrics.jsonl")
    if sweep.target == "final":
        return _devices_of(metrics[-1], None, None)
    record = read_record(run_dir)
    out = []
    for r in attacked_rounds(sweep, config):
        row = next((m for m in metrics if m["round"] == r), {"clients": [], "cuts": []})
        out += _devices_of(row, r, {b.client for b in record if b.round == r})
    return out


def _devices_of(row: dict, round_: int | None, kept: set[int] | None) -> list[dict]:
    """The devices of a metrics ``row`` (those in ``kept`` unless None), tagged ``round_``."""
    pairs = enumerate(zip(row["clients"], row["cuts"], strict=True))
    return [
        {"round": round_, "device": client, "cut": cut, **device_columns(row, i)}
        for i, (client, cut) in pairs
        if kept is None or client in kept
    ]


def cell_line(n: int, total: int, rows: list[dict], elapsed_s: float) -> str:
    """The progress line of the ``n``-th of ``total`` cells, its ``rows`` done after
    ``elapsed_s``: the cell, its accuracy and the best attack on its most-leaking device."""
    first = rows[0] if rows else {}
    scored = [r for r in rows if r.get("ap") is not None]
    worst = max(scored, key=lambda r: r["ap"]) if scored else None
    leak = f"{worst['attack']} {worst['ap']:.3f} on device {worst['device']}" if worst else "-"
    if worst and worst.get("round") is not None:
        leak += f" (recorded round {worst['round']})"
    acc = first.get("mp")
    return (
        f"cell {n}/{total} {first.get('algorithm')} cut={first.get('cut_option')} "
        f"{first.get('defence')}: acc {acc if acc is None else f'{acc:.3f}'}, most leaked {leak} "
        f"({elapsed_s / 60:.1f} min)"
    )


def device_columns(last: dict, i: int) -> dict:
    """What sets device ``i`` of the last round's metrics row apart besides its cut: its
    ``group`` (S²FL's group, ParallelSFL's cluster) and its ``batch_size`` (MergeSFL's
    heterogeneous batches, ``plan_batch_sizes``; None where the algorithm has one batch
    size). Both lists are in the plan's task order, as ``clients`` is."""
    sizes = last.get("plan_batch_sizes")
    return {
        "group": last["groups"][i] if "groups" in last else None,
        "batch_size": sizes[i] if sizes is not None else None,
    }


def _score(rows: list[dict], sweep: Sweep) -> None:
    """Add DCS to each row (MP* = the reference defence's MP, same algorithm and cut option)."""
    reference = sweep.reference
    ideal = {(r["algorithm"], r["cut_option"]): r["mp"] for r in rows if r["defence"] == reference}
    for r in rows:
        mp_ideal = ideal[(r["algorithm"], r["cut_option"])]
        ok = r["ap"] is not None and r["mp"] is not None and mp_ideal is not None
        r["dcs"] = dcs(r["ap"], r["mp"], mp_ideal, sweep.beta) if ok else None


def t_dcs(rows: list[dict]) -> dict[str, float]:
    """T-DCS (VFLAIR): DCS averaged over the attacks of each type, per algorithm/cut/defence
    (over devices too); keys ``algorithm|cut|defence|type``."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r["dcs"] is not None:
            key = f"{r['algorithm']}|{r['cut_option']}|{r['defence']}|{ATTACK_TYPES[r['attack']]}"
            groups.setdefault(key, []).append(r["dcs"])
    return {k: sum(v) / len(v) for k, v in groups.items()}


def evaluate_sweep(
    sweep: Sweep | Mapping[str, Any] | str | Path,
    out: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
):
    """Run ``sweep`` (the Python twin of ``splitfl privacy eval``); writes ``table.json``,
    ``table.md`` and ``privacy_utility.png`` to ``out`` (default: the sweep's ``out``) and
    returns ``{"rows": ..., "t_dcs": ...}``. Validation happens before anything is written.
    ``progress`` gets one line per finished cell (:func:`cell_line`; the CLI prints them)."""
    sweep = sweep if isinstance(sweep, Sweep) else load_sweep(sweep)
    out_dir = Path(out or sweep.out)
    if out_dir.exists() and any(out_dir.iterdir()):
        raise ConfigError("out", f"{out_dir} is not empty (a sweep writes a new folder)")
    rows: list[dict] = []
    todo, began = list(cells(sweep)), time.monotonic()
    for n, (alg, cut, defence) in enumerate(todo, 1):
        cell = _run_cell(sweep, alg, cut, defence, out_dir / "runs" / f"{alg}-cut{cut}-{defence}")
        rows += cell
        if progress is not None:
            progress(cell_line(n, len(todo), cell, time.monotonic() - began))
    _score(rows, sweep)
    result = {"rows": rows, "t_dcs": t_dcs(rows), "beta": sweep.beta}
    write_report(result, out_dir)
    return result

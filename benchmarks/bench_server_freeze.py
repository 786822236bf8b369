"""A real server freeze (issue 51, item 3a): the ``splitfl server`` *process* is stopped with
``SIGSTOP`` for each of ``--freezes`` seconds (5, 20 and the issue's 40 s) while a round is in
flight, then continued with ``SIGCONT``; are honest devices dropped or benched for the
server's lateness?

``tests/net/test_server_stalls.py`` and ``bench_attacks.py --false-positive-rate`` freeze the
server's round loop with an in-process sleep; here the whole process stops — its gRPC
threads, its heartbeat (``net/server/stalls.py``) and its keepalives with it — while the
device threads of this process keep their own clocks and keepalives. Each freeze is next to
the same run unfrozen (its control). A client-round dropped for any reason but an absent
device is a false positive (goal 0); a device thread that ends before the server's bye is a
device lost.

Each run's ``per_round`` says what happened to the round in flight (its clients, those
dropped with their reasons, its test accuracy and training loss), ``benched`` how many
client-rounds were benched, ``device_lines`` the last lines each device said.
``--keepalive-s`` sets ``network.keepalive_s`` and the devices' own keepalive: a freeze past 3 ×
it is a silent server to the devices (they redial), so 2 s makes that case take seconds.

Run: ``python benchmarks/bench_server_freeze.py`` (about 7 minutes on 2 cores), results in
``benchmarks/results/server-freeze-<date>.json``;
``--keepalive-s 2 --freezes 4,8,20`` for the stops past 3 × keepalive in about 4 minutes.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml
from bench_attacks import ABSENT  # one definition of 'not a verdict on an update'

import splitfl
from splitfl.metrics.records import read_metrics, read_record
from splitfl.net.server.testbed import Testbed
from splitfl.testing import config_for


def _rounds_recorded(run_dir: Path) -> int:
    """Complete lines of the run's ``metrics.jsonl`` while the server writes it (a line being
    written is not counted)."""
    path = run_dir / "metrics.jsonl"
    return path.read_bytes().count(b"\n") if path.exists() else 0


def _server(cfg: Path, run_dir: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "splitfl", "server", str(cfg), "--out", str(run_dir)]
    return subprocess.Popen(
        [*cmd, "--no-progress"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def one_run(folder: Path, args: argparse.Namespace, freeze: bool) -> dict[str, Any]:
    """One networked run, the server in its own process, devices in threads here; when
    ``freeze``, SIGSTOP the server for ``args.freeze_s`` from ``args.offset_s`` after round
    ``--freeze-after`` is recorded."""
    names = [f"d{i}" for i in range(args.devices)]
    bed = Testbed.create(folder / "bed", names)
    net = bed.server_overrides(min_devices=args.devices, timeout_s=args.timeout_s)
    sized = {"data.num_clients": args.devices, "train.clients_per_round": args.devices}
    changes = {**sized, **net, "train.local_steps": args.local_steps, "data.alpha": 0.5}
    changes["network.keepalive_s"] = args.keepalive_s
    cfg = folder / "config.yaml"
    cfg.write_text(yaml.safe_dump(config_for("splitfed_v1", rounds=args.rounds, **changes)))
    run_dir = folder / "run"
    server = _server(cfg, run_dir)
    ka = args.keepalive_s  # the devices' own keepalive (before a welcome tells the server's)
    threads = [bed.device(n, [i], retry_s=120.0, keepalive_s=ka) for i, n in enumerate(names)]
    frozen_at = None
    t0 = time.monotonic()
    try:
        if freeze:
            while _rounds_recorded(run_dir) < args.freeze_after and server.poll() is None:
                time.sleep(0.01)
            time.sleep(args.offset_s)
            os.kill(server.pid, signal.SIGSTOP)
            frozen_at = time.monotonic() - t0
            time.sleep(args.freeze_s)
            os.kill(server.pid, signal.SIGCONT)
        out, _ = server.communicate(timeout=300)
    finally:
        if server.poll() is None:
            os.kill(server.pid, signal.SIGCONT)
            server.kill()
            server.wait(10)
        for t in threads:
            t.join(30)
    rows = read_metrics(run_dir / "metrics.jsonl")
    summary_path = run_dir / "summary.json"
    status = (read_record(summary_path) or {}).get("status")
    reasons = [why for r in rows for why in (r.get("dropped_reasons") or {}).values()]
    checked = [why for why in reasons if not why.startswith(ABSENT)]
    events = [e for r in rows for e in r.get("executor_events", []) if "late" in str(e)]
    return {
        "frozen": freeze,
        "frozen_at_s": frozen_at,
        "server_exit": server.returncode,
        "status": status,
        "rounds_recorded": len(rows),
        "client_rounds": sum(args.devices for _ in rows),
        "dropped": len(checked),
        "absent": len(reasons) - len(checked),
        "reasons": sorted({why[:120] for why in checked}),
        "late_events": [str(e)[:160] for e in events],
        "device_exit_codes": [t.code for t in threads],
        "device_tail": [t.lines[-3:] for t in threads if t.code],
        "final_acc": rows[-1].get("test_acc") if rows else None,
        # per round: its clients, those dropped (reason, shortened) and its test accuracy
        "per_round": [
            {
                "round": r.get("round"),
                "clients": r.get("clients"),
                "dropped": {c: why[:60] for c, why in (r.get("dropped_reasons") or {}).items()},
                "test_acc": r.get("test_acc"),
                "train_loss": r.get("train_loss"),
            }
            for r in rows
        ],
        "benched": sum(why.startswith("benched") for why in reasons),
        "device_lines": [[ln for ln in t.lines if "connected" not in ln][-6:] for t in threads],
        "wall_s": round(time.monotonic() - t0, 2),
        "server_tail": out.decode(errors="replace")[-600:] if server.returncode else "",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--local-steps", type=int, default=20)
    parser.add_argument("--timeout-s", type=float, default=2.0)
    parser.add_argument(
        "--keepalive-s", type=float, default=10.0, help="network.keepalive_s and the devices'"
    )
    parser.add_argument("--freezes", default="5,20,40", help="seconds stopped, each a run")
    parser.add_argument("--freeze-after", type=int, default=2, help="rounds recorded first")
    parser.add_argument("--offsets", default="0.05,0.4", help="seconds after that row, each a run")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        runs.append(one_run(Path(tmp) / "control", args, freeze=False))
        print(f"control: {runs[-1]['dropped']} dropped, {runs[-1]['status']}", flush=True)
        cells = [
            (float(f), float(o)) for f in args.freezes.split(",") for o in args.offsets.split(",")
        ]
        for k, (freeze, offset) in enumerate(cells):
            args.freeze_s, args.offset_s = freeze, offset
            run = one_run(Path(tmp) / f"f{k}", args, freeze=True)
            runs.append({"freeze_s": freeze, "offset_s": offset, **run})
            print(
                f"freeze {freeze:g}s at +{offset:g}s after round {args.freeze_after}: "
                f"{run['dropped']} dropped, {run['absent']} absent, {run['reasons']}, "
                f"devices {run['device_exit_codes']}, {run['status']}",
                flush=True,
            )
    report = {
        "date": str(datetime.date.today()),
        "splitfl": splitfl.__version__,
        "settings": {
            k: v for k, v in vars(args).items() if k not in ("out", "offset_s", "freeze_s")
        },
        "false_positives": sum(r["dropped"] for r in runs),
        "runs": runs,
    }
    out = args.out or Path(__file__).parent / "results" / f"server-freeze-{report['date']}.json"
    out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
    print(f"{report['false_positives']} honest client-rounds dropped; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

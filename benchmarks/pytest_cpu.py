"""A pytest plugin that writes each test's CPU seconds (issue 46: where the suite's time goes).

Wall time (``--durations``) overstates tests that sleep or wait on a network timeout: on a
2-core machine running ``-n 2`` they leave their core to the other worker. CPU time is what a
busy machine has to find. Per test (setup + call + teardown) this records the worker
process's own CPU (``RUSAGE_SELF``: its threads, device threads and gRPC included) and that
of the subprocesses it waited for (``RUSAGE_CHILDREN``: ``splitfl launch``, device
processes, parallel workers). Ray's daemons are reaped when the session's Ray instance shuts
down, so their CPU lands on the session's last test, not on each Ray test.

    PYTHONPATH=benchmarks python -m pytest -q -n 2 -p pytest_cpu            # writes test-cpu.jsonl
    python benchmarks/pytest_cpu.py test-cpu.jsonl                          # the table, by file
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

OUT = Path(os.environ.get("SPLITFL_TEST_CPU", "test-cpu.jsonl"))


def _cpu() -> tuple[float, float]:
    own, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    (own0, kids0), wall0 = _cpu(), time.monotonic()
    yield
    (own1, kids1), wall1 = _cpu(), time.monotonic()
    row = {
        "test": item.nodeid,
        "cpu_s": round(own1 - own0, 3),
        "children_cpu_s": round(kids1 - kids0, 3),
        "wall_s": round(wall1 - wall0, 3),
    }
    with OUT.open("a") as f:  # one short line per write: workers' appends do not interleave
        f.write(json.dumps(row) + "\n")


def _table(path: Path, top: int = 25) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_file: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in rows:
        f = by_file[r["test"].split("::")[0]]
        f[0] += r["cpu_s"] + r["children_cpu_s"]
        f[1] += r["wall_s"]
        f[2] += 1
    total = sum(v[0] for v in by_file.values())
    print(f"{len(rows)} tests, {total:.0f} CPU s, {sum(v[1] for v in by_file.values()):.0f} wall s")
    print(f"{'CPU s':>7} {'wall s':>7} {'tests':>5}  file")
    for name, (cpu, wall, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"{cpu:7.1f} {wall:7.1f} {n:5d}  {name}")
    print(f"\n{'CPU s':>7} {'wall s':>7}  test")
    for r in sorted(rows, key=lambda r: -(r["cpu_s"] + r["children_cpu_s"]))[:top]:
        print(f"{r['cpu_s'] + r['children_cpu_s']:7.1f} {r['wall_s']:7.1f}  {r['test']}")


if __name__ == "__main__":
    _table(Path(sys.argv[1]))

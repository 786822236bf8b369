"""A run's end-of-run plots drawn by a background process, so the result never waits for them.

Importing matplotlib and drawing ``accuracy.png`` and ``loss.png`` took 0.73 s of a 3.1 s
job (issue 54: whole process 1.29× a lean loop on ``benchmarks/bench_peers.py``). A
:class:`Plotter` is started when a run's recorder is made: a Python process of its own that
imports matplotlib while the rounds run, then waits for one line on its standard input.
When the run ends (``summary.json`` written) the recorder sends ``draw``; the process reads
the run's ``metrics.jsonl`` and draws the same PNGs the run used to draw itself
(:func:`splitfl.metrics.plots.plot_run`, atomic writes). Anything else on its input (the
run's process gone without a summary) ends it without drawing.

The process runs in a session of its own: it finishes even after the run's process has
exited and is not stopped by a Ctrl-C meant for the run. :func:`wait_plots` (and
:meth:`splitfl.RunResult.wait_plots`) waits for pending plots; the command line calls it
before it exits (``splitfl run --no-wait-plots`` does not). A plot that could not be drawn
is one ``warning:`` line on stderr when waited for; the run's result stands.

    python -m splitfl.metrics.background RUN_DIR SPEC_JSON    # what a Plotter starts
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from splitfl.metrics import plots

#: the one line that tells a plotter to draw
DRAW = "draw"
#: plotters started and not yet waited for (finished ones are reaped as new ones start)
_PENDING: list[Plotter] = []


class Plotter:
    """The background process that draws one run's plots (see the module docstring)."""

    def __init__(self, run_dir: Path, spec: dict[str, Any]):
        self.run_dir = Path(run_dir)
        self.sent = False
        self.error: str | None = None  # the worker's one line, once waited for and failed
        self.stderr = ""  # what the worker wrote on stderr, once waited for
        package_root = str(Path(__file__).resolve().parents[2])  # the splitfl that runs
        env = {**os.environ, "MPLBACKEND": "Agg"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
        args = [sys.executable, "-m", __name__, str(self.run_dir), json.dumps(spec)]
        self.proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            text=True,
            start_new_session=True,
        )

    def draw(self) -> None:
        """Tell the process to draw (``metrics.jsonl`` and ``summary.json`` are written)."""
        if self.sent:
            return
        self.sent = True
        try:
            self.proc.stdin.write(DRAW + "\n")  # type: ignore[union-attr]
            self.proc.stdin.close()  # type: ignore[union-attr]
        except (BrokenPipeError, OSError):  # the worker has already ended: wait() says why
            pass

    def cancel(self) -> None:
        """End the process without drawing (the run wrote no summary)."""
        if not self.sent:
            self.sent = True
            try:
                self.proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the plots; False (and one warning line on stderr) if they were not
        drawn. A plotter never told to draw is cancelled first."""
        self.cancel()
        self.proc.wait(timeout)  # its one line of stderr, if any, fits in the pipe
        if self.proc.stderr is not None and not self.proc.stderr.closed:
            with self.proc.stderr:
                self.stderr = self.proc.stderr.read()
        if self.proc.returncode != 0 and self.error is None:
            why = self.stderr.strip().splitlines()
            self.error = why[-1] if why else f"plot process exited with {self.proc.returncode}"
            print(f"warning: {self.run_dir}: plots not drawn: {self.error}", file=sys.stderr)
        return self.proc.returncode == 0

    def done(self) -> bool:
        return self.proc.poll() is not None


def start_plotter(run_dir: Path, spec: dict[str, Any]) -> Plotter:
    """Start (and register) the plotter of ``run_dir``; ``spec`` as :func:`plot_run` takes
    it (``name``, ``metric``, ``key``). Finished plotters of earlier runs are reaped."""
    for old in [p for p in _PENDING if p.sent and p.done()]:
        _PENDING.remove(old)
        old.wait()
    plotter = Plotter(run_dir, spec)
    _PENDING.append(plotter)
    return plotter


def wait_plots(run_dir: Path | None = None, timeout: float | None = None) -> bool:
    """Wait until the pending end-of-run plots (of ``run_dir`` only, if given) are written;
    True if every one was drawn (a failure is one ``warning:`` line on stderr)."""
    ok = True
    for plotter in list(_PENDING):
        if run_dir is None or plotter.run_dir == Path(run_dir):
            ok = plotter.wait(timeout) and ok
            _PENDING.remove(plotter)
    return ok


def _main(argv: list[str]) -> int:
    """The worker: import matplotlib, wait for :data:`DRAW`, draw (one line on failure)."""
    run_dir, spec = Path(argv[0]), json.loads(argv[1])
    try:
        plots.pyplot()  # the import, while the run's rounds go on
        if sys.stdin.readline().strip() != DRAW:
            return 0  # the run ended without a summary: nothing to draw
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines if line.strip()]
        plots.plot_run(rows, run_dir, **spec)
    except Exception as err:  # noqa: BLE001 - reported as one line to the run's process
        print(f"{type(err).__name__}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))

"""Sweeps: grids of experiments (algorithms × seeds × α × ...) run as trials on Ray or locally.

``splitfl sweep SWEEP.yaml`` / :func:`sweep`; see :mod:`splitfl.sweeps.spec` for the sweep file
format and :mod:`splitfl.sweeps.execute` for the sweep directory and resume rules.
"""

from splitfl.sweeps.execute import SweepResult, run_trial, sweep
from splitfl.sweeps.spec import SweepSpec, Trial, expand, load_sweep

__all__ = ["SweepResult", "SweepSpec", "Trial", "expand", "load_sweep", "run_trial", "sweep"]

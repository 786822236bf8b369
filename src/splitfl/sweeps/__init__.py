"""Sweeps: grids of experiments (algorithms × seeds × α × ...) run as trials on Ray or locally.

``splitfl sweep SWEEP.yaml`` / :func:`sweep`; see :mod:`splitfl.sweeps.spec` for the sweep file
format, :mod:`splitfl.sweeps.execute` for running and resuming a sweep,
:mod:`splitfl.sweeps.directory` for the sweep directory, :mod:`splitfl.sweeps.backends` for the
trial backends (``ray``, ``local``) and :mod:`splitfl.sweeps.trial` for one trial.
"""

from splitfl.sweeps.execute import SweepResult, sweep
from splitfl.sweeps.spec import SweepSpec, Trial, expand, load_sweep
from splitfl.sweeps.trial import run_trial

__all__ = ["SweepResult", "SweepSpec", "Trial", "expand", "load_sweep", "run_trial", "sweep"]

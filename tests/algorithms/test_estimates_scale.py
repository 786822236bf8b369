"""A client's measured estimate is read without filling every client's (issue 54 item 2):
PyramidFL's per-client timing estimate was ``fill_unmeasured(table)[client]``, a pass over all
N clients for each of a round's explored clients."""

from __future__ import annotations

import numpy as np
import pytest

from splitfl.algorithms import estimates, pyramidfl
from splitfl.experiment.runner import as_config, prepare
from splitfl.testing import config_for


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_estimate_of_equals_the_filled_table(seed):
    rng = np.random.default_rng(seed)
    table = [float(v) if rng.random() < 0.6 else None for v in rng.random(40)]
    for default in (1.0, 0.0):
        filled = estimates.fill_unmeasured(table, default)
        assert [estimates.estimate_of(table, i, default) for i in range(40)] == filled.tolist()
    assert estimates.estimate_of([None, None], 1, default=0.5) == 0.5  # nothing measured yet


def test_pyramidfl_reads_a_measured_clients_times_without_a_table_pass(monkeypatch):
    algo = prepare(as_config(config_for("pyramidfl"))).algorithm
    algo.time_per_step[3], algo.transfer_time[3] = 0.25, 0.5
    algo.time_per_step[5] = 2.0

    def no_pass(*args, **kwargs):
        raise AssertionError("filled the whole table for one measured client")

    for module, name in ((estimates, "fill_value"), (pyramidfl, "fill_unmeasured")):
        monkeypatch.setattr(module, name, no_pass, raising=False)  # either one: a pass
    assert algo.step_and_transfer(3) == (0.25, 0.5)
    monkeypatch.undo()
    assert algo.step_and_transfer(4) == (1.125, 0.5)  # the medians of the measured ones

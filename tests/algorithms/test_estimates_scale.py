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

    pairs = ((estimates, "fill_value"), (pyramidfl, "fill_value"), (pyramidfl, "fill_unmeasured"))
    for module, name in pairs:
        monkeypatch.setattr(module, name, no_pass, raising=False)  # either one: a pass
    assert algo.step_and_transfer(3) == (0.25, 0.5)
    monkeypatch.undo()
    assert algo.step_and_transfer(4) == (1.125, 0.5)  # the medians of the measured ones


def test_pyramidfl_fills_its_never_measured_clients_once_a_round(monkeypatch):
    """The medians a never-measured client is estimated at are computed once after each
    change of the tables, not once per client (a pass over all N clients for each of a
    round's unmeasured participants and explored clients made a round O(N x K)); the
    estimates are the same."""
    algo = prepare(as_config(config_for("pyramidfl"))).algorithm
    algo.time_per_step[3], algo.transfer_time[3] = 0.25, 0.5
    algo.time_per_step[5], algo.transfer_time[5] = 2.0, 1.0
    passes = []
    fill = estimates.fill_value

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        passes.append(1)
        return fill(*args, **kwargs)

    monkeypatch.setattr(pyramidfl, "fill_value", counted, raising=False)
    monkeypatch.setattr(estimates, "fill_value", counted)  # the old code's path
    unmeasured = [c for c in range(algo.ctx.num_clients) if c not in (3, 5)]
    assert {algo.step_and_transfer(c) for c in unmeasured} == {(1.125, 0.75)}
    assert len(passes) == 2  # one per table, for all the unmeasured clients
    algo.load_state_dict(algo.state_dict())  # the tables may have changed: computed anew
    assert algo.step_and_transfer(0) == (1.125, 0.75) and len(passes) == 4

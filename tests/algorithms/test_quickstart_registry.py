"""Issue 52 item 9: every registered algorithm runs on the project's own quickstart config
with its defaults — one round of ``configs/quickstart.yaml`` each (its 50 clients, its model,
its batch size), adapted where it must be and then saying so in a ``note:`` line."""

from __future__ import annotations

from pathlib import Path

import pytest

import splitfl
from splitfl.algorithms import algorithm_names

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml"
#: Algorithms whose defaults do not fit the quickstart as it is, and what their note says.
ADAPTED = {
    "cse_fsl": "options.cse_fsl.upload_every: 5 → 1, the fewest batches a client has",
    "ringsfl": "ringsfl: 50 clients but 5 model blocks (one per ring member)",
    "ringsfl-v2": "ringsfl: 50 clients but 5 model blocks (one per ring member)",
}


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_every_algorithm_runs_the_quickstart_with_its_defaults(algorithm, tmp_path):
    """``validate`` (every check, on the quickstart's data and model), then one round: trained
    where the defaults had to be adapted, else on ``executor: timing`` (the algorithm's own
    selection, plan, clock and aggregation of the round, without the training: the tests of
    each algorithm train it) to keep this registry-wide test within seconds."""
    overrides = [f"algorithm={algorithm}", "rounds=1", "output.plots=false"]
    said = splitfl.validate(str(QUICKSTART), overrides)
    notes = [line for line in said.splitlines() if line.startswith("note: ")]
    if algorithm in ADAPTED:
        assert any(ADAPTED[algorithm] in line for line in notes), notes
    else:
        overrides.append("executor=timing")
    result = splitfl.run(str(QUICKSTART), overrides, run_dir=tmp_path / "run", progress=False)
    assert result.summary["status"] == "ok" and len(result.metrics) == 1
    if algorithm in ADAPTED:
        assert result.metrics[0]["train_loss"] > 0

"""The recorder's per-round snapshot of an algorithm's state and the checkpoint's encoding:
the same values as ``copy.deepcopy`` (and as before, through a checkpoint), with no Python
step per idle client's entry of a per-client table (issue 54 item 2: a deepcopy of the whole
state every round was ~0.5 s a round at 10⁵ clients)."""

from __future__ import annotations

import copy

import numpy as np
import torch

from splitfl.experiment import checkpoint as ckpt
from splitfl.experiment import recorder
from splitfl.experiment.recorder import snapshot


def state(n: int) -> dict:
    return {
        "stat": [None if i % 3 else float(i) for i in range(n)],
        "last_round": list(range(n)),
        "flags": [i % 2 == 0 for i in range(n)],
        "nested": {"pairs": [(1, 2.0), [3, None]], "arr": np.arange(4.0), "t": torch.ones(2)},
        "dists": [np.full(3, float(i)) for i in range(4)],
        "name": "x",
    }


def test_a_snapshot_equals_a_deepcopy_and_is_independent():
    original = state(50)
    snap, deep = snapshot(original), copy.deepcopy(original)
    assert repr(snap) == repr(deep)
    assert type(snap["nested"]["pairs"][0]) is tuple
    original["stat"][0] = -1.0
    original["nested"]["pairs"][1][0] = -3
    original["nested"]["arr"][0] = -1.0
    original["dists"][0][0] = -1.0
    original["nested"]["t"][0] = -1.0
    assert repr(snap) == repr(deep)  # nothing shared with the state it was taken of


def test_a_snapshot_takes_no_python_step_per_table_entry(monkeypatch):
    """No per-element deep copy for a table of plain values: 10,000 clients' tables cost no
    more of deepcopy's per-value steps than 10 clients' (counted on deepcopy's dispatch of
    ints, floats, bools and None; the old ``copy.deepcopy`` of the whole state took one per
    entry)."""
    steps = []
    dispatch = dict(copy._deepcopy_dispatch)
    for kind in (int, float, bool, type(None)):
        original = dispatch[kind]

        def counting(value, memo, _original=original):  # noqa: ANN001, ANN202
            steps.append(1)
            return _original(value, memo)

        monkeypatch.setitem(copy._deepcopy_dispatch, kind, counting)
    counts = []
    for n in (10, 10_000):
        steps.clear()
        recorder.snapshot(state(n))
        counts.append(len(steps))
    assert counts[0] == counts[1] < 20


def test_the_checkpoint_encoding_passes_plain_tables_through_and_round_trips():
    original = state(30)
    encoded = ckpt.encode_numpy(original)
    assert encoded["stat"] is original["stat"]  # nothing to encode in a plain table
    decoded = ckpt.decode_numpy(encoded)
    assert repr(decoded) == repr(original)
    assert isinstance(decoded["nested"]["arr"], np.ndarray)
    assert type(decoded["nested"]["pairs"][0]) is tuple

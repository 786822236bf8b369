"""Issue 53: no registered algorithm silently ignores a device defence. For every algorithm
and every ``train.defence`` switch, a one-round tiny run with the defence on either is
refused in one line naming the field, or trains a different model than the same run with
the defence off (the defence changed what the device sent or how it stepped: a run that
accepted it and trained the undefended model bit for bit ignored it)."""

from __future__ import annotations

import pytest
import torch

import splitfl
from splitfl.algorithms import ALGORITHMS
from splitfl.config import ConfigError
from splitfl.testing import config_for

#: One strength per switch; DP-SGD on the BatchNorm-free MLP (Opacus's per-sample gradients).
DEFENCES = {
    "noise_std": ({}, {"train.defence.noise_std": 0.5}),
    "nopeek": ({}, {"train.defence.nopeek": 1.0}),
    "dp_noise": ({"model": "mlp"}, {"train.defence.dp_noise": 1.0}),
    "label_noise": ({}, {"train.defence.label_noise": "max_norm"}),
}
_UNDEFENDED: dict[tuple[str, str], dict[str, torch.Tensor]] = {}


def _model(algorithm: str, base: dict, changes: dict, run_dir) -> dict[str, torch.Tensor]:
    cfg = config_for(algorithm, rounds=1, **base, **changes)
    run = splitfl.run(cfg, run_dir=run_dir, progress=False)
    return torch.load(run.run_dir / "model.pt", weights_only=True)


@pytest.mark.parametrize("defence", sorted(DEFENCES))
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_a_defence_is_applied_or_refused(algorithm, defence, tmp_path):
    base, on = DEFENCES[defence]
    try:
        defended = _model(algorithm, base, on, tmp_path / "on")
    except ConfigError as err:
        assert str(err).startswith(f"train.defence.{defence}") and "\n" not in str(err)
        return
    key = (algorithm, str(base))
    if key not in _UNDEFENDED:
        _UNDEFENDED[key] = _model(algorithm, base, {}, tmp_path / "off")
    plain = _UNDEFENDED[key]
    assert set(defended) == set(plain)
    changed = [k for k in plain if not torch.equal(plain[k], defended[k])]
    assert changed, f"{algorithm} accepted train.defence.{defence} and trained the plain model"

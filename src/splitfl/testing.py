"""Tiny configs for tests and correctness checks: seconds per run on the embedded digits.

Used by the test suite and by ``benchmarks/gpu_check.py`` (which must run where pytest is not
installed); handy for checking a new algorithm end to end.
"""

from __future__ import annotations

from typing import Any

from splitfl.config import set_dotted

#: Options that shorten the algorithms with long default local phases.
FAST_OPTIONS = {
    "options.mergesfl.tau": 2,
    "options.adasfl.tau": 2,
    "options.adasfl.tau_max": 4,
    "options.locfedmix_sl.tau": 2,
    "options.locfedmix_sl.aggregate_every": 2,
    "options.parallelsfl.tau": 2,
    "options.splitlora.aggregate_step": 12,
    # tiny clients have a few batches per round; the auxiliary model on a tiny cut is linear
    "options.cse_fsl.upload_every": 1,
    "options.fsl_sage.upload_every": 2,
    "options.fsl_sage.align_every": 2,
    "options.fsl_sage.align_epochs": 2,
    "options.fsl_sage.aux_model": "linear",
}
#: RingSFL needs at most as many clients as model blocks: 4 clients on the 4-block MLP.
RING_SIZED = {"model": "mlp", "data.num_clients": 4, "train.clients_per_round": 4}


def tiny_config(**changes: Any) -> dict[str, Any]:
    """A small digits config; ``changes`` are dotted keys (``"train.lr": 0.01``)."""
    base: dict[str, Any] = {
        "algorithm": "s2fl",
        "model": "cnn_digits",
        "rounds": 4,
        "seed": 3,
        "data": {
            "dataset": "digits",
            "partition": "dirichlet",
            "alpha": 0.5,
            "num_clients": 12,
            "min_samples": 8,
        },
        "train": {"clients_per_round": 6, "batch_size": 16, "lr": 0.05},
        # plots cost ~0.6 s a run, a third of a tiny run (tests that read them turn them on)
        "output": {"progress": False, "checkpoint_every": 2, "plots": False},
        # the networked≡simulation equality tests compare with the simulation's mean; the
        # untrusted default (median) is tested by tests/net/test_direction.py, which drops this
        "network": {"untrusted_aggregation": "mean"},
    }
    for key, value in changes.items():
        set_dotted(base, key.split("."), value)
    return base


def config_for(algorithm: str, **changes: Any) -> dict[str, Any]:
    """A tiny config that fits ``algorithm`` (fast options, ring-sized for RingSFL)."""
    extra = RING_SIZED if algorithm.startswith("ringsfl") else {}
    return tiny_config(algorithm=algorithm, **{**FAST_OPTIONS, **extra, **changes})


def flip_away(tensors: dict[str, Any], sent: dict[str, Any], factor: float = 9.9) -> None:
    """The model-flip attack of issue 51 (item 4), in place: each floating tensor ``t`` with a
    sent counterpart ``g`` becomes ``g − factor · ‖g‖ · unit(t − g)``, inside the norm bounds
    (``factor`` below ``peer_update_factor`` 10) but pointing away from the honest move.
    Used by the ring tests and ``benchmarks/bench_attacks.py``."""
    for name, t in tensors.items():
        g = sent.get(name)
        if g is not None and t.is_floating_point():
            step = t - g
            tensors[name] = g - factor * g.norm() * step / step.norm().clamp_min(1e-12)

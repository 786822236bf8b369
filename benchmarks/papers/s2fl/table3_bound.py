"""S²FL Table 3's per-round bound under Eq. (1) (issue 32 item 7): every selected device at its
fastest cut (the best S²FL's time table can do), against SFL at the last candidate cut (Wc3),
VGG-16 on CIFAR-10, 100 Table 1 devices, α = 0.5, over 2,000 random draws of 10 devices.
Time per round = the slowest selected device's Eq. (1) time; traffic = Σ (2|W_c| + 2pq).

    python benchmarks/papers/s2fl/table3_bound.py
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import numpy as np

from splitfl.experiment.runner import as_config, prepare

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from timing_setups import S2FL  # noqa: E402


def eq1_tables(ctx) -> tuple[np.ndarray, np.ndarray]:
    """Per device and candidate cut: Eq. (1)'s time and its bytes (2|W_c| + 2pq)."""
    prof, server, b = ctx.profile, ctx.population.server, ctx.config.train.batch_size
    times, traffic = [], []
    for c, dev in enumerate(ctx.population.devices):
        p = ctx.round_samples(c, b, ctx.local_steps(c, b))
        row_t, row_b = [], []
        for cut in ctx.cut_points:
            sent = 2 * prof.device_bytes(cut) + 2 * p * prof.activation_bytes(cut)
            compute = p * prof.device_flops(cut) / dev.flops
            row_t.append(sent / dev.uplink + compute + p * prof.server_flops(cut) / server.flops)
            row_b.append(sent)
        times.append(row_t)
        traffic.append(row_b)
    return np.array(times), np.array(traffic)


def main() -> int:
    cfg = copy.deepcopy(S2FL.base)
    cfg["algorithm"] = "s2fl"
    ctx = prepare(as_config(cfg)).ctx
    times, traffic = eq1_tables(ctx)
    best = times.argmin(1)
    rng = np.random.default_rng(0)
    sfl_t, s2_t, sfl_b, s2_b = [], [], [], []
    for _ in range(2000):
        sel = rng.choice(len(times), 10, replace=False)
        sfl_t.append(times[sel, -1].max())
        s2_t.append(times[sel, best[sel]].max())
        sfl_b.append(traffic[sel, -1].sum())
        s2_b.append(traffic[sel, best[sel]].sum())
    print(f"cuts {list(ctx.cut_points)}, devices per fastest cut {np.bincount(best).tolist()}")
    time_ratio = np.mean(sfl_t) / np.mean(s2_t)
    traffic_ratio = np.mean(sfl_b) / np.mean(s2_b)
    print(f"SFL / S²FL at the fastest cuts: time {time_ratio:.2f}x, traffic {traffic_ratio:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""S²FL Table 3 per round under Eq. (1) (issue 32 item 7, issue 50 item 9): SFL at the last
candidate cut (Wc3) against every selected device at (a) its fastest cut — the best S²FL's
time table can do for *time* — and (b) its least-traffic cut, the bound on S²FL's *traffic*
ratio (S²FL picks cuts by time, so (a)'s traffic ratio is not a bound). VGG-16 on CIFAR-10,
100 Table 1 devices, over 2,000 random draws of 10 devices per α. Time per round = the
slowest selected device's Eq. (1) time; traffic = Σ (2|W_c| + 2pq).

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


def ratios(ctx, draws: int = 2000) -> dict[str, float]:
    """Mean SFL ÷ S²FL over ``draws`` random 10-device rounds: time and traffic at each
    device's fastest cut, and traffic at its least-traffic cut (the traffic bound)."""
    times, traffic = eq1_tables(ctx)
    fastest, lightest = times.argmin(1), traffic.argmin(1)
    rng = np.random.default_rng(0)
    sums = np.zeros(5)
    for _ in range(draws):
        sel = rng.choice(len(times), 10, replace=False)
        sums += [
            times[sel, -1].max(),
            times[sel, fastest[sel]].max(),
            traffic[sel, -1].sum(),
            traffic[sel, fastest[sel]].sum(),
            traffic[sel, lightest[sel]].sum(),
        ]
    sfl_t, s2_t, sfl_b, fast_b, light_b = sums
    return {
        "time": sfl_t / s2_t,
        "traffic_fastest": sfl_b / fast_b,
        "traffic_bound": sfl_b / light_b,
    }


def main() -> int:
    for label, changes in {"a=0.1": 0.1, "a=0.5": 0.5, "a=1.0": 1.0, "IID": None}.items():
        cfg = copy.deepcopy(S2FL.base)
        cfg["algorithm"] = "s2fl"
        if changes is None:
            cfg["data"]["partition"] = "iid"
        else:
            cfg["data"]["alpha"] = changes
        r = ratios(prepare(as_config(cfg)).ctx)
        print(
            f"{label}: SFL / S²FL time at the fastest cuts {r['time']:.2f}x; traffic there "
            f"{r['traffic_fastest']:.2f}x; bound (least-traffic cuts) {r['traffic_bound']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

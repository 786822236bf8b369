"""Allowed intervals of the config's float fields (:data:`FLOAT_RANGES`, checked by
:func:`splitfl.config.checks.check_fields`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Range:
    """Allowed interval of a float field; ``lo_open``/``hi_open`` exclude that end point."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False

    def __str__(self) -> str:
        left, right = "(" if self.lo_open else "[", ")" if self.hi_open else "]"
        return f"{left}{self.lo:g}, {self.hi:g}{right}"

    def violation(self, value: float) -> str | None:
        """``must be > lo`` (or ``>=``, ``<``, ``<=``) where ``value`` is outside, else None."""
        if value < self.lo or (self.lo_open and value == self.lo):
            return f"must be {'>' if self.lo_open else '>='} {self.lo:g}"
        if value > self.hi or (self.hi_open and value == self.hi):
            return f"must be {'<' if self.hi_open else '<='} {self.hi:g}"
        return None


#: Allowed range of every float field (null, where allowed, is not checked). Upper ends the
#: papers never approach guard against typos and overflow: alpha 1e6 is IID already (and
#: p = 1/alpha up to 1e6), a log-normal jitter sigma of 10 already spans factors of e^±30,
#: weight decay (an L2 coefficient, 5e-4 where the papers use it) above 1 is beyond any use;
#: learning rates up to 1e9 stay allowed (a huge one is how divergence, exit 3, is tested).
#: A device-to-device link slower than 1 B/s is no link (1e-300 B/s made rounds last 1e306 s
#: and the clock overflow to inf).
FLOAT_RANGES: dict[str, Range] = {
    "data.alpha": Range(0, 1e6, lo_open=True),
    "data.p": Range(0, 1e6),
    "devices.jitter": Range(0, 10),
    "devices.variation": Range(0, 10),
    "devices.d2d_rate": Range(1, 1e15),
    "devices.exchange_latency_s": Range(0, 10),
    "devices.server_rate": Range(0, 1e15, lo_open=True),
    "devices.bandwidth_correlation": Range(0, 1),
    "devices.flops_scale": Range(0, 1e6, lo_open=True),
    "train.lr": Range(0, 1e9, lo_open=True),
    "train.lr_decay": Range(0, 1, lo_open=True),
    "train.lr_min": Range(0, 1e9),
    "train.momentum": Range(0, 1, hi_open=True),
    "train.weight_decay": Range(0, 1),
    "train.beta1": Range(0, 1, hi_open=True),
    "train.beta2": Range(0, 1, hi_open=True),
    "train.eps": Range(0, 1, lo_open=True),
    "train.explode_factor": Range(0, 1e30),
    "train.server_optimizer.lr": Range(0, 1e3, lo_open=True),
    "train.server_optimizer.momentum": Range(0, 1, hi_open=True),
    "train.server_optimizer.beta1": Range(0, 1, hi_open=True),
    "train.server_optimizer.beta2": Range(0, 1, hi_open=True),
    "train.server_optimizer.tau": Range(0, 1, lo_open=True),
    "train.defence.nopeek": Range(0, 1e6),
    "train.defence.noise_std": Range(0, 1e6),
    "train.defence.noise_clip": Range(0, 1e9, lo_open=True),
    "train.defence.dp_noise": Range(0, 1e6),
    "train.defence.dp_clip": Range(0, 1e9, lo_open=True),
    "train.defence.dp_delta": Range(0, 1, lo_open=True, hi_open=True),
    "train.defence.marvell_s": Range(0, 1e6, lo_open=True),
    "train.explode_recovery": Range(0, 1e30),
    "eval.target_accuracy": Range(0, 1, lo_open=True),
    "eval.collapse_share": Range(0, 1),
    "eval.collapse_from": Range(0, 1),
    "eval.chance_margin": Range(0, 1),
    "eval.client_holdout": Range(0, 1, lo_open=True, hi_open=True),
    "network.timeout_s": Range(0, 86400, lo_open=True),
    "network.connect_timeout_s": Range(0, 86400),  # 0: wait for the devices for ever
    "network.rejoin_s": Range(0, 86400),
    "network.round_deadline_factor": Range(0, 1e6),
    "network.cluster_deadline_factor": Range(0, 1e6),
    "network.round_deadline_min_s": Range(0, 86400),
    "network.max_message_mb": Range(0, 4096, lo_open=True),
    "network.rate_limit": Range(0, 1e9),
    "network.histogram_epsilon": Range(1e-6, 1e6),
    "network.bounds.update_norm_factor": Range(0, 1e6, lo_open=True),
    "network.bounds.update_norm_abs": Range(0, 1e6),
    "network.bounds.activation_factor": Range(1, 1e6),
    "network.bounds.activation_abs": Range(0, 1e6),
    "network.bounds.loss_max": Range(0, 1e30, lo_open=True),
    "network.bounds.peer_update_factor": Range(1, 1e6),
    "network.bounds.peer_update_floor": Range(0, 1),
    "network.bounds.peer_spread_factor": Range(1, 1e6),
    "network.bounds.activation_rms_factor": Range(1, 1e6),
    "network.bounds.activation_rms_abs": Range(0, 1e6),
    "network.bounds.peer_samples_factor": Range(1, 1e9),
    "network.bounds.min_cosine": Range(-1, 1),
    "network.bounds.small_round_min_cosine": Range(-1, 1),
    "network.bounds.peer_loss_factor": Range(1, 1e9),
    "train.clip_norm": Range(0, 1e30, lo_open=True),
    "train.comm_budget_mb": Range(0, 1e30, lo_open=True),
    "train.trim_fraction": Range(0, 0.5, hi_open=True),
    "network.keepalive_s": Range(0, 86400),
    "network.auth_timeout_s": Range(0, 3600, lo_open=True),
    "parallel.gpus_per_worker": Range(0, 64),
    "parallel.timeout_s": Range(0, 86400, lo_open=True),
}

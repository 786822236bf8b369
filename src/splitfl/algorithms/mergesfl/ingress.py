"""MergeSFL §IV-A: the PS's available ingress bandwidth B^h, estimated from what the PS
received in earlier rounds ("we analyze the statistical distribution of the ingress bandwidth
based on the behavior of the PS in the previous rounds").

The sample of round h is the PS's *achieved* ingress rate: the sum over the round's
participants of the rate at which the PS received each one's uploads (its bytes over the time
they took, as the round's report gives them: the shared-link rate the clock charged,
``ClientCost.extra["server_in_rate"]``, or the worker's own uplink where the link was not
shared, divided by the round's jitter factor, which stretched the measured time). The clock
takes a round's uploads to overlap (:func:`~splitfl.system.cost.share_server_link`), so this
is the PS's aggregate receive rate while they do: the link capacity in a round whose uploads
fill it, and their total demand (a lower bound on the capacity) in one whose uploads do not.
B^h is the moving average of these samples (:func:`~splitfl.algorithms.estimates.
moving_average`, weight ``ema`` on the history as Eq. 5-6). The PS never reads the preset's
link rate; before the first sample the caller uses its prior (:class:`MergeSFL`'s ``budget``).
"""

from __future__ import annotations

from splitfl.algorithms.estimates import moving_average
from splitfl.core.plan import RoundReport
from splitfl.system.cost import server_bytes


def achieved_ingress(report: RoundReport) -> float | None:
    """The PS's achieved ingress rate in a round (B/s): ``Σ_k rate_k / jitter_k`` over the
    participants that sent it bytes (``None`` if nobody did); see the module docstring."""
    rates = [
        cost.extra.get("server_in_rate", cost.server_link[0]) / report.jitter.get(c, 1.0)
        for c, cost in report.costs.items()
        if cost.server_link is not None and server_bytes(cost.traffic)[0] > 0
    ]
    return float(sum(rates)) if rates else None


def update_ingress(previous: float | None, report: RoundReport, alpha: float) -> float | None:
    """B^h after a round: ``α·B^{h-1} + (1−α)·achieved`` (the first sample taken as is); the
    previous estimate where the round sent the PS nothing."""
    sample = achieved_ingress(report)
    return previous if sample is None else moving_average(previous, sample, alpha)

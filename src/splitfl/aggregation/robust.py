"""Robust aggregation rules (``train.aggregation``), one implementation for every algorithm.

The papers average the clients' copies of a layer weighted by data size (S²FL Algorithm 1,
FedAvg) — ``mean``, the default, computed exactly as before. Where some clients may be hostile
(``splitfl server`` with devices one does not control), a rule can replace the average:

* ``clip_mean`` — norm clipping (Sun et al., "Can you really backdoor federated learning?",
  2019): each participant's update ``Δ_i = w_i − w`` (its whole model as the layer-wise rule
  assembles it, all floating-point layers) is scaled by ``min(1, C / ‖Δ_i‖)`` before the
  weighted average; ``C`` = ``train.clip_norm``, or (null, the default) the median of the
  round's update norms, which needs no tuning: at most half the participants are clipped and
  an honest round's updates are of one size.
* ``median`` — coordinate-wise weighted median (Yin et al., ICML 2018, with the algorithm's
  weights): per coordinate, the value where the cumulative weight of the sorted values
  reaches half the total — the mean of the two middle values when it lands exactly on half,
  so equal weights give the usual median.
* ``trimmed_mean`` — coordinate-wise trimmed mean (Yin et al.): per coordinate drop the
  ``⌊trim_fraction · n⌋`` smallest and largest values (at least one value is kept) and take
  the weighted mean of the rest with their weights.
* ``centered_clip`` — centred clipping (Karimireddy, He, Jaggi, "Learning from History for
  Byzantine Robust Optimization", ICML 2021, Eq. (CC)): one step
  ``v + Σ_i w_i (x_i − v) · min(1, τ / ‖x_i − v‖) / Σ_i w_i`` from a centre ``v``, the
  participants' whole models ``x_i``. The paper starts from the previous round's aggregate
  (server momentum); a rule without state starts from the coordinate-wise median (a robust
  starting point, as the paper allows) and takes ``τ`` = ``train.clip_norm`` or (null) the
  median of the ``‖x_i − v‖``: an honest participant's deviation counts whole, a liar's at
  most ``τ``.
* ``fltrust`` — FLTrust (Cao, Fang, Liu, Gong, "FLTrust: Byzantine-robust Federated Learning
  via Trust Bootstrapping", NDSS 2021, Algorithm 1, Eq. 3–5), ``network.untrusted_aggregation``
  only: the networked server trains the model it sent on its own held samples (its *root
  dataset*, ``network.bounds.reference_samples``), an update ``g_0``
  (``RoundResult.server_move``, :attr:`Rule.toward`); each participant's update
  ``g_i = x_i − w`` (over the parameters ``g_0`` covers) gets the trust score
  ``TS_i = ReLU(cos(g_i, g_0))`` (Eq. 3), is rescaled to ``g_0``'s length,
  ``ḡ_i = ‖g_0‖ / ‖g_i‖ · g_i`` (Eq. 4), and the model moves by
  ``Σ_i TS_i ḡ_i / Σ_i TS_i`` (Eq. 5; unweighted, as the paper). Tensors ``g_0`` does not
  cover (BatchNorm's running statistics and counter) are the trust-weighted mean
  ``Σ_i TS_i x_i / Σ_i TS_i`` (not rescaled: they are not gradient steps). Where every score
  is 0 (no participant points within 90° of the server's step) the model is kept as it was
  sent: the paper leaves ``Σ TS_i = 0`` undefined, and the server's own step is not applied
  instead because it was trained on test samples (the server's held slice of the test set),
  which would then leak into the model it evaluates. Averages over tensors ``g_0`` does not
  cover at all (an auxiliary head, a ParallelSFL top worker's cluster average: the device
  holds no root data) use ``centered_clip`` (:func:`robust_average`).

Integer tensors (BatchNorm's batch counter) follow the same rule and are rounded; clipping
applies to floating-point tensors only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from splitfl.aggregation.mean import weighted_average


@dataclass(frozen=True)
class Rule:
    """An aggregation rule and its parameters (``train.aggregation``, ``train.clip_norm``,
    ``train.trim_fraction``)."""

    name: str = "mean"
    clip_norm: float | None = None
    trim_fraction: float = 0.1
    #: Each participant counts once, whatever its weight (an untrusted fleet: Yin et al.'s
    #: median is over machines, and a device's sample count is its own claim).
    unweighted: bool = False
    #: ``fltrust``: the server's own step ``g_0`` of the round being aggregated, by tensor
    #: name (module docstring; set from ``RoundResult.server_move`` by the algorithm).
    toward: Mapping[str, torch.Tensor] | None = field(default=None, compare=False, repr=False)

    @classmethod
    def of(cls, train) -> Rule:
        """The rule of a ``train`` config section."""
        return cls(train.aggregation, train.clip_norm, train.trim_fraction)

    @classmethod
    def of_run(cls, config, toward: Mapping[str, torch.Tensor] | None = None) -> Rule:
        """The rule a run aggregates with: ``train.aggregation``, except that an untrusted
        fleet (``executor: networked``, ``network.trust: untrusted``) whose
        ``train.aggregation`` is the plain ``mean`` aggregates with
        ``network.untrusted_aggregation`` (default ``centered_clip``: centred clipping around
        the coordinate-wise median, each client counted once; a plain mean is moved without
        bound by one client, issue 51; the median cost honest non-IID fleets 23 points after
        20 rounds, ``network.untrusted_aggregation``'s docstring). A ``trusted`` fleet and
        the simulation keep ``train.aggregation``. ``toward``: the round's server step
        (:attr:`toward`, for ``fltrust``)."""
        train = config.train
        network = getattr(config, "network", None)
        if (
            train.aggregation == "mean"
            and getattr(config, "executor", None) == "networked"
            and network is not None
            and network.trust == "untrusted"
        ):
            rule = network.untrusted_aggregation
            return cls(rule, train.clip_norm, train.trim_fraction, rule != "mean", toward=toward)
        return cls.of(train)


MEAN = Rule()


def clip_scales(
    current: dict[str, torch.Tensor], models: list[dict[str, torch.Tensor]], rule: Rule
) -> list[float]:
    """``clip_mean``: each participant's factor ``min(1, C / ‖Δ_i‖)`` (module docstring);
    ``models[i]`` maps each layer to participant i's copy."""
    norms = [_distance(current, m) for m in models]
    bound = rule.clip_norm
    if bound is None:
        bound = _median(norms)
    return [1.0 if n <= bound or n == 0 else bound / n for n in norms]


def centred_clip(
    models: list[dict[str, torch.Tensor]], rule: Rule
) -> tuple[dict[str, torch.Tensor], list[float]]:
    """``centered_clip``: the centre ``v`` (each floating tensor's coordinate-wise median
    over ``models``, unweighted: where the liars are fewer than half it lies among the honest
    values) and each participant's factor ``min(1, τ / ‖x_i − v‖)`` (module docstring)."""
    centre = {
        key: torch.stack([m[key].double() for m in models]).median(dim=0).values
        for key, first in models[0].items()
        if first.is_floating_point()
    }
    norms = [
        math.sqrt(sum(float((m[k].double() - c).pow(2).sum()) for k, c in centre.items()))
        for m in models
    ]
    bound = rule.clip_norm if rule.clip_norm is not None else _median(norms)
    return centre, [1.0 if n <= bound or n == 0 else bound / n for n in norms]


def trust_factors(
    current: Mapping[str, torch.Tensor],
    models: list[dict[str, torch.Tensor]],
    toward: Mapping[str, torch.Tensor],
) -> tuple[list[float], list[float]]:
    """``fltrust``: each participant's trust score ``TS_i = ReLU(cos(g_i, g_0))`` (FLTrust
    Eq. 3) and its factor ``TS_i · ‖g_0‖ / ‖g_i‖`` (Eq. 4), with ``g_i = x_i − w`` over the
    floating tensors of ``toward`` (``g_0``) that ``models`` hold; a ``g_i`` or ``g_0`` of
    zero length has no direction and scores 0."""
    keys = [k for k in toward if k in models[0] and models[0][k].is_floating_point()]
    g0 = {k: toward[k].double().flatten() for k in keys}
    n0 = math.sqrt(sum(float(v @ v) for v in g0.values()))
    scores, factors = [], []
    for m in models:
        dot = sq = 0.0
        for k in keys:
            g = (m[k].double() - current[k].double()).flatten()
            dot += float(g @ g0[k])
            sq += float(g @ g)
        ni = math.sqrt(sq)
        score = max(dot / (ni * n0), 0.0) if ni > 0 and n0 > 0 else 0.0
        scores.append(score)
        factors.append(score * n0 / ni if score > 0 else 0.0)
    return scores, factors


def trust_layer(
    current: torch.Tensor,
    sources: list[torch.Tensor],
    scores: list[float],
    factors: list[float] | None,
) -> torch.Tensor:
    """One layer under ``fltrust`` (FLTrust Eq. 5): ``w + Σ_i f_i (x_i − w) / Σ_i TS_i``
    with ``factors`` ``f_i`` (:func:`trust_factors`), or, for a tensor ``g_0`` does not
    cover (``factors`` None), ``Σ_i TS_i x_i / Σ_i TS_i``; ``current`` itself where every
    score is 0 (module docstring). The result has ``current``'s dtype."""
    total = sum(scores)
    if total == 0:
        return current.clone()
    stack = torch.stack([s.to(torch.float64) for s in sources])
    shape = (-1,) + (1,) * current.dim()
    if factors is not None:
        base = current.to(torch.float64)
        f = torch.tensor(factors, dtype=torch.float64).view(shape)
        value = base + ((stack - base) * f).sum(0) / total
    else:
        value = (stack * torch.tensor(scores, dtype=torch.float64).view(shape)).sum(0) / total
    return (
        value.to(current.dtype) if current.is_floating_point() else value.round().to(current.dtype)
    )


def _median(values: list[float]) -> float:
    """The median (mean of the two middle values for an even count)."""
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        return 0.0
    return (ordered[(n - 1) // 2] + ordered[n // 2]) / 2


def _distance(current: dict[str, torch.Tensor], model: dict[str, torch.Tensor]) -> float:
    total = 0.0
    for key, base in current.items():
        copy = model[key]
        if base.is_floating_point() and copy is not base:
            total += float((copy.double() - base.double()).pow(2).sum())
    return math.sqrt(total)


def combine(
    current: torch.Tensor,
    sources: list[torch.Tensor],
    weights: list[float],
    rule: Rule,
    scales: list[float] | None = None,
    centre: torch.Tensor | None = None,
) -> torch.Tensor:
    """One layer from the participants' copies ``sources`` (weights ``weights``) under a
    robust ``rule`` (``scales``: :func:`clip_scales`, for ``clip_mean``, or with ``centre``
    the layer's part of :func:`centred_clip`); the result has ``current``'s dtype. ``mean``
    itself is computed by the callers' own loop."""
    stack = torch.stack([s.to(torch.float64) for s in sources])
    w = torch.tensor([1.0] * len(weights) if rule.unweighted else weights, dtype=torch.float64)
    shape = (-1,) + (1,) * current.dim()
    if rule.name == "centered_clip":
        if centre is None or scales is None:  # integer tensors (BatchNorm's counter)
            value = weighted_median(stack, w)
        else:
            moved = (stack - centre) * torch.tensor(scales, dtype=torch.float64).view(shape)
            value = centre + (moved * w.view(shape)).sum(0) / w.sum()
    elif rule.name == "clip_mean":
        if scales is not None and current.is_floating_point():
            base = current.to(torch.float64)
            stack = base + (stack - base) * torch.tensor(scales, dtype=torch.float64).view(shape)
        value = (stack * w.view(shape)).sum(0) / w.sum()
    elif rule.name == "median":
        value = weighted_median(stack, w)
    elif rule.name == "trimmed_mean":
        value = trimmed_mean(stack, w, rule.trim_fraction)
    else:
        raise ValueError(f"unknown aggregation rule {rule.name!r}")
    return (
        value.to(current.dtype) if current.is_floating_point() else value.round().to(current.dtype)
    )


def weighted_median(stack: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Coordinate-wise weighted median of ``stack`` (participants × …), weights ``w``."""
    values, order = stack.sort(dim=0)
    cum = w[order].cumsum(0)
    half = w.sum() / 2
    last = stack.shape[0] - 1
    lower = (cum < half).sum(0, keepdim=True).clamp(max=last)
    upper = (cum <= half).sum(0, keepdim=True).clamp(max=last)
    return (values.gather(0, lower) + values.gather(0, upper)).squeeze(0) / 2


def trimmed_mean(stack: torch.Tensor, w: torch.Tensor, fraction: float) -> torch.Tensor:
    """Coordinate-wise trimmed mean: the weighted mean of the values left after dropping
    ``⌊fraction · n⌋`` at each end (at least one value kept)."""
    n = stack.shape[0]
    k = min(math.floor(fraction * n), (n - 1) // 2)
    values, order = stack.sort(dim=0)
    kept, kept_w = values[k : n - k], w[order][k : n - k]
    total = kept_w.sum(0)
    mean = (kept * kept_w).sum(0) / total.clamp(min=1e-300)
    return torch.where(total > 0, mean, kept.mean(0))


def robust_average(
    states: list[dict[str, torch.Tensor]],
    weights: list[float],
    rule: Rule,
    reference: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """:func:`~splitfl.aggregation.mean.weighted_average` under ``rule`` (``reference``: the global
    copy the ``clip_mean`` updates are measured from; without it nothing is clipped)."""
    if rule.name == "mean" or not states:
        return weighted_average(states, weights)
    if rule.name == "fltrust":
        covered = rule.toward is not None and reference is not None
        if covered and any(k in rule.toward for k in states[0]):
            return _trusted_average(states, reference, rule.toward)
        rule = replace(rule, name="centered_clip")  # no root-data step for these tensors
    scales, centre = None, {}
    if rule.name == "clip_mean" and reference is not None:
        scales = clip_scales({k: reference[k] for k in states[0]}, states, rule)
    elif rule.name == "centered_clip":
        centre, scales = centred_clip(states, rule)
    out = {}
    for key, first in states[0].items():
        if all(s[key] is first for s in states):
            out[key] = first.clone()
            continue
        base = reference[key] if reference is not None else first
        sources = [s[key] for s in states]
        out[key] = combine(base, sources, weights, rule, scales, centre.get(key))
    return out


def _trusted_average(
    states: list[dict[str, torch.Tensor]],
    reference: Mapping[str, torch.Tensor],
    toward: Mapping[str, torch.Tensor],
) -> dict[str, torch.Tensor]:
    """:func:`robust_average` under ``fltrust`` (FLTrust Eq. 3–5, :func:`trust_layer`), the
    updates measured from ``reference``."""
    scores, factors = trust_factors(reference, states, toward)
    return {
        key: trust_layer(
            reference[key], [s[key] for s in states], scores, factors if key in toward else None
        )
        for key in states[0]
    }

"""The cost model shared by every algorithm: bytes on each link, FLOPs, and S²FL Eq. (1) time.

A client's round consists of: downloading its model part, ``samples`` forward+backward passes
through it, sending activations (and labels) up and receiving activation gradients down for
every sample, the server's forward+backward through the rest, and uploading the model part.
S²FL Eq. (1) for one local epoch over ``p`` samples::

    T = (2|Wc| + 2 p q) / R  +  F_c / Comp_c  +  F_s / Comp_s

with ``F_c = p · flops_c`` and ``F_s = p · flops_s`` (per-sample forward+backward FLOPs). Here
``samples`` generalises ``p`` to several local iterations or epochs, model bytes travel on the
download and upload link at their own rates (``R`` for both in S²FL), and label bytes (not in
Eq. 1) can be counted with ``label_bytes > 0``. FedAvg is the case ``cut == n_blocks``: the full
model goes down and up, no activations, no server compute.

**Shared server link** (``devices.contention``; not in Eq. 1): ``R`` above is the client's own
link, but every participant's transfers also cross the server's link (MergeSFL's PS ingress
budget B^h; S²FL Table 1 gives the server 1e7 B/s, but Eq. 1 does not share it).
:func:`share_server_link` gives each transfer the rate ``min(own link, max-min fair share of
the server link)`` among the round's concurrent transfers in the same direction
(:func:`max_min_share`). The default follows the preset's paper
(:data:`~splitfl.system.devices.PAPER_CONTENTION`): off — Eq. (1) exactly — for the S²FL and
RingSFL presets, on for the MergeSFL/ParallelSFL testbed; ``true``/``false`` override it (a
sensitivity analysis beside the paper's model).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from splitfl.models.profile import ModelProfile
from splitfl.system.devices import DeviceProfile

LINKS = (
    "model_down",
    "model_up",
    "activations_up",
    "gradients_down",
    "labels_up",
    "d2d_model",
    "d2d_activations",
    "d2d_gradients",
)

#: Share of a part's per-sample forward+backward FLOPs spent in the forward pass (the usual
#: 1 : 2 estimate); used where forward and backward are timed apart (the ring schedule,
#: emulated devices).
FORWARD_SHARE = 1.0 / 3.0


@dataclass
class Traffic:
    """Bytes per link and direction, summed over clients."""

    model_down: float = 0.0
    model_up: float = 0.0
    activations_up: float = 0.0
    gradients_down: float = 0.0
    labels_up: float = 0.0
    d2d_model: float = 0.0
    d2d_activations: float = 0.0
    d2d_gradients: float = 0.0

    def add(self, other: Traffic) -> Traffic:
        for link in LINKS:
            setattr(self, link, getattr(self, link) + getattr(other, link))
        return self

    @property
    def total(self) -> float:
        return sum(getattr(self, link) for link in LINKS)

    def to_dict(self) -> dict[str, float]:
        return {link: getattr(self, link) for link in LINKS}


@dataclass(frozen=True)
class AuxCharge:
    """An auxiliary model's part of a client's round (auxiliary-model split learning): its
    forward + backward FLOPs per trained sample on the device, its bytes down and up (counted
    on ``model_down``/``model_up``), and FLOPs the server spends on it (FSL-SAGE's alignment)."""

    flops_per_sample: float = 0.0
    bytes_down: float = 0.0
    bytes_up: float = 0.0
    server_flops: float = 0.0


@dataclass
class ClientCost:
    """One client's work in a round and its time on the simulated clock (S²FL Eq. 1)."""

    traffic: Traffic
    device_flops: float
    server_flops: float
    comm_time: float
    device_time: float
    server_time: float
    extra: dict[str, float] = field(default_factory=dict)
    #: (uplink, downlink) rates of the client's own link to the server that ``comm_time``
    #: charged the server-side bytes at; ``None`` where the cost has no client↔server link
    #: (its topology accounts for sharing itself). Used by :func:`share_server_link`.
    server_link: tuple[float, float] | None = None
    #: Energy (J) other devices spend computing for this client (e.g. a top worker's compute
    #: for the client's batches); added to the round's energy.
    helper_energy: float = 0.0

    @property
    def time(self) -> float:
        return self.comm_time + self.device_time + self.server_time


def split_client_cost(
    profile: ModelProfile,
    cut: int,
    samples: int,
    device: DeviceProfile,
    server: DeviceProfile,
    label_bytes: int = 0,
    model_down: bool = True,
    model_up: bool = True,
    gradients: bool = True,
    exchanges: int = 0,
    exchange_latency: float = 0.0,
    uploaded: int | None = None,
    aux: AuxCharge | None = None,
) -> ClientCost:
    """Cost of one client training blocks ``[0, cut)`` on ``samples`` samples (Eq. 1).

    Args:
        profile: Per-block costs of the model.
        cut: Cut point; ``cut == profile.num_blocks`` means the whole model on the device.
        samples: Samples processed in the round (``p`` × local epochs).
        device: The client's profile (``Comp_c`` = ``device.flops``, ``R`` = its link rates).
        server: The server profile (``Comp_s``).
        label_bytes: Bytes per label sent with the activations (Eq. 1 uses 0).
        model_down, model_up: Whether the device part is downloaded / uploaded this round
            (algorithms that aggregate less often than every round skip them).
        gradients: Whether activation gradients come back (not with device-side local losses).
        exchanges, exchange_latency: Message exchanges with the server in the round (mini-batches
            of a split model, model transfers) and a fixed time for each
            (``devices.exchange_latency_s``), added to the communication time; 0 = Eq. 1.
        uploaded: Samples whose smashed data (and labels, gradients) cross the cut and the
            server trains on (default all ``samples``; CSE-FSL's upload period sends fewer).
        aux: The auxiliary model's device FLOPs per sample, transfers and server FLOPs.
    """
    aux = aux or AuxCharge()
    model_bytes = profile.device_bytes(cut)
    q = profile.activation_bytes(cut)
    split = cut < profile.num_blocks
    sent = samples if uploaded is None else uploaded
    traffic = Traffic(
        model_down=(model_bytes if model_down else 0.0) + aux.bytes_down,
        model_up=(model_bytes if model_up else 0.0) + aux.bytes_up,
        activations_up=sent * q,
        gradients_down=sent * profile.gradient_bytes(cut) if gradients else 0.0,
        labels_up=sent * label_bytes if split else 0.0,
    )
    device_flops = samples * (profile.device_flops(cut) + aux.flops_per_sample)
    server_flops = sent * profile.server_flops(cut) + aux.server_flops
    return timed_cost(
        traffic, device_flops, server_flops, device, server, exchanges, exchange_latency
    )


def timed_cost(
    traffic: Traffic,
    device_flops: float,
    server_flops: float,
    device: DeviceProfile,
    server: DeviceProfile,
    exchanges: int = 0,
    exchange_latency: float = 0.0,
) -> ClientCost:
    """Eq. (1)'s time of a round between a client and the server: its bytes up (model,
    activations, labels) at its uplink and down (model, gradients) at its downlink, plus
    ``exchanges`` × ``exchange_latency``; its FLOPs at its speed, the server's at the server's."""
    up = traffic.model_up + traffic.activations_up + traffic.labels_up
    down = traffic.model_down + traffic.gradients_down
    return ClientCost(
        traffic=traffic,
        device_flops=device_flops,
        server_flops=server_flops,
        comm_time=up / device.uplink + down / device.downlink + exchanges * exchange_latency,
        device_time=device_flops / device.flops,
        server_time=server_flops / server.flops,
        server_link=(device.uplink, device.downlink),
    )


def d2d_rate(a: DeviceProfile, b: DeviceProfile) -> float:
    """Rate of the device-to-device link between ``a`` and ``b`` (the slower radio)."""
    rates = [r for r in (a.d2d, b.d2d) if r is not None]
    if not rates:
        raise ValueError("device-to-device link needs a d2d rate on both devices")
    return min(rates)


def round_times(client_times: dict[int, float]) -> tuple[float, dict[int, float]]:
    """Round time (max over participants) and each participant's waiting time (round − own)."""
    if not client_times:
        return 0.0, {}
    round_time = max(client_times.values())
    return round_time, {c: round_time - t for c, t in client_times.items()}


def max_min_share(caps: Sequence[float], capacity: float) -> list[float]:
    """Max-min fair (water-filling) rates of concurrent flows sharing a link of ``capacity``.

    Flow ``k`` can go no faster than ``caps[k]`` (its own link). Flows are filled in order of
    increasing cap: each gets ``min(cap, remaining capacity / flows left)``, so a flow whose own
    link is slower than its fair share keeps its own rate and leaves the rest to the others,
    and no flow gets more than ``capacity / n`` unless others need less. Where the caps sum to
    at most ``capacity`` every flow gets exactly its cap. Example: four 5e6 B/s flows into a
    1e7 B/s link get 2.5e6 each; caps (1e6, 1e6, 1e6, 5e6) get (1e6, 1e6, 1e6, 5e6).
    """
    if not capacity > 0:
        raise ValueError(f"shared link capacity must be > 0 (got {capacity})")
    if any(not c > 0 for c in caps):
        raise ValueError(f"every flow's own rate must be > 0 (got {list(caps)})")
    rates = [0.0] * len(caps)
    left = capacity
    order = sorted(range(len(caps)), key=lambda k: caps[k])
    for done, k in enumerate(order):
        rates[k] = min(caps[k], left / (len(caps) - done))
        left -= rates[k]
    return rates


def server_bytes(traffic: Traffic) -> tuple[float, float]:
    """Bytes a client sends to (ingress) and receives from (egress) the server in a round."""
    ingress = traffic.model_up + traffic.activations_up + traffic.labels_up
    return ingress, traffic.model_down + traffic.gradients_down


def share_server_link(
    costs: dict[int, ClientCost], server: DeviceProfile, concurrent: bool = True
) -> dict[int, ClientCost]:
    """Server-link contention: each client's server-side transfers at their shared rate.

    The server receives at ``server.downlink`` (ingress) and sends at ``server.uplink``
    (egress). With ``concurrent`` (participants train in parallel), the round's transfers in
    one direction are taken to overlap for their whole duration, and each client's rate is its
    :func:`max_min_share` of the server link, capped by its own link; the rates are not
    re-allocated when a client finishes early, so the model errs on the slow side. Without
    ``concurrent`` (clients served one after another, e.g. vanilla SL) each transfer has the
    server link to itself: ``min(own link, server)``. Only ``comm_time`` changes, by
    ``bytes · (1/shared − 1/own)`` per direction, i.e. not at all where the server link does not
    bind. Costs without a ``server_link`` pass through unchanged.
    """
    linked = {c: cost for c, cost in costs.items() if cost.server_link is not None}
    shares: dict[int, list[float]] = {c: list(cost.server_link) for c, cost in linked.items()}
    for direction, capacity in enumerate((server.downlink, server.uplink)):
        flows = [c for c, cost in linked.items() if server_bytes(cost.traffic)[direction] > 0]
        caps = [shares[c][direction] for c in flows]
        if concurrent:
            rates = max_min_share(caps, capacity)
        else:
            rates = [min(cap, capacity) for cap in caps]
        for c, rate in zip(flows, rates, strict=True):
            shares[c][direction] = rate
    out = dict(costs)
    for c, cost in linked.items():
        extra_time = sum(
            b * (1.0 / rate - 1.0 / own)
            for b, rate, own in zip(
                server_bytes(cost.traffic), shares[c], cost.server_link, strict=True
            )
            if b > 0
        )
        extra = {**cost.extra, "server_in_rate": shares[c][0], "server_out_rate": shares[c][1]}
        out[c] = replace(cost, comm_time=cost.comm_time + extra_time, extra=extra)
    return out

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
"""

from __future__ import annotations

from dataclasses import dataclass, field

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
    """
    model_bytes = profile.device_bytes(cut)
    q = profile.activation_bytes(cut)
    split = cut < profile.num_blocks
    traffic = Traffic(
        model_down=model_bytes if model_down else 0.0,
        model_up=model_bytes if model_up else 0.0,
        activations_up=samples * q,
        gradients_down=samples * q if gradients else 0.0,
        labels_up=samples * label_bytes if split else 0.0,
    )
    up = traffic.model_up + traffic.activations_up + traffic.labels_up
    down = traffic.model_down + traffic.gradients_down
    device_flops = samples * profile.device_flops(cut)
    server_flops = samples * profile.server_flops(cut)
    return ClientCost(
        traffic=traffic,
        device_flops=device_flops,
        server_flops=server_flops,
        comm_time=up / device.uplink + down / device.downlink,
        device_time=device_flops / device.flops,
        server_time=server_flops / server.flops,
    )


def d2d_rate(a: DeviceProfile, b: DeviceProfile) -> float:
    """Rate of the device-to-device link between ``a`` and ``b`` (the slower radio)."""
    rates = [r for r in (a.d2d, b.d2d) if r is not None]
    if not rates:
        raise ValueError("device-to-device link needs a d2d rate on both devices")
    return min(rates)


def clustered_client_cost(
    profile: ModelProfile,
    cut: int,
    samples: int,
    steps: int,
    device: DeviceProfile,
    top: DeviceProfile,
    members: int,
    label_bytes: int = 0,
) -> ClientCost:
    """Cost of a bottom worker in a cluster whose *top worker* holds the top model
    (ParallelSFL §3.3, Eq. 9 and 15).

    Per iteration the worker computes its bottom part (μ_b), sends activations and labels to
    the top worker and receives gradients over the device-to-device link (β_i,c), and waits for
    the top worker to process the batches of all ``members`` bottom workers (N_c·μ_p). Per
    round the top worker downloads and uploads the full model from/to the parameter server
    (β_c, shared equally among the members in the accounting), and sends/collects the bottom
    part to/from each member over D2D.
    """
    link = d2d_rate(device, top)
    bottom_bytes = profile.device_bytes(cut)
    full_bytes = profile.total_bytes
    q = profile.activation_bytes(cut)
    per_sample_top = profile.server_flops(cut)
    traffic = Traffic(
        model_down=full_bytes / members,
        model_up=full_bytes / members,
        d2d_model=2 * bottom_bytes,
        d2d_activations=samples * (q + label_bytes),
        d2d_gradients=samples * q,
    )
    ps_time = 2 * full_bytes / min(top.uplink, top.downlink)
    d2d_time = (traffic.d2d_model + traffic.d2d_activations + traffic.d2d_gradients) / link
    device_flops = samples * profile.device_flops(cut)
    top_flops = members * samples * per_sample_top
    return ClientCost(
        traffic=traffic,
        device_flops=device_flops,
        server_flops=samples * per_sample_top,
        comm_time=ps_time + d2d_time,
        device_time=device_flops / device.flops,
        server_time=top_flops / top.flops,
        extra={"steps": float(steps)},
    )


def ring_client_cost(
    profile: ModelProfile,
    work: list[tuple[int, int, int, bool]],
    device: DeviceProfile,
    next_device: DeviceProfile,
    prev_device: DeviceProfile,
) -> ClientCost:
    """Cost of one RingSFL client in a round (``papers/ringsfl.md`` §3.3, Alg. 2).

    ``work`` lists the client's segments over the round as (first block, stop block, samples,
    own batch): it computes forward+backward of blocks [first, stop) for ``samples`` samples
    (p_i·M·N/C_i per mini-batch step in the paper's notation), sends the segment's output
    forward to the next client, sends the gradient of the segment's input back to the previous
    client (unless first == 0), and — for its own batches — sends the gradient of the logits
    back to the client that computed them. The full model is downloaded from and uploaded to
    the server once per round. The ring hops use the device-to-device rate of the link.
    """
    n = profile.num_blocks
    flops = sum(samples * profile.part_flops(lo, hi) for lo, hi, samples, _ in work)
    forward = sum(samples * profile.blocks[hi - 1].out_bytes for lo, hi, samples, _ in work)
    backward = sum(samples * profile.blocks[lo - 1].out_bytes for lo, hi, samples, _ in work if lo)
    backward += sum(samples * profile.blocks[n - 1].out_bytes for _, _, samples, own in work if own)
    model = profile.total_bytes
    traffic = Traffic(
        model_down=model, model_up=model, d2d_activations=forward, d2d_gradients=backward
    )
    comm = model / device.downlink + model / device.uplink
    comm += forward / d2d_rate(device, next_device) + backward / d2d_rate(device, prev_device)
    return ClientCost(
        traffic=traffic,
        device_flops=flops,
        server_flops=0.0,
        comm_time=comm,
        device_time=flops / device.flops,
        server_time=0.0,
    )


def round_times(client_times: dict[int, float]) -> tuple[float, dict[int, float]]:
    """Round time (max over participants) and each participant's waiting time (round − own)."""
    if not client_times:
        return 0.0, {}
    round_time = max(client_times.values())
    return round_time, {c: round_time - t for c, t in client_times.items()}

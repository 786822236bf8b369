"""U-shaped split learning on the simulated clock: S²FL Eq. (1) with both hops each way.

A U-shaped client trains the front ``[0, cut)`` and the head ``[tail, n)`` on its device and
the server trains the middle ``[cut, tail)``; per sample, four tensors cross the client's link:

* up: the smashed data at ``cut`` (q_cut) and the gradient of the middle's output (g_tail);
* down: the middle's output at ``tail`` (q_tail) and the gradient of the smashed data (g_cut).

Eq. (1) generalised the same way as the star cost (:func:`~splitfl.system.cost.
split_client_cost`)::

    T = (|W_dev| + p (q_cut + g_tail)) / R_up + (|W_dev| + p (q_tail + g_cut)) / R_down
        + p (F_front + F_head) / Comp_c + p F_middle / Comp_s

with ``|W_dev|`` the front's and head's bytes (down and up, unless the task skips a transfer).
On the metrics' links, ``activations_up`` holds everything the device sends per sample and
``gradients_down`` everything it receives; no label crosses (``labels_up`` is 0).
"""

from __future__ import annotations

from splitfl.system.cost import ClientCost, Traffic, timed_cost


def ushaped_client_cost(
    profile,
    cut: int,
    tail: int,
    samples: int,
    device,
    server,
    model_down: bool = True,
    model_up: bool = True,
    exchanges: int = 0,
    exchange_latency: float = 0.0,
) -> ClientCost:
    """One U-shaped client's round (module docstring): ``profile`` a
    :class:`~splitfl.models.profile.ModelProfile`, ``device``/``server``
    :class:`~splitfl.system.devices.DeviceProfile`; ``exchanges`` message exchanges with the
    server, each ``exchange_latency`` seconds more."""
    n = profile.num_blocks
    model_bytes = profile.part_bytes(0, cut) + profile.part_bytes(tail, n)
    per_up = profile.activation_bytes(cut) + profile.gradient_bytes(tail)
    per_down = profile.activation_bytes(tail) + profile.gradient_bytes(cut)
    traffic = Traffic(
        model_down=model_bytes if model_down else 0.0,
        model_up=model_bytes if model_up else 0.0,
        activations_up=samples * per_up,
        gradients_down=samples * per_down,
    )
    device_flops = samples * (profile.part_flops(0, cut) + profile.part_flops(tail, n))
    server_flops = samples * profile.part_flops(cut, tail)
    return timed_cost(
        traffic, device_flops, server_flops, device, server, exchanges, exchange_latency
    )

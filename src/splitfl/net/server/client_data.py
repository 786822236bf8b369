"""Computations on a client's own samples, run on its device (``data.source: devices``).

IFCA's cluster identity (Ghosh et al. 2020, Alg. 1: ``argmin_j F_i(θ_j)`` on client i's own
data) needs the client's samples, which the server does not hold. :class:`RemoteClientData`
sends the K cluster models and the positions of the estimate's samples in the client's data
(drawn from the round's plan stream on the server, as in simulation) in one ``identify``
command; the device answers the index of the lowest-loss model
(:func:`~splitfl.models.base.lowest_loss_state`, the function the simulation runs). The
device's compute is charged by the algorithm's cost model (K forwards), as in simulation.
"""

from __future__ import annotations

import itertools

import numpy as np
import torch

from splitfl.net.transport.hub import LOST, Hub
from splitfl.net.transport.wire import Message, state_tensors


class RemoteClientData:
    """``ctx.client_compute`` of a networked run whose devices hold the data."""

    _seq = itertools.count(1 << 40)  # apart from the fleets' command numbers

    def __init__(self, hub: Hub, timeout_s: float):
        self.hub, self.timeout_s = hub, timeout_s

    def lowest_loss(
        self, client: int, states: list[dict[str, torch.Tensor]], positions: np.ndarray
    ) -> int:
        """The index of the state with the lowest loss on the client's samples at
        ``positions``; 0 when its device cannot answer (not connected, lost, a bad reply):
        the client is then most likely dropped from the round itself."""
        link = self.hub.link_of(client)
        if link is None:
            return 0
        seq = next(self._seq)
        tensors = {}
        for k, state in enumerate(states):
            tensors.update(state_tensors(f"m{k}", state))
        fields = {"client": client, "seq": seq, "positions": [int(p) for p in positions]}
        fields["models"] = len(states)
        link.send(Message("identify", fields, tensors))
        got = link.reply(client, seq, self.timeout_s)
        if got is None or got is LOST:
            return 0
        k = got[0].fields.get("cluster")
        return k if type(k) is int and 0 <= k < len(states) else 0

"""Conformance of every topology (training pattern) on every runtime that claims it.

One list, :data:`CLAIMS`, keyed by the registered payload types (``topologies.FAMILIES``): a
family registered without an entry here fails :func:`test_every_registered_topology_is_claimed`.
Each entry names an algorithm whose plans use the payload and the device processes a
networked run of it needs. In-process, every algorithm of every topology is checked on the
sequential, vectorised, parallel and timing runtimes by ``test_algorithms.py`` (its list is
the registry's, so every topology with an algorithm is in it: checked below); here each
topology runs over the network too, devices on loopback (gRPC, device agents in threads of
the test process), and must equal the sequential run to 1e-5 (float32 over the wire's
reordered summation, the tolerance of every networked equivalence test), with no client
dropped, every device ending on the server's bye and the bytes sent the cost model's.
"""

from __future__ import annotations

import pytest
import torch

import splitfl
from splitfl.algorithms import ALGORITHMS
from splitfl.core.topology import Clusters, Ring, Star, Turns, UShaped
from splitfl.net.server.testbed import Testbed
from splitfl.testing import config_for
from splitfl.topologies import FAMILIES

THREE = {"d0": [0, 3, 6, 9], "d1": [1, 4, 7, 10], "d2": [2, 5, 8, 11]}

#: Payload type → (an algorithm planning it, its devices, config changes).
CLAIMS = {
    Star: ("splitfed_v1", THREE, {}),
    Turns: ("splitfed_v2", THREE, {}),
    Ring: ("ringsfl", {"d0": [0, 2], "d1": [1], "d2": [3]}, {}),
    Clusters: ("parallelsfl", THREE, {}),
    UShaped: ("ushaped_sl", THREE, {}),
}


def test_every_registered_topology_is_claimed():
    assert set(CLAIMS) == set(FAMILIES)
    for payload, (algorithm, _, _) in CLAIMS.items():
        assert ALGORITHMS[algorithm].topology is payload


def test_every_topology_has_an_algorithm_in_the_in_process_suite():
    """``test_algorithms.py`` runs every registered algorithm on the in-process runtimes:
    each topology is covered there as long as some algorithm plans it."""
    planned = {cls.topology for cls in ALGORITHMS.values()}
    assert set(FAMILIES) <= planned


def _final(result) -> dict[str, torch.Tensor]:
    return torch.load(result.run_dir / "model.pt", weights_only=True)


@pytest.mark.parametrize("payload", list(CLAIMS), ids=lambda p: p.__name__)
def test_networked_equals_sequential(payload, tmp_path, sequential_run):
    algorithm, devices, changes = CLAIMS[payload]
    bed = Testbed.create(tmp_path / "bed", list(devices))
    threads = [bed.device(n, c, retry_s=20.0) for n, c in devices.items()]
    net_changes = bed.server_overrides(min_devices=len(devices), timeout_s=10.0)
    config = config_for(algorithm, rounds=2, **changes, **net_changes)
    net = splitfl.run(config, run_dir=tmp_path / "net")
    for t in threads:
        t.join(30)
    seq = sequential_run(config_for(algorithm, rounds=2, **changes))
    a, b = _final(net), _final(seq)
    assert a.keys() == b.keys()
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-5
    assert [t.code for t in threads] == [0] * len(devices)
    assert len(net.metrics) == 2
    for row in net.metrics:
        assert row["dropped_clients"] == []
        # what crossed the server's links and the device-to-device links is the cost model's
        # traffic (device-to-device labels travel as int64: at least the cost model's bytes)
        assert row["payload_activations_up"] == row["bytes_activations_up"]
        assert row["payload_gradients_down"] == row["bytes_gradients_down"]
        assert row["payload_d2d_gradients"] == row["bytes_d2d_gradients"]
        assert row["payload_d2d_activations"] >= row["bytes_d2d_activations"]
        assert row["payload_labels_up"] >= row["bytes_labels_up"]
        if payload is UShaped:
            assert row["payload_labels_up"] == 0  # the labels stay on the device

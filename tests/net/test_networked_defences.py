"""``train.defence`` in a networked run is applied in the device's process, before the
smashed data leave it: every ``forwarded`` message the server decodes off the wire holds the
defended tensor the device computed, never the clean one (issue 53 item 2)."""

from __future__ import annotations

import torch

import splitfl
import splitfl.net.transport.inbox as inbox
from splitfl.net.server.testbed import Testbed
from splitfl.roles.defences import DeviceDefence
from splitfl.testing import config_for

SMALL = {"data.num_clients": 4, "train.clients_per_round": 4, "rounds": 1}
NOISE = {"train.defence.noise_std": 0.5, "train.defence.noise_clip": 20.0}


def test_the_server_receives_only_noised_smashed_data(tmp_path, monkeypatch):
    received, protected = [], []
    decode, protect = inbox.decode, DeviceDefence.protect

    def recording_decode(data):
        message = decode(data)
        received.append(message)
        return message

    def recording_protect(self, x, fx, step):
        sent = protect(self, x, fx, step)
        protected.append((fx.detach().clone(), sent.detach().clone()))
        return sent

    monkeypatch.setattr(inbox, "decode", recording_decode)
    monkeypatch.setattr(DeviceDefence, "protect", recording_protect)
    devices = {"a": [0, 2], "b": [1, 3]}
    bed = Testbed.create(tmp_path / "bed", list(devices))
    threads = [bed.device(n, clients, None, retry_s=20.0) for n, clients in devices.items()]
    net = bed.server_overrides(min_devices=len(devices))
    config = config_for("splitfed_v1", **{**SMALL, **NOISE, **net})
    splitfl.run(config, run_dir=tmp_path / "net")
    for t in threads:
        t.join(30)
    wire = [m.tensors["fx"] for m in received if m.type == "forwarded"]
    assert wire and len(wire) == len(protected)
    for fx in wire:
        assert any(torch.equal(fx, sent) for _, sent in protected)
        assert not any(torch.equal(fx, clean) for clean, _ in protected)

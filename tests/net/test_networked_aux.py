"""Auxiliary-model algorithms over real gRPC on loopback (issue 36): the auxiliary model lives
on the device process, and a networked run equals the sequential run bit for bit; what the
devices sent is the cost model's traffic (uploads every h-th batch only, no gradients); a
device whose auxiliary-step report or auxiliary model is out of bounds is dropped."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_networked import GRAPH_SPLIT, _final, _networked, _rows

import splitfl
from splitfl.core.topology import AuxSpec
from splitfl.experiment.runner import as_config, prepare
from splitfl.net.device.agent import DeviceAgent
from splitfl.net.device.aux_commands import aux_spec
from splitfl.net.server.executor import NetworkedExecutor, emulated_profiles
from splitfl.net.transport.wire import WireError, state_tensors
from splitfl.testing import config_for

#: Equal client sizes that leave no one-sample batch (BatchNorm in train mode needs two).
IID = {"data.partition": "iid"}
CASES = {
    # h = 2 (interleaved turns: uploads at batches 1, 3, ...), the linear auxiliary model
    "cse_fsl": {"options.cse_fsl.upload_every": 2},
    # h = 2, alignment every round (the aligned model goes down at each client's first step),
    # FSL-SAGE's ResNet-stage auxiliary model (BatchNorm: its statistics come back)
    "fsl_sage": {
        "options.fsl_sage.aux_model": "resnet_stage",
        "options.fsl_sage.align_every": 1,
        **IID,
    },
    # any nn.Module as LocFedMix-SL's auxiliary model (before: the linear one only)
    "locfedmix_sl": {"options.locfedmix_sl.aux_model": "resnet_stage", **IID},
    # the U-Net's cut where two tensors cross: the auxiliary model reads both, FSL-SAGE's
    # estimate and alignment cover both, the server keeps both in its memory
    "fsl_sage-graph": {"options.fsl_sage.align_every": 1, **GRAPH_SPLIT},
    "cse_fsl-graph": {"options.cse_fsl.upload_every": 2, **GRAPH_SPLIT},
}


@pytest.mark.parametrize("case", list(CASES))
def test_networked_auxiliary_run_equals_sequential_bit_for_bit(tmp_path, case):
    algorithm, changes = case.removesuffix("-graph"), {"rounds": 2, **CASES[case]}
    net, threads = _networked(tmp_path, algorithm, **changes)
    seq = _sequential(tmp_path, algorithm, changes)
    assert _same(_final(net), _final(seq)) == []
    aux = _aux_states(seq)
    assert any("aux" in k for k in aux)
    assert _same(_aux_states(net), aux) == []
    assert [t.code for t in threads] == [0, 0, 0]
    for row, ref in zip(_rows(net), seq.metrics, strict=True):
        assert row["dropped_clients"] == []
        # networked (untrusted): train_loss is the clients' lower median, the mean aside
        assert row["train_loss_mean"] == ref["train_loss"]
        # only the uploaded batches' smashed data left the devices; no gradient came down
        assert row["payload_activations_up"] == row["bytes_activations_up"] > 0
        assert row.get("payload_gradients_down", 0) == row["bytes_gradients_down"] == 0
        # beyond the cost model's count: at most the int64 BatchNorm counters (4 B each
        # there), and FSL-SAGE's ResNet-stage auxiliary model's BatchNorm statistics
        extra, counters = row["payload_model_up"] - row["bytes_model_up"], 4 * 4 * 6
        if case == "fsl_sage":  # its parameters change on the server alone (counted down)
            aux_bytes = row["bytes_model_down"] - row["bytes_model_up"]
            assert counters < extra < 0.1 * aux_bytes
        elif algorithm != "locfedmix_sl":  # part (and CSE-FSL's auxiliary model) up
            assert 0 <= extra <= counters


def _sequential(tmp_path, algorithm, changes):
    return splitfl.run(config_for(algorithm, **changes), run_dir=tmp_path / "seq")


def _aux_states(result) -> dict[str, torch.Tensor]:
    """Every tensor of the algorithm's state in the last checkpoint (auxiliary models, and
    FSL-SAGE's memory of the uploads), by path."""
    state = torch.load(result.run_dir / "checkpoints" / "last.pt", weights_only=True)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, obj) -> None:
        if isinstance(obj, dict):
            for k, v in obj.items():
                walk(f"{prefix}/{k}", v)
        elif isinstance(obj, list | tuple):
            for i, v in enumerate(obj):
                walk(f"{prefix}/{i}", v)
        elif isinstance(obj, torch.Tensor):
            flat[prefix] = obj

    walk("", state["algorithm"])
    return flat


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    """The names whose tensors differ (both sides must hold the same names)."""
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


class _AuxLiar(DeviceAgent):
    """Client 0 reports an auxiliary step of more samples than a batch holds; client 3 sends
    back an auxiliary model a million times larger (CSE-FSL), or its parameters where only its
    statistics may come back (FSL-SAGE)."""

    def _on_aux_step(self, c, msg):
        reply = super()._on_aux_step(c, msg)
        if c == 0:
            reply.fields["samples"] = 10**6
        return reply

    def _on_finish(self, c, msg):
        if c != 3:
            return super()._on_finish(c, msg)
        everything = state_tensors("aux", self.roles[c].aux.state_dict())
        local = self.aux_losses[c] == "local"
        reply = super()._on_finish(c, msg)
        if local:
            reply.tensors.update({k: v * 1e6 for k, v in everything.items()})
        else:
            reply.tensors.update(everything)
        return reply


@pytest.mark.parametrize("algorithm", ["cse_fsl", "fsl_sage"])
def test_lying_auxiliary_reports_are_rejected(tmp_path, algorithm):
    devices = {"liar": [0, 3], "honest": [1, 2, 4, 5]}
    changes = {"rounds": 1, "data.num_clients": 6, "train.clients_per_round": 6}
    changes |= {"options.cse_fsl.upload_every": 2, "options.fsl_sage.align_every": 1}
    net, _ = _networked(tmp_path, algorithm, devices, _AuxLiar, **changes)
    (row,) = _rows(net)
    assert row["dropped_clients"] == [0, 3]
    assert "rejected auxiliary step report: 1000000 samples" in row["dropped_reasons"]["0"]
    why = row["dropped_reasons"]["3"]
    assert why.startswith("rejected model update: auxiliary model: ")
    assert ("update norm" if algorithm == "cse_fsl" else "tensor names differ") in why


def test_device_builds_only_the_configs_auxiliary_models():
    config = as_config(config_for("cse_fsl", **{"options.cse_fsl.aux_model": "resnet_stage"}))
    field = {"model": "resnet_stage", "input_shape": [4, 3, 3], "num_classes": 10, "loss": "local"}
    assert aux_spec(field, config, 10) == (AuxSpec("resnet_stage", (4, 3, 3), 10), "local")
    for bad, match in [
        ({"model": "os:system"}, "not the config's"),
        ({"input_shape": [4, -3]}, "input_shape"),
        ({"input_shape": "4x3"}, "input_shape"),
        ({"num_classes": 11}, "num_classes"),
        ({"loss": "server"}, "loss"),
    ]:
        with pytest.raises(WireError, match=match):
            aux_spec({**field, **bad}, config, 10)
    with pytest.raises(WireError, match="must name"):
        aux_spec({**field, "code": "x"}, config, 10)


def test_emulated_device_compute_charges_the_auxiliary_model_as_the_cost_model():
    """``network.emulate``: a device's per-sample FLOPs are its part's plus its auxiliary
    model's, the same count the cost model charges (``AuxModel.flops``)."""
    config = as_config(config_for("fsl_sage", **{"options.fsl_sage.aux_model": "resnet_stage"}))
    prep = prepare(config)
    alg, ctx = prep.algorithm, prep.ctx
    plan = alg.plan_round(
        0, alg.select_clients(0, np.random.default_rng(0)), np.random.default_rng(1)
    )
    aux = NetworkedExecutor(config)._aux_flops(plan, ctx.model)
    assert aux == alg.aux_model.flops > 0
    for t in plan.tasks:
        per_sample = emulated_profiles(ctx, plan, True, aux)[t.client].flops_per_sample
        assert per_sample == ctx.profile.device_flops(t.cut) + aux


def test_locfedmix_local_plus_server_networked_equals_sequential(tmp_path):
    """``device_update: local+server`` (issue 50 item 2): the gradients come down as
    ``backward`` and the device adds its auxiliary loss; bit for bit the sequential run, and
    the gradients' bytes are the cost model's."""
    changes = {"rounds": 2, "options.locfedmix_sl.device_update": "local+server", **IID}
    net, threads = _networked(tmp_path, "locfedmix_sl", **changes)
    seq = _sequential(tmp_path, "locfedmix_sl", changes)
    assert _same(_final(net), _final(seq)) == []
    assert _same(_aux_states(net), _aux_states(seq)) == []
    assert [t.code for t in threads] == [0, 0, 0]
    for row in _rows(net):
        assert row["dropped_clients"] == []
        assert row["payload_gradients_down"] == row["bytes_gradients_down"] > 0

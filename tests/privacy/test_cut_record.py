"""``privacy.record``: what the server received at the cut during training, recorded by every
executor the same way, without changing the run; the attacks on it (``--recorded``)."""

import json
from pathlib import Path

import pytest
import torch

import splitfl
from conftest import force_batching
from splitfl.cli.main import main
from splitfl.config import ConfigError
from splitfl.config.parse import load_config
from splitfl.core.seeding import derive_seed
from splitfl.experiment.runner import prepare
from splitfl.net.server.testbed import Testbed
from splitfl.privacy import RunAttack, attack_recorded, attack_run, read_record
from splitfl.roles.cut_record import RECORD_DIR
from splitfl.roles.defences import add_noise
from splitfl.testing import config_for

HERE = str(Path(__file__).parent)
PLAIN = {"options.splitfed_v1.cut": 1}
#: every client of the tiny config, both rounds, two mini-batches each
RECORD = {"privacy.record.rounds": [1, 2]}  # every selected client (clients: null)
RECORD2 = {**RECORD, "privacy.record.batches": 2}
NOISE = {"train.defence.noise_std": 2.0, "train.defence.noise_clip": 20.0}


def _run(base: Path, name: str, algorithm: str = "splitfed_v1", **changes) -> Path:
    config = config_for(algorithm, rounds=2, **changes)
    return splitfl.run(config, run_dir=base / name).run_dir


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Tiny two-round runs: splitfed_v1 at cut 1 without and with the record, vectorised,
    noised; a U-shaped run; a linear device part recording round 2."""
    base = tmp_path_factory.mktemp("recorded")
    linear = {
        "model": "linear_models:linear_front",
        "import_dirs": [HERE],
        "options.splitfed_v1.cut": 2,
        "privacy.record.clients": [0, 1, 2, 3, 4, 5],
        "privacy.record.rounds": [2],
    }
    vectorised = {}
    for use_vmap in (True, False):  # batched, not the CPU default (the reference loop)
        with pytest.MonkeyPatch.context() as mp:
            force_batching(mp, use_vmap)
            name = "vmap" if use_vmap else "rows"
            vectorised[name] = _run(base, name, **PLAIN, **RECORD2, executor="vectorized")
            if use_vmap:
                vectorised["vmap_off"] = _run(base, "vmap_off", **PLAIN, executor="vectorized")
    return {
        **vectorised,
        "parallel": _run(base, "parallel", **PLAIN, **RECORD2, executor="parallel"),
        "off": _run(base, "off", **PLAIN),
        "seq": _run(base, "seq", **PLAIN, **RECORD2),
        "noised": _run(base, "noised", **PLAIN, **RECORD2, **NOISE),
        "noised_off": _run(base, "noised_off", **PLAIN, **NOISE),
        "ushaped": _run(base, "ushaped", "ushaped_sl", **RECORD2),
        "linear": _run(base, "linear", **linear),
    }


def _keyed(run_dir: Path) -> dict:
    return {(b.round, b.client, b.step, b.kind): b for b in read_record(run_dir)}


def _model(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def _rows(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if "wall" not in k and "measured" not in k} for r in rows]


def test_recording_leaves_the_run_unchanged(runs):
    """With the record on the model and the metrics are those of the run without it."""
    for on, off in (("seq", "off"), ("noised", "noised_off"), ("vmap", "vmap_off")):
        a, b = _model(runs[on]), _model(runs[off])
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert _rows(runs[on]) == _rows(runs[off])
    assert not (runs["off"] / RECORD_DIR).exists()


def test_the_record_holds_each_chosen_batch_with_its_indices_and_part(runs):
    rows = _rows(runs["seq"])
    record = _keyed(runs["seq"])
    expected = {(r["round"], c, s) for r in rows for c in r["clients"] for s in (0, 1)}
    assert {(r, c, s) for r, c, s, _ in record} == expected  # 2 batches of every participant
    config = load_config(runs["seq"] / "config.yaml")
    prep = prepare(config)
    for (r, c, step, kind), b in record.items():
        assert kind == "smashed" and b.cut == 1
        assert len(b.indices) == b.value.shape[0] == config.train.batch_size
        assert set(b.indices.tolist()) <= set(prep.ctx.client_indices[c].tolist())
        # round 1's part is the initial model's first block; smashed data = that part(x) in
        # training mode (its BatchNorm on the batch's statistics)
        if r == 1 and step == 0:
            x = prep.ctx.bundle.train.x[b.indices]
            front = prep.ctx.model.blocks[0].train()
            front.load_state_dict({k[len("blocks.0.") :]: v for k, v in b.part.items()})
            torch.testing.assert_close(front(x), b.value, rtol=0, atol=1e-6)


@pytest.mark.parametrize("mode", ["vmap", "rows", "parallel"])
def test_sequential_vectorised_and_parallel_record_the_same_tensors(runs, mode):
    """The vectorised executor's bucket rows; the parallel executor's worker processes
    (``parallel.backend: local``), whose loops' tensors come back with each unit's answer."""
    seq, vec = _keyed(runs["seq"]), _keyed(runs[mode])
    assert seq.keys() == vec.keys()
    for key, a in seq.items():
        b = vec[key]
        assert torch.equal(a.indices, b.indices) and a.cut == b.cut
        torch.testing.assert_close(a.value, b.value, rtol=1e-5, atol=1e-5)
        assert a.part.keys() == b.part.keys()
        for k in a.part:  # round 1's equal; round 2's aggregated to fp32 rounding
            torch.testing.assert_close(a.part[k], b.part[k], rtol=1e-5, atol=1e-6)


def test_a_noised_run_records_the_noised_smashed_data(runs):
    """The defence acts on the device, before sending: round 1's first batch recorded from
    the noised run is the plain run's (same initial part, same samples) plus the device's
    noise (``add_noise`` with the device's seed), not the plain tensor."""
    config = load_config(runs["noised"] / "config.yaml")
    plain, noised = _keyed(runs["seq"]), _keyed(runs["noised"])
    round_seed = derive_seed(config.seed, "b", 0)
    checked = 0
    for (r, c, step, kind), b in noised.items():
        if r != 1:
            continue
        a = plain[r, c, step, kind]
        assert torch.equal(a.indices, b.indices)
        seed = derive_seed(round_seed, "smashed-noise", c, step)
        if step == 0:  # step 1's plain and noised parts differ after one noised step
            expected = add_noise(a.value, 2.0, 20.0, seed)
            torch.testing.assert_close(b.value, expected, rtol=0, atol=1e-5)
            checked += 1
        assert (b.value - a.value).abs().mean() > 0.5  # noise of std 2 is there
    assert checked == len(_rows(runs["noised"])[0]["clients"])


def test_unsplit_inverts_a_recorded_linear_part_exactly(runs):
    """f(x) = Wx + b with orthonormal columns, recorded in round 2: L-BFGS on the recorded
    smashed data with the round's recorded part returns the inputs; the final model (a
    round later) does not."""
    spec = {"samples": 8, "iterations": 3, "optimizer": "lbfgs", "lambda_tv": 0, "lambda_l2": 0}
    out = attack_recorded(runs["linear"], "unsplit", **spec)
    assert out["round"] == 2 and out["cut"] == 2
    assert (out["reconstruction"] - out["true_x"]).abs().max() < 1e-5
    record = read_record(runs["linear"])
    chosen = set(_rows(runs["linear"])[1]["clients"]) & set(range(6))
    assert {b.client for b in record} == chosen and {b.round for b in record} == {2}
    final = _model(runs["linear"])
    assert not torch.equal(record[0].part["blocks.1.weight"], final["1.weight"])  # user keys


def test_labels_leak_from_the_recorded_head_gradients(runs, tmp_path, capsys):
    record = _keyed(runs["ushaped"])
    kinds = {k for _, _, _, k in record}
    assert kinds == {"smashed", "head_gradient"}
    argv = ["privacy", "labels", str(runs["ushaped"]), "--recorded", "--samples", "32"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "results.json").read_text())
    assert written["round"] == 1 and written["samples"] == 32
    assert written["auc_direction"] > 0.8
    assert "recorded in round 1" in capsys.readouterr().out
    direct = attack_run(RunAttack(str(runs["ushaped"]), "labels", samples=32, recorded=True))
    assert direct["auc_direction"] == pytest.approx(written["auc_direction"])


def test_cli_reconstruct_recorded_mirrors_the_python_api(runs, tmp_path, capsys):
    argv = ["--recorded", "--round", "2", "--client", "3", "--samples", "8", "--iterations", "20"]
    assert main(["privacy", "reconstruct", str(runs["seq"]), *argv, "--out", str(tmp_path)]) == 0
    written = json.loads((tmp_path / "results.json").read_text())
    direct = attack_recorded(runs["seq"], round=2, client=3, samples=8, iterations=20)
    assert written["round"] == 2 and written["client"] == 3
    assert written["mse"] == pytest.approx(direct["mse"])
    assert (tmp_path / "grid.png").stat().st_size > 1000
    assert "recorded in round 2" in capsys.readouterr().out


def _copy(run_dir: Path, to: Path) -> Path:
    import shutil

    shutil.copytree(run_dir, to)
    return to


@pytest.mark.parametrize(
    ("damage", "named"),
    [
        ("remove_index", "index.json"),
        ("corrupt_index", "index.json"),
        ("corrupt_round", "round_0001.pt"),
        ("remove_round", "round_0001.pt"),
        ("pickle_round", "round_0001.pt"),
    ],
)
def test_a_missing_or_damaged_record_is_one_line_naming_the_file(
    runs, tmp_path, capsys, damage, named
):
    run_dir = _copy(runs["seq"], tmp_path / "run")
    folder = run_dir / RECORD_DIR
    if damage == "remove_index":
        (folder / "index.json").unlink()
    elif damage == "corrupt_index":
        (folder / "index.json").write_text("{not json")
    elif damage == "corrupt_round":
        (folder / "round_0001.pt").write_bytes(b"\x00garbage" * 10)
    elif damage == "remove_round":
        (folder / "round_0001.pt").unlink()
    else:  # a pickle that is not plain tensors: weights_only refuses it
        torch.save({"x": Path("/etc")}, folder / "round_0001.pt")
    with pytest.raises(ConfigError, match=named):
        read_record(run_dir)
    assert main(["privacy", "reconstruct", str(run_dir), "--recorded", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"privacy.record.clients": [12]}, "privacy.record.clients"),
        ({"privacy.record.clients": []}, "privacy.record.clients"),
        ({"privacy.record.rounds": [0]}, "privacy.record.rounds"),
        ({"privacy.record.rounds": [5]}, "privacy.record.rounds"),
        ({"privacy.record.rounds": [1, 1]}, "privacy.record.rounds"),
        ({"privacy.record.batches": 0}, "privacy.record.batches"),
        (
            {"privacy.record.batches": 1, "data.source": "devices", "executor": "networked"},
            "privacy.record",
        ),
    ],
)
def test_bad_record_settings_are_one_line_naming_the_field(tmp_path, capsys, changes, field):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_for("splitfed_v1", rounds=2, **changes)))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"{field}:" in err


def test_ring_rounds_are_refused_before_they_train(tmp_path):
    """RingSFL's server sees no member's smashed data: recording it is refused."""
    config = config_for("ringsfl", rounds=1, **{"privacy.record.batches": 1})
    with pytest.raises(ConfigError, match="privacy.record"):
        splitfl.run(config, run_dir=tmp_path / "ring")


@pytest.mark.parametrize(
    ("algorithm", "pattern"), [("ringsfl", "Ring"), ("parallelsfl", "Clusters")]
)
def test_recording_an_unrecorded_pattern_is_refused_by_the_validation(
    tmp_path, capsys, algorithm, pattern
):
    """The ring and the clusters give the central server no smashed data: ``splitfl validate``
    refuses ``privacy.record`` there (one line naming it), so no run or sweep starts one
    whose recorded round would fail (round 3: after two rounds trained, before)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config_for(algorithm, **{"privacy.record.rounds": [3]})))
    assert main(["validate", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "privacy.record:" in err and pattern in err
    ok = tmp_path / "ok.json"
    ok.write_text(json.dumps(config_for("splitfed_v1", **{"privacy.record.rounds": [3]})))
    assert main(["validate", str(ok)]) == 0


@pytest.mark.parametrize(
    ("algorithm", "local"), [("splitfed_v1", "seq"), ("ushaped_sl", "ushaped")]
)
def test_the_networked_server_records_what_arrived_on_the_wire(runs, tmp_path, algorithm, local):
    """Three thread devices (the Testbed) send their smashed data (and, U-shaped, their
    heads' gradients) over gRPC; the server records the decoded messages: the sequential
    run's tensors, indices and parts."""
    devices = {"d0": [0, 3, 6, 9], "d1": [1, 4, 7, 10], "d2": [2, 5, 8, 11]}
    bed = Testbed.create(tmp_path / "bed", list(devices))
    threads = [bed.device(name, clients, retry_s=20.0) for name, clients in devices.items()]
    net = bed.server_overrides(min_devices=len(devices))
    cut = PLAIN if algorithm == "splitfed_v1" else {}
    config = config_for(algorithm, rounds=2, **cut, **RECORD2, **net)
    run_dir = splitfl.run(config, run_dir=tmp_path / "net").run_dir
    for t in threads:
        t.join(30)
    seq, remote = _keyed(runs[local]), _keyed(run_dir)
    assert seq.keys() == remote.keys()
    for key, a in seq.items():
        b = remote[key]
        assert torch.equal(a.indices, b.indices)
        torch.testing.assert_close(a.value, b.value, rtol=1e-5, atol=1e-5)
        assert all(torch.equal(a.part[k], b.part[k]) for k in a.part)

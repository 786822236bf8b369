"""Devices with their own data (``data.source: devices``, ``splitfl device --data``).

Equivalence: device processes each given, as their own files, exactly the partition the
seed draws reproduce the sequential run; IFCA's identity computed on the devices equals the
server-side choice. The join announcement is validated (hostile values are refused in one
line), mismatches are one line on both sides, histogram noise is seeded and clamped, and the
run directory records which device provided which clients.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

import splitfl
from splitfl.config import ConfigError
from splitfl.core.seeding import derive_seed
from splitfl.data import DatasetError, load_dataset
from splitfl.data.clients import client_partition
from splitfl.data.formats import ContainerOptions
from splitfl.data.lazy import LazyInputs
from splitfl.data.local import load_local, load_test
from splitfl.data.partition import label_histograms
from splitfl.experiment.runner import as_config, prepare
from splitfl.net.device.agent import ClientData, DeviceAgent
from splitfl.net.server.session import NoDevicesError
from splitfl.net.server.testbed import Testbed
from splitfl.net.transport.announce import (
    AnnouncementError,
    build_announcement,
    check_announcement,
    noisy_histogram,
)
from splitfl.testing import config_for

SPEC = {"input_shape": [1, 8, 8], "num_classes": 10, "own": True}
OWN = {"data.source": "devices"}


def _partition(algorithm: str, **changes):
    """The seeded partition of ``config_for(algorithm)``: (train split, client indices)."""
    config = as_config(config_for(algorithm, **changes))
    bundle = load_dataset("digits")
    return bundle, client_partition(config, bundle)


def _write_devices(folder: Path, algorithm: str, devices: int, **changes) -> dict[str, list]:
    """Each device's clients' samples (client k on device k % devices) as its own files."""
    bundle, parts = _partition(algorithm, **changes)
    out = {}
    for i in range(devices):
        name = f"local-{i}"
        out[name] = [k for k in range(len(parts)) if k % devices == i]
        (folder / name).mkdir(parents=True)
        for k in out[name]:
            x, y = bundle.train.x[parts[k]].numpy(), bundle.train.y[parts[k]].numpy()
            np.savez(folder / name / f"{k}.npz", x=x, y=y)
    return out


def _final(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "model.pt", weights_only=True)


def _max_diff(a: dict, b: dict) -> float:
    return max((a[k].double() - b[k].double()).abs().max().item() for k in a)


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _threads(tmp_path, folders: dict[str, Path], agent_cls=None, **opts):
    bed = Testbed.create(tmp_path / "bed", list(folders))
    # 60 s: a loaded machine's server may take tens of seconds to listen (a 20 s wait failed
    # CI once: one of two devices gave up first)
    retry_s = opts.pop("retry_s", 60.0)
    threads = [
        bed.device(name, [], agent_cls, data=str(path), retry_s=retry_s, **opts)
        for name, path in folders.items()
    ]
    return bed, threads


@pytest.mark.slow
def test_device_processes_with_their_own_files_equal_the_sequential_run(tmp_path, sequential_run):
    written = _write_devices(tmp_path / "data", "s2fl", 3, rounds=2)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config_for("s2fl", rounds=2)))
    cmd = [sys.executable, "-m", "splitfl", "launch", str(cfg), "--devices", "3"]
    cmd += ["--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "net")]
    code, out, seq = _launch_beside(cmd, lambda: sequential_run(config_for("s2fl", rounds=2)))
    assert code == 0, out[-2000:]
    assert _max_diff(_final(tmp_path / "net"), _final(seq.run_dir)) <= 1e-5
    net_rows, seq_rows = _rows(tmp_path / "net"), _rows(seq.run_dir)
    assert [r["test_acc"] for r in net_rows] == [r["test_acc"] for r in seq_rows]
    assert [r["groups"] for r in net_rows] == [r["groups"] for r in seq_rows]
    record = json.loads((tmp_path / "net" / "devices.json").read_text())
    hosted = {d["name"]: [c["client"] for c in d["clients"]] for d in record["devices"]}
    assert hosted == written


class _CountingDevice(DeviceAgent):
    identified: list[int] = []

    def _on_identify(self, c, msg):
        type(self).identified.append(c)
        return super()._on_identify(c, msg)


def test_ifca_identity_on_the_devices_equals_the_server_side_choice(tmp_path, sequential_run):
    written = _write_devices(tmp_path / "data", "ifca", 3, rounds=2)
    folders = {name: tmp_path / "data" / name for name in written}
    _CountingDevice.identified = []
    bed, threads = _threads(tmp_path, folders, _CountingDevice)
    net = bed.server_overrides(min_devices=3)
    result = splitfl.run(config_for("ifca", rounds=2, **OWN, **net), run_dir=tmp_path / "net")
    for t in threads:
        t.join(30)
    seq = sequential_run(config_for("ifca", rounds=2))
    assert [t.code for t in threads] == [0, 0, 0]
    net_rows, seq_rows = _rows(result.run_dir), _rows(seq.run_dir)
    assert [r["plan_clusters"] for r in net_rows] == [r["plan_clusters"] for r in seq_rows]
    assert sorted(_CountingDevice.identified) == sorted(
        c for r in net_rows for c in r["clients"]
    )  # every participant's identity was computed on its device
    assert _max_diff(_final(result.run_dir), _final(seq.run_dir)) <= 1e-6


def _entry(client=0, samples=3, hist=None):
    return {"client": client, "samples": samples, "histogram": hist or [1, 2] + [0] * 8}


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (None, "no data announcement"),
        ({"input_shape": [1, 8, 8], "clients": [_entry(samples=-3)]}, "samples must be"),
        ({"input_shape": [1, 8, 8], "clients": [_entry(samples=True)]}, "samples must be"),
        ({"input_shape": [1, 8, 8], "clients": [_entry(samples=10**12)]}, "samples must be"),
        ({"input_shape": [1, 8, 8], "clients": [_entry(hist=[-1, 4] + [0] * 8)]}, "histogram"),
        ({"input_shape": [1, 8, 8], "clients": [_entry(hist=[1.5, 2] + [0] * 8)]}, "histogram"),
        ({"input_shape": [1, 8, 8], "clients": [_entry(hist=[1] * 10**6)]}, "10 class counts"),
        ({"input_shape": [1, 8, 8], "clients": [_entry(hist=[1, 2] + [0] * 7)]}, "10 class"),
        ({"input_shape": [1, 8, 8], "clients": [_entry(hist=[3, 2] + [0] * 8)]}, "sums to 5"),
        ({"input_shape": [1, 8, 8], "clients": [_entry(client=5)]}, "not hosted"),
        ({"input_shape": [1, 8, 8], "clients": [_entry(client=False)]}, "not hosted"),
        ({"input_shape": [1, 8, 8], "clients": [_entry(), _entry()]}, "one entry per"),
        ({"input_shape": [3, 32, 32], "clients": [_entry()]}, "does not fit the model"),
        ({"input_shape": [[[1]]], "clients": [_entry()]}, "input_shape must be"),
        ({"input_shape": [1, 8, 8], "epsilon": -1, "clients": [_entry()]}, "epsilon"),
        ({"input_shape": [1, 8, 8], "clients": {"0": 3}}, "one entry per"),
    ],
)
def test_hostile_announcements_are_refused_in_one_line(data, words):
    with pytest.raises(AnnouncementError) as err:
        check_announcement(data, "d0", [0], SPEC)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_valid_announcement_is_kept_as_announced():
    data = {"input_shape": [1, 8, 8], "epsilon": 0.5, "clients": [_entry(0, 3, [7] + [0] * 9)]}
    got = check_announcement(data, "d0", [0], SPEC)
    assert got[0].samples == 3 and got[0].histogram == (7,) + (0,) * 9 and got[0].epsilon == 0.5


class _Hostile(DeviceAgent):
    def announcement(self, spec, epsilon, seed):
        out = super().announcement(spec, epsilon, seed)
        out["clients"][0]["samples"] = -5
        return out


def _refused_run(tmp_path, capfd, folders, agent_cls=None, config=OWN, **device_opts):
    """A server that no device can join (refused): the run stops, both sides log why."""
    bed, threads = _threads(tmp_path, folders, agent_cls, retry_s=3.0, **device_opts)
    net = bed.server_overrides(min_devices=1, connect_timeout_s=4.0)
    with pytest.raises(NoDevicesError, match="devices ready"):
        splitfl.run(config_for("fedavg", rounds=1, **config, **net), run_dir=tmp_path / "n")
    threads[0].join(30)
    server = [ln for ln in capfd.readouterr().err.splitlines() if "splitfl server" in ln]
    return threads[0], server


def test_hostile_device_is_refused_and_exits_2(tmp_path, capfd):
    written = _write_devices(tmp_path / "data", "fedavg", 1)
    device, server = _refused_run(tmp_path, capfd, {"d0": tmp_path / "data" / "local-0"}, _Hostile)
    assert device.code == 2
    line = "refused: data announcement: client 0: samples must be an integer in [0, 1000000000]"
    assert any(line in ln for ln in device.lines), device.lines
    assert any(f"device d0 {line}" in ln for ln in server), server
    assert written


@pytest.mark.parametrize(
    ("x_shape", "label", "config", "own", "line"),
    [
        (
            (4, 1, 4, 4),
            1,
            OWN,
            True,
            "data mismatch: client 0: input shape [1, 4, 4] does not fit the model's [1, 8, 8]",
        ),
        (
            (4, 1, 8, 8),
            10,
            OWN,
            True,
            "data mismatch: client 0: label 10 does not fit the model's 10 classes",
        ),
        (
            (4, 1, 8, 8),
            1,
            OWN,
            False,
            "the server's clients train on the devices' own data: give --data",
        ),
        (
            (4, 1, 8, 8),
            1,
            {},
            True,
            "this server partitions its own dataset (data.source: "
            "partition); start the device without --data",
        ),
    ],
    ids=["input-shape", "class-count", "no-data", "data-to-a-partition-server"],
)
def test_mismatch_is_one_line_on_both_sides(tmp_path, capfd, x_shape, label, config, own, line):
    path = tmp_path / "mine.npz"
    n = x_shape[0]
    np.savez(path, x=np.zeros(x_shape, np.float32), y=np.full(n, label), client=np.zeros(n, int))
    folders = {"d0": path if own else ""}
    device, server = _refused_run(tmp_path, capfd, folders, config=config)
    assert device.code == 2
    assert any(line in ln for ln in device.lines), device.lines
    assert any(f"device d0 refused: {line}" in ln for ln in server), server


def test_histogram_noise_is_deterministic_per_seed_and_clamped():
    hist = np.array([50, 0, 3, 0, 0, 120, 1, 0, 0, 9])
    a, b = noisy_histogram(hist, 0.5, 7), noisy_histogram(hist, 0.5, 7)
    assert np.array_equal(a, b) and a.dtype == np.int64
    assert not np.array_equal(a, noisy_histogram(hist, 0.5, 8))
    rng = np.random.default_rng(7)  # Laplace(1/ε) per count, rounded, clamped at 0
    want = np.maximum(np.rint(hist + rng.laplace(0.0, 2.0, size=10)), 0)
    assert np.array_equal(a, want)
    strong = noisy_histogram(np.zeros(1000, np.int64), 0.1, 1)
    assert strong.min() == 0 and (strong == 0).sum() > 400  # negative draws clamped
    assert np.array_equal(noisy_histogram(hist, 1e6, 3), hist)  # ε → ∞: exact
    x, y = torch.zeros(4, 1, 8, 8), torch.tensor([0, 0, 5, 9])
    one = build_announcement({2: (x, y)}, SPEC, 0.5, seed=11)
    assert one == build_announcement({2: (x, y)}, SPEC, 0.5, seed=11)
    exact = np.bincount(y.numpy(), minlength=10)
    noisy = noisy_histogram(exact, 0.5, derive_seed(11, "histogram-noise", 2))
    assert one["clients"][0] == {"client": 2, "samples": 4, "histogram": noisy.tolist()}


def test_run_directory_records_devices_clients_counts_and_histograms(tmp_path):
    written = _write_devices(tmp_path / "data", "fedavg", 2, rounds=1)
    folders = {name: tmp_path / "data" / name for name in written}
    bed, threads = _threads(tmp_path, folders, histogram_epsilon=1.0, noise_seed=5)
    net = bed.server_overrides(min_devices=2)
    result = splitfl.run(config_for("fedavg", rounds=1, **OWN, **net), run_dir=tmp_path / "net")
    for t in threads:
        t.join(30)
    bundle, parts = _partition("fedavg", rounds=1)
    exact = label_histograms(bundle.train.y.numpy(), parts, 10)
    record = json.loads((result.run_dir / "devices.json").read_text())
    clients = json.loads((result.run_dir / "clients.json").read_text())["clients"]
    assert [d["name"] for d in record["devices"]] == ["local-0", "local-1"]
    for device in record["devices"]:
        assert [c["client"] for c in device["clients"]] == written[device["name"]]
        for c in device["clients"]:
            k = c["client"]
            assert c["samples"] == len(parts[k]) == clients[k]["samples"]
            noisy = noisy_histogram(exact[k], 1.0, derive_seed(5, "histogram-noise", k))
            assert c["label_histogram"] == noisy.tolist() == clients[k]["label_histogram"]
            assert c["histogram_epsilon"] == 1.0


def test_server_holds_only_a_test_set(tmp_path):
    bundle = load_dataset("digits")
    path = tmp_path / "test.npz"
    np.savez(path, x=bundle.test.x[:50].numpy(), y=bundle.test.y[:50].numpy(), num_classes=10)
    changes = {**OWN, "executor": "networked", "data.test_path": str(path)}
    ctx = prepare(as_config(config_for("s2fl", **changes))).ctx
    assert len(ctx.bundle.train) == 0 and len(ctx.bundle.test) == 50
    assert torch.equal(ctx.bundle.test.x, bundle.test.x[:50]) and ctx.bundle.num_classes == 10
    assert ctx.data_sizes.tolist() == [0] * 12  # until the devices announce theirs
    with pytest.raises(ConfigError, match="data.source: devices needs executor: networked"):
        as_config(config_for("s2fl", **OWN))


def test_local_data_layouts(tmp_path):
    x, y = np.random.default_rng(0).random((6, 1, 8, 8)), np.array([0, 1, 2, 3, 4, 5])
    np.savez(tmp_path / "one.npz", x=x, y=y)
    np.savez(tmp_path / "many.npz", x=x, y=y, client=np.array([4, 2, 4, 2, 4, 9]))
    (tmp_path / "folder").mkdir()
    np.savez(tmp_path / "folder" / "7.npz", x=x[:2], y=y[:2])
    np.savez(tmp_path / "folder" / "3.npz", x=x[2:], y=y[2:])
    one = load_local(tmp_path / "one.npz")
    assert list(one) == [None] and torch.equal(one[None][1], torch.as_tensor(y))
    many = load_local(tmp_path / "many.npz")
    assert sorted(many) == [2, 4, 9] and many[4][1].tolist() == [0, 2, 4]
    assert torch.equal(many[2][0], torch.as_tensor(x[[1, 3]], dtype=torch.float32))
    folder = load_local(tmp_path / "folder")
    assert sorted(folder) == [3, 7] and folder[3][1].tolist() == [2, 3, 4, 5]
    np.savez(tmp_path / "bad.npz", x=x, y=y[:3])
    for bad, words in [
        ("bad.npz", "bad.npz: holds 3 labels for 6 samples"),
        ("none.npz", "no such file"),
    ]:
        with pytest.raises(DatasetError, match=words) as err:
            load_local(tmp_path / bad)
        assert "\n" not in str(err.value)
    assert load_test(tmp_path / "one.npz")[2] == 6


def _resume_with(tmp_path, run_dir: Path, folders: dict[str, Path], tag: str):
    bed, threads = _threads(tmp_path / tag, folders, retry_s=3.0)
    flags = [f"network.listen=127.0.0.1:{bed.port}", f"network.tokens={bed.tokens_file}"]
    try:
        return splitfl.resume(run_dir, overrides=flags)
    finally:
        for t in threads:
            t.join(30)


def test_resumed_run_keeps_the_view_it_started_with(tmp_path, sequential_run):
    written = _write_devices(tmp_path / "data", "s2fl", 2, rounds=1)
    folders = {name: tmp_path / "data" / name for name in written}
    bed, threads = _threads(tmp_path / "a", folders)
    net = bed.server_overrides(min_devices=2)
    first = splitfl.run(config_for("s2fl", rounds=1, **OWN, **net), run_dir=tmp_path / "net")
    for t in threads:
        t.join(30)
    config = yaml.safe_load((first.run_dir / "config.yaml").read_text())
    config["rounds"] = 2
    (first.run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    resumed = _resume_with(tmp_path, first.run_dir, folders, "b")
    seq = sequential_run(config_for("s2fl", rounds=2))
    assert _max_diff(_final(resumed.run_dir), _final(seq.run_dir)) <= 1e-5
    # a device whose client 0 lost a sample since: refused in one line, naming the client
    x, y = load_local(folders["local-0"] / "0.npz")[None]
    np.savez(folders["local-0"] / "0.npz", x=x[1:].numpy(), y=y[1:].numpy())
    config["rounds"] = 3
    (first.run_dir / "config.yaml").write_text(yaml.safe_dump(config))
    with pytest.raises(ConfigError, match=f"client 0's device announced {len(y) - 1} samples"):
        _resume_with(tmp_path, first.run_dir, folders, "c")


def test_device_flags_for_own_data(tmp_path):
    from splitfl.net.device import cli as device_cli

    token = tmp_path / "t.token"
    token.write_text("x" * 32)
    base = ["--server", "127.0.0.1:1", "--name", "d0", "--token-file", str(token)]
    args = device_cli.build_parser().parse_args(
        [*base, "--data", "mine", "--histogram-epsilon", "0.5", "--noise-seed", "9"]
    )
    opts = device_cli.options_from(args)
    assert (opts.data, opts.data_format, opts.histogram_epsilon, opts.noise_seed) == (
        "mine",
        "npz",
        0.5,
        9,
    )
    with pytest.raises(ValueError, match="--histogram-epsilon: must be in"):
        device_cli.options_from(
            device_cli.build_parser().parse_args([*base, "--histogram-epsilon", "0"])
        )


# --- own data in every container format (the readers of data.format) -----------------------

CROP_FLIP = [{"random_crop": 2}, "hflip", {"normalize": {"mean": [0.5], "std": [0.5]}}]


def _client_data(clients: int = 4, per_class: int = 3):
    """Digits samples by client: client k gets ``per_class`` samples of every class."""
    bundle = load_dataset("digits")
    y = bundle.train.y.numpy()
    by_class = [np.flatnonzero(y == c) for c in range(10)]
    out = []
    for k in range(clients):
        idx = np.concatenate([ix[k * per_class : (k + 1) * per_class] for ix in by_class])
        out.append((bundle.train.x[idx].numpy(), y[idx]))
    test = (bundle.test.x[:40].numpy(), bundle.test.y[:40].numpy())
    return out, test


def _png_tree(folder: Path, data: tuple[np.ndarray, np.ndarray]) -> None:
    """``folder/<class>/<i>.png``: the samples ``data`` (digits in [-1, 1]) as 8x8 gray PNGs."""
    from PIL import Image

    x, y = data
    for i in range(len(y)):
        (folder / str(y[i])).mkdir(parents=True, exist_ok=True)
        pixels = np.round((x[i, 0] + 1.0) * 127.5).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(folder / str(y[i]) / f"{i:03d}.png")


def _csv_file(path: Path, data: tuple[np.ndarray, np.ndarray]) -> None:
    x, y = data
    rows = ["label," + ",".join(f"f{j}" for j in range(64))]
    rows += [f"{y[i]}," + ",".join(f"{v:.4f}" for v in x[i].reshape(-1)) for i in range(len(y))]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(rows) + "\n")


def _own_containers(tmp_path: Path, fmt: str) -> tuple[Path, dict[str, Path]]:
    """The same clients as a ``folders`` container (the simulation's root) and as two
    devices' own folders (client k on device k % 2), in ``fmt`` (image_folder or csv)."""
    clients, test = _client_data()
    root = tmp_path / "root"
    devices = {f"local-{i}": tmp_path / f"local-{i}" for i in range(2)}
    for k, data in enumerate(clients):
        for base in (root, devices[f"local-{k % 2}"]):
            if fmt == "image_folder":
                _png_tree(base / "clients" / str(k), data)
            else:
                _csv_file(base / "clients" / f"{k}.csv", data)
    if fmt == "image_folder":
        _png_tree(root / "test", test)
    else:
        _csv_file(root / "test.csv", test)
    return root, devices


def _own_equals_sequential(
    tmp_path, fmt: str, model: str, transforms: list, test_path: str, **changes
):
    root, devices = _own_containers(tmp_path, fmt)
    data = {"data.format": fmt, "data.root": str(root), "data.partition": "folders", **changes}
    data.update({"data.dataset": "mine", "data.num_clients": 4, "data.transforms": transforms})
    common = {"rounds": 2, "model": model, "train.clients_per_round": 4, **data}
    bed, threads = _threads(tmp_path / "bed", devices, data_format=fmt)
    net = bed.server_overrides(min_devices=2)
    test = {"data.test_path": str(root / test_path)}
    own = config_for("s2fl", **common, **OWN, **net, **test)
    try:
        result = splitfl.run(own, run_dir=tmp_path / "net")
    finally:
        for t in threads:
            t.join(30)
    seq = splitfl.run(config_for("s2fl", **common), run_dir=tmp_path / "seq")
    assert _max_diff(_final(result.run_dir), _final(seq.run_dir)) <= 1e-5
    net_rows, seq_rows = _rows(result.run_dir), _rows(seq.run_dir)
    assert [r["test_acc"] for r in net_rows] == [r["test_acc"] for r in seq_rows]
    assert [r["train_loss_mean"] for r in net_rows] == pytest.approx(  # the mean, aside
        [r["train_loss"] for r in seq_rows], abs=1e-5
    )
    record = json.loads((result.run_dir / "devices.json").read_text())
    hosted = {d["name"]: [c["client"] for c in d["clients"]] for d in record["devices"]}
    assert hosted == {"local-0": [0, 2], "local-1": [1, 3]}


@pytest.mark.parametrize(
    "transforms, lazy", [([], None), (CROP_FLIP, True)], ids=["plain", "crop-flip-normalize-lazy"]
)
def test_own_image_folders_equal_the_sequential_run(tmp_path, transforms, lazy):
    """Two devices reading PNG folders (``clients/<id>/<class>/``), with the server's
    ``data.transforms`` (normalize at read, random crop + flip per batch) as the simulation;
    lazy (``data.lazy: true``): the devices decode images per batch."""
    _own_equals_sequential(
        tmp_path, "image_folder", "cnn_digits", transforms, "", **{"data.lazy": lazy}
    )


def test_own_csv_files_equal_the_sequential_run(tmp_path):
    _own_equals_sequential(tmp_path, "csv", "mlp", [], "test.csv")


def test_own_data_layouts_of_every_container(tmp_path):
    clients, test = _client_data(clients=2, per_class=1)
    x, y = clients[0]
    _png_tree(tmp_path / "img" / "train", clients[0])
    _csv_file(tmp_path / "one.csv", clients[0])
    np.save(tmp_path / "x_train.npy", x)
    np.save(tmp_path / "y_train.npy", y)
    (tmp_path / "npz" / "clients").mkdir(parents=True)
    for k, (xk, yk) in enumerate(clients):
        np.savez(tmp_path / "npz" / "clients" / f"{k + 5}.npz", x=xk, y=yk)
    np.savez(tmp_path / "npz" / "train.npz", x=x, y=y)  # ignored: clients/ wins
    lazy = ContainerOptions(lazy=True)
    img = load_local(tmp_path / "img", "image_folder", lazy)[None]
    assert isinstance(img[0], LazyInputs) and img[1].tolist() == sorted(y.tolist())
    for data in (load_local(tmp_path / "one.csv", "csv"), load_local(tmp_path, "npy")):
        assert torch.allclose(data[None][0].reshape(len(y), -1), torch.as_tensor(x).flatten(1))
        assert data[None][1].tolist() == y.tolist()
    many = load_local(tmp_path / "npz", "npz")
    assert sorted(many) == [5, 6] and torch.equal(many[6][1], torch.as_tensor(clients[1][1]))
    _png_tree(tmp_path / "test" / "test", test)
    tx, ty, classes = load_test(tmp_path / "test", "image_folder")
    assert classes == 10 and len(ty) == 40 and tuple(tx.shape[1:]) == (1, 8, 8)


def test_bad_own_data_is_one_line_naming_the_file(tmp_path):
    _csv_file(tmp_path / "a" / "clients" / "0.csv", _client_data(1, 1)[0][0])
    bad = tmp_path / "a" / "clients" / "1.csv"
    bad.write_text("label,f0\n1,zz\n")
    (tmp_path / "b" / "3").mkdir(parents=True)
    (tmp_path / "b" / "3" / "x.png").write_bytes(b"not a png")
    (tmp_path / "c" / "clients" / "alice").mkdir(parents=True)
    cases = [
        ("a", "csv", f"{bad}: line 2"),
        ("b", "image_folder", str(tmp_path / "b" / "3" / "x.png")),
        ("c", "image_folder", "entries not named by client id"),
        ("a", "tfrecord", "--format: 'tfrecord' is not one of"),
    ]
    for path, fmt, words in cases:
        with pytest.raises(DatasetError) as err:
            load_local(tmp_path / path, fmt, ContainerOptions(lazy=False))
        assert words in str(err.value) and "\n" not in str(err.value)


def test_write_partition_writes_the_stored_inputs(tmp_path):
    from splitfl.data.clients import write_partition

    changes = {
        "data.transforms": CROP_FLIP[2:],
        "data.num_clients": 4,
        "train.clients_per_round": 4,
    }
    config = as_config(config_for("s2fl", **changes))
    written = write_partition(config, tmp_path, 2)
    bundle, parts = _partition("s2fl", **changes)
    assert written == {"local-0": [0, 2], "local-1": [1, 3]}
    got = load_local(tmp_path / "local-1")
    assert torch.equal(got[3][0], bundle.train.x[parts[3]])  # normalised by the device


def test_device_accepts_every_container_format(tmp_path):
    from splitfl.net.device import cli as device_cli

    token = tmp_path / "t.token"
    token.write_text("x" * 32)
    base = ["--server", "127.0.0.1:1", "--name", "d0", "--token-file", str(token)]
    for fmt in ("image_folder", "npz", "npy", "csv", "hf", "parquet"):
        args = device_cli.build_parser().parse_args([*base, "--data", "m", "--format", fmt])
        assert device_cli.options_from(args).data_format == fmt


def test_own_npz_with_crop_pads_with_the_datasets_black(tmp_path):
    """Digits are stored normalised (black = -1): an own-data device pads its crops with the
    server dataset's black (sent in the welcome), as the simulation does."""
    changes = {"rounds": 2, "data.transforms": [{"random_crop": 2}, "hflip"]}
    written = _write_devices(tmp_path / "data", "s2fl", 2, **changes)
    bed, threads = _threads(tmp_path, {name: tmp_path / "data" / name for name in written})
    net = bed.server_overrides(min_devices=2)
    try:
        own = splitfl.run(config_for("s2fl", **changes, **OWN, **net), run_dir=tmp_path / "net")
    finally:
        for t in threads:
            t.join(30)
    seq = splitfl.run(config_for("s2fl", **changes), run_dir=tmp_path / "seq")
    assert _max_diff(_final(own.run_dir), _final(seq.run_dir)) <= 1e-5


def test_lazy_own_data_stays_lazy_on_the_device(tmp_path):
    _png_tree(tmp_path / "mine", _client_data(1, 2)[0][0])
    local = load_local(tmp_path / "mine", "image_folder", ContainerOptions(lazy=True))
    d = as_config(config_for("s2fl", **{"data.transforms": CROP_FLIP})).data
    data = ClientData.from_local(local, [4], {**SPEC, "black": None}, d)
    x, y, _ = data.samples[4]
    assert isinstance(x, LazyInputs) and len(y) == 20
    raw = load_local(tmp_path / "mine", "image_folder", ContainerOptions(lazy=False))[None][0]
    assert torch.allclose(x[torch.tensor([3, 0])], (raw[[3, 0]] - 0.5) / 0.5)


@pytest.mark.slow
def test_launch_data_dir_of_image_folders_equals_the_sequential_run(tmp_path):
    """``splitfl launch --data-dir``: device processes read ``local-<i>/clients/<id>/`` in
    ``data.format`` (here image folders) and reproduce the sequential run."""
    root, _ = _own_containers(tmp_path, "image_folder")
    data = {"data.format": "image_folder", "data.root": str(root), "data.partition": "folders"}
    common = {"rounds": 2, "train.clients_per_round": 4, "data.num_clients": 4, **data}
    config = config_for("s2fl", **common, **{"data.dataset": "mine"})
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump(config))
    cmd = [sys.executable, "-m", "splitfl", "launch", str(cfg), "--devices", "2"]
    cmd += ["--data-dir", str(tmp_path), "--out", str(tmp_path / "net")]
    code, out, seq = _launch_beside(cmd, lambda: splitfl.run(config, run_dir=tmp_path / "seq"))
    assert code == 0, out[-2000:]
    assert _max_diff(_final(tmp_path / "net"), _final(seq.run_dir)) <= 1e-5


def _launch_beside(cmd: list[str], reference):
    """Run ``cmd`` (a launch) while ``reference()`` (the sequential run) runs in this process;
    (exit code, output, reference's result)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        seq = reference()
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
    return proc.returncode, out.decode(), seq

"""Datasets the user brings: on-disk containers (``data.format``), torch / Hugging Face
objects (``bundle_from``), lazy inputs, ``data.transforms``, the ``folders`` partition."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

from conftest import tiny_config
from fixtures_data import _png, image_folder, write_images
from splitfl.cli.main import main
from splitfl.config import ConfigError, DataConfig
from splitfl.core.seeding import derive_seed, rng_for
from splitfl.data.base import (
    ArrayDataset,
    DatasetBundle,
    DatasetError,
    load_dataset,
    register_dataset,
)
from splitfl.data.clients import client_partition
from splitfl.data.convert import bundle_from
from splitfl.data.lazy import LazyInputs
from splitfl.data.source import from_object, read_dataset
from splitfl.data.transforms import augment_batch, parse_transforms
from splitfl.executors import SequentialExecutor
from splitfl.executors.vectorized import VectorizedExecutor
from splitfl.experiment.runner import as_config, prepare

datasets = pytest.importorskip("datasets")


# -- fixtures: tiny containers written in tmp dirs ----------------------------------------------
def write_csv(path, rows: list[list], header: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as fh:
        csv.writer(fh).writerows([header, *rows])


def csv_rows(n: int, seed: int, labels=("no", "yes")) -> list[list]:
    rng = np.random.default_rng(seed)
    return [[*np.round(rng.normal(size=3), 4), labels[i % len(labels)]] for i in range(n)]


def data(root, fmt: str, **kw) -> DataConfig:
    return DataConfig(dataset="mine", format=fmt, root=str(root), **kw)


# -- containers -----------------------------------------------------------------------------------
def test_image_folder_reads_pixels_with_classes_sorted_by_folder_name(tmp_path):
    written = image_folder(tmp_path)
    b = read_dataset(data(tmp_path, "image_folder"))
    assert (b.num_classes, b.input_shape) == (2, (3, 6, 6))
    assert b.train.y.tolist() == [0] * 6 + [1] * 6  # cat < dog
    first_cat = torch.from_numpy(written["cat"][0].transpose(2, 0, 1).astype(np.float32) / 255)
    assert torch.equal(b.train.x[0], first_cat)
    assert b.train.x.dtype == torch.float32 and len(b.test) == 4


def test_image_folder_grayscale_resize_and_lazy_equals_eager(tmp_path):
    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("test", 1)):
        for c in ("a", "b"):
            for i in range(n):
                size = (5 + i, 7)  # differing sizes: image_size resizes them
                _png(tmp_path / split / c / f"{i}.png", rng.integers(0, 256, size, np.uint8))
    eager = read_dataset(data(tmp_path, "image_folder", image_size=[4, 4], lazy=False))
    lazy = read_dataset(data(tmp_path, "image_folder", image_size=[4, 4], lazy=True))
    assert eager.input_shape == (1, 4, 4) and isinstance(lazy.train.x, LazyInputs)
    assert torch.equal(lazy.train.x[torch.arange(6)], eager.train.x)
    with pytest.raises(DatasetError, match=r"1\.png: is 7x6, the first image 7x5"):
        read_dataset(data(tmp_path, "image_folder", lazy=False))


def test_npz_folder_and_single_file_with_int32_labels(tmp_path):
    rng = np.random.default_rng(0)
    x, y = rng.integers(0, 256, (10, 1, 4, 4), dtype=np.uint8), np.arange(10, dtype=np.int32) % 3
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "test.npz", x=x[:4], y=y[:4])
    b = read_dataset(data(tmp_path, "npz"))
    assert b.train.y.dtype == torch.int64 and b.num_classes == 3
    assert torch.equal(b.train.x, torch.from_numpy(x.astype(np.float32) / 255))
    one = tmp_path / "all.npz"
    xf = rng.normal(size=(10, 5)).astype(np.float64)
    np.savez(one, x_train=xf, y_train=y, x_test=xf[:3], y_test=y[:3].astype(np.uint8))
    b = read_dataset(data(one, "npz"))
    assert b.input_shape == (5,) and torch.equal(b.train.x, torch.from_numpy(xf).float())


def test_npy_is_memory_mapped_and_lazy_reads_match(tmp_path):
    x = np.random.default_rng(0).normal(size=(12, 2, 3)).astype(np.float32)
    for split, n in (("train", 12), ("test", 4)):
        np.save(tmp_path / f"x_{split}.npy", x[:n])
        np.save(tmp_path / f"y_{split}.npy", np.arange(n, dtype=np.int16) % 2)
    b = read_dataset(data(tmp_path, "npy", lazy=True))
    assert isinstance(b.train.x, LazyInputs) and b.train.x.shape == (12, 2, 3)
    idx = torch.tensor([[7, 1], [3, 7]])
    assert torch.equal(b.train.x[idx], torch.from_numpy(x)[idx])
    assert torch.equal(b.train.x[:5], torch.from_numpy(x[:5]))


def test_csv_features_and_label_column_by_name(tmp_path):
    header = ["f1", "f2", "f3", "target"]
    write_csv(tmp_path / "train.csv", csv_rows(8, 0), header)
    write_csv(tmp_path / "test.csv", csv_rows(4, 1), header)
    b = read_dataset(data(tmp_path, "csv", label_column="target"))
    assert (b.input_shape, b.num_classes) == ((3,), 2)
    assert b.train.y.tolist() == [0, 1] * 4  # "no" < "yes"
    rows = csv_rows(8, 0)
    assert torch.equal(b.train.x[1], torch.tensor([float(v) for v in rows[1][:3]]))
    with pytest.raises(DatasetError, match="has no column 'label'"):
        read_dataset(data(tmp_path, "csv"))


def _hf_images(n: int, seed: int):
    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 256, (4, 4, 3), dtype=np.uint8)) for _ in range(n)]
    features = datasets.Features(
        {"image": datasets.Image(), "label": datasets.ClassLabel(names=["a", "b", "c"])}
    )
    labels = [i % 2 for i in range(n)]
    return datasets.Dataset.from_dict({"image": images, "label": labels}, features=features)


def test_hf_save_to_disk_and_parquet(tmp_path):
    dd = datasets.DatasetDict(train=_hf_images(6, 0), test=_hf_images(2, 1))
    dd.save_to_disk(str(tmp_path / "hf"))
    b = read_dataset(data(tmp_path / "hf", "hf"))
    assert (b.input_shape, b.num_classes) == ((3, 4, 4), 3)  # ClassLabel names 3 classes
    pixels = np.asarray(dd["train"][2]["image"]).transpose(2, 0, 1) / 255
    assert torch.allclose(b.train.x[2], torch.from_numpy(pixels).float())
    table = {"u": [0.5, 1.5, 2.5, 3.5], "v": [1.0, 0.0, 1.0, 0.0], "label": [1, 0, 1, 0]}
    for split in ("train", "test"):
        datasets.Dataset.from_dict(table).to_parquet(str(tmp_path / "pq" / f"{split}.parquet"))
    b = read_dataset(data(tmp_path / "pq", "parquet"))
    assert b.input_shape == (2,) and torch.equal(b.train.x[0], torch.tensor([0.5, 1.0]))


# -- Python objects ---------------------------------------------------------------------------
class Counting(torch.utils.data.Dataset):
    """A map-style dataset that records which samples were read."""

    def __init__(self, n: int, seed: int, targets: bool = True):
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 1, 8, 8, generator=gen)
        self.y = torch.arange(n) % 10
        if targets:
            self.targets, self.input_shape = self.y.to(torch.int32), (1, 8, 8)
        self.reads: list[int] = []

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        self.reads.append(int(i))
        return self.x[i], int(self.y[i])


HELD: dict[str, Counting] = {}


def _counting(lazy: bool):
    def load(root=None) -> DatasetBundle:
        HELD["train"], HELD["test"] = Counting(200, 0), Counting(40, 1)
        return bundle_from((HELD["train"], HELD["test"]), "counting", lazy=lazy)

    return load


register_dataset("test_counting_lazy", "lazy torch Datasets", False)(_counting(True))
register_dataset("test_counting_eager", "eager torch Datasets", False)(_counting(False))


def test_torch_dataset_pair_infers_shape_and_classes():
    b = bundle_from((Counting(30, 0, targets=False), Counting(10, 1, targets=False)), "t")
    assert (b.input_shape, b.num_classes) == ((1, 8, 8), 10)
    assert torch.equal(b.train.x, Counting(30, 0).x) and b.train.y.dtype == torch.int64
    with pytest.raises(DatasetError, match="expected a DatasetBundle"):
        bundle_from(42, "t")
    dd = datasets.DatasetDict(train=_hf_images(4, 0), test=_hf_images(2, 1))
    d = DataConfig(dataset="hf_obj", lazy=True, transforms=[{"normalize": {"mean": 0, "std": 2}}])
    b = from_object(dd, d)
    assert isinstance(b.train.x, LazyInputs) and b.input_shape == (3, 4, 4)
    pixels = np.asarray(dd["train"][1]["image"]).transpose(2, 0, 1) / 255 / 2
    assert torch.allclose(b.train.x[1], torch.from_numpy(pixels).float())


def test_int32_labels_from_a_registered_loader_are_cast():
    """Old code: ``<name>: files in None: train split labels must be int64``."""

    @register_dataset("test_int32_labels", "int32 labels", False)
    def load(root=None) -> DatasetBundle:
        x, y = torch.randn(20, 4), (torch.arange(20) % 2).to(torch.int32)
        return DatasetBundle("i32", ArrayDataset(x, y), ArrayDataset(x, y), 2, (4,))

    assert load_dataset("test_int32_labels").train.y.dtype == torch.int64

    @register_dataset("test_float_labels", "float labels", False)
    def bad(root=None) -> DatasetBundle:  # float targets (regression) must at least be finite
        x, y = torch.randn(20, 4), (torch.arange(20) % 2).float()
        y[3] = float("nan")
        return DatasetBundle("f", ArrayDataset(x, y), ArrayDataset(x, y), 2, (4,))

    with pytest.raises(DatasetError, match=r"test_float_labels: loader .*\.bad: train split"):
        load_dataset("test_float_labels")


# -- lazy data ------------------------------------------------------------------------------------
def _lazy_config(dataset: str, **changes):
    return as_config(
        tiny_config(
            model="mlp",
            **{"data.dataset": dataset, "data.partition": "iid", "data.num_clients": 6},
            **changes,
        )
    )


def test_a_device_reads_only_its_own_clients_samples():
    from splitfl.net.device.agent import ClientData

    cfg = _lazy_config("test_counting_lazy")
    data = ClientData(cfg, [2, 4], None)
    reads = HELD["train"].reads
    parts = client_partition(cfg, load_dataset("test_counting_lazy"))
    assert sorted(reads) == sorted([*parts[2], *parts[4]])  # each once, nobody else's
    assert torch.equal(data.samples[2][0], HELD["train"].x[parts[2]])


@pytest.mark.parametrize("vectorized", [False, True], ids=["sequential", "vectorized-rows"])
def test_lazy_round_reads_participants_only_and_equals_eager(vectorized):
    """Two rounds (different participants) on one executor: lazy inputs give the eager
    updates, and a round reads its participants' samples only."""
    updates = {}
    for kind in ("eager", "lazy"):
        changes = {"train.clients_per_round": 2, "train.local_steps": 2}
        cfg = _lazy_config(f"test_counting_{kind}", **changes)
        prep = prepare(cfg)
        ctx, alg = prep.ctx, prep.algorithm
        ex = VectorizedExecutor(use_vmap=False) if vectorized else SequentialExecutor()
        state = ctx.model.state_dict()
        for r in range(2):
            HELD["train"].reads.clear()
            clients = alg.select_clients(r, rng_for(3, "select", r))
            plan = alg.plan_round(r, clients, rng_for(3, "p", r))
            torch.manual_seed(r)
            result = ex.run_round(ctx, state, plan, derive_seed(3, "b", r))
            updates[kind, r] = result.updates
            own = np.concatenate([ctx.client_indices[t.client] for t in plan.tasks])
            assert kind == "eager" or set(HELD["train"].reads) <= set(own.tolist())
            state = alg.aggregate(state, plan, result)
    for r in range(2):
        for u, v in zip(updates["eager", r], updates["lazy", r], strict=True):
            assert u.client == v.client
            assert all(torch.equal(u.state[k], v.state[k]) for k in u.state)


# -- transforms -------------------------------------------------------------------------------
def test_transforms_parse_and_one_line_errors():
    t = parse_transforms([{"random_crop": 4}, "hflip", {"normalize": {"mean": [0.5], "std": [2]}}])
    assert t.augment == (("random_crop", 4.0), ("hflip", 0.5)) and t.pad_value == (-0.25,)
    assert (
        parse_transforms([{"normalize": {"mean": 0.5, "std": 2}}, {"random_crop": 1}]).pad_value
        is None
    )
    for bad, message in [
        (["rotate"], "unknown transform 'rotate'"),
        ([{"random_crop": -1}], "random_crop: expected an integer"),
        ([{"normalize": {"mean": [0]}}], "normalize: give it once"),
    ]:
        cfg = tiny_config(**{"data.transforms": bad})
        with pytest.raises(ConfigError, match=f"data.transforms: {message}"):
            prepare(as_config(cfg))


def test_random_crop_and_flip_are_windows_of_the_padded_batch():
    x = torch.arange(4 * 2 * 3 * 3, dtype=torch.float32).view(4, 2, 3, 3)
    t = parse_transforms([{"random_crop": 1}, {"hflip": 1.0}])
    out = augment_batch(t, x, seed=5)
    assert torch.equal(out, augment_batch(t, x, seed=5))  # same seed, same batch
    gen = torch.Generator().manual_seed(5)
    off = torch.randint(0, 3, (2, 4), generator=gen)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    for n in range(4):
        oy, ox = int(off[0, n]), int(off[1, n])
        assert torch.equal(out[n], padded[n, :, oy : oy + 3, ox : ox + 3].flip(-1))
    # normalize after the crop: padding holds the normalised value of 0 (torchvision's order)
    t = parse_transforms([{"random_crop": 3}, {"normalize": {"mean": 0.5, "std": 0.25}}])
    assert set(augment_batch(t, torch.ones(1, 1, 2, 2), 0).unique().tolist()) <= {1.0, -2.0}


def test_crops_of_a_normalised_builtin_pad_with_its_black():
    """digits stores (v/16 - 0.5)/0.5, so black is -1; torchvision pads black before
    normalising, and so must a crop of the stored, normalised inputs."""
    ctx = prepare(as_config(tiny_config(**{"data.transforms": [{"random_crop": 3}]}))).ctx
    assert ctx.bundle.black == (-1.0,) and ctx.augment.pad_value == (-1.0,)
    out = augment_batch(ctx.augment, torch.full((8, 1, 2, 2), 7.0), seed=1)
    assert set(out.unique().tolist()) == {-1.0, 7.0}


@pytest.mark.parametrize("use_vmap", [True, False], ids=["vmap", "rows"])
def test_sequential_equals_vectorized_with_transforms(use_vmap):
    tf = [{"random_crop": 2}, "hflip"]
    fast = {"train.lr": 0.01, "train.local_steps": 2, "train.clients_per_round": 3}
    cfg = as_config(tiny_config(**{"data.transforms": tf, **fast}))
    prep = prepare(cfg, dtype=torch.float64)
    ctx, alg = prep.ctx, prep.algorithm
    plan = alg.plan_round(0, alg.select_clients(0, rng_for(3, "select", 0)), rng_for(3, "p"))
    state, seed = ctx.model.state_dict(), derive_seed(3, "b", 0)
    results = []
    for ex in (SequentialExecutor(), VectorizedExecutor(use_vmap=use_vmap)):
        torch.manual_seed(0)
        results.append(ex.run_round(ctx, state, plan, seed))
    plain = prepare(as_config(tiny_config(**fast)), dtype=torch.float64)
    torch.manual_seed(0)
    untransformed = SequentialExecutor().run_round(plain.ctx, state, plan, seed)
    for u, v, w in zip(*(r.updates for r in (*results, untransformed)), strict=True):
        assert u.loss_sum == pytest.approx(v.loss_sum, rel=1e-9) and u.loss_sum != w.loss_sum
        assert all(torch.allclose(u.state[k], v.state[k], atol=1e-9) for k in u.state)


# -- folders partition --------------------------------------------------------------------------
def test_folders_partition_gives_each_client_folder_to_one_client(tmp_path):
    sizes = {"0": 3, "1": 5, "10": 4, "2": 2}  # ids in numeric order: 0, 1, 2, 10
    for i, (cid, n) in enumerate(sizes.items()):
        write_images(tmp_path / "clients" / cid, {"a": n, "b": 1}, seed=i)
    write_images(tmp_path / "test", {"a": 1, "b": 1})
    changes = {
        "data.format": "image_folder",
        "data.dataset": "mine",
        "data.root": str(tmp_path),
        "data.partition": "folders",
        "data.num_clients": 4,
        "data.min_samples": 1,
        "train.clients_per_round": 2,
    }
    cfg = as_config(tiny_config(model="mlp", **changes))
    parts = client_partition(cfg, read_dataset(cfg.data))
    assert [len(p) for p in parts] == [4, 6, 3, 5]
    cfg = as_config(tiny_config(model="mlp", **{**changes, "data.num_clients": 3}))
    with pytest.raises(ConfigError, match="4 client folders but num_clients is 3"):
        prepare(cfg)


def test_folders_partition_from_client_csv_files(tmp_path):
    header = ["a", "b", "c", "label"]
    for cid, n in (("x", 3), ("y", 4)):
        write_csv(tmp_path / "clients" / f"{cid}.csv", csv_rows(n, 0, ("0", "1")), header)
    write_csv(tmp_path / "test.csv", csv_rows(2, 1, ("0", "1")), header)
    cfg = data(tmp_path, "csv", partition="folders", num_clients=2, min_samples=1)
    b = read_dataset(cfg)
    assert b.train.writers.tolist() == [0, 0, 0, 1, 1, 1, 1]


# -- one-line errors ----------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["image_folder", "npz", "npy", "csv", "parquet"])
def test_a_corrupt_file_is_one_line_naming_it(fmt, tmp_path):
    bad = {
        "image_folder": tmp_path / "train" / "a" / "001.png",
        "npz": tmp_path / "train.npz",
        "npy": tmp_path / "x_train.npy",
        "csv": tmp_path / "train.csv",
        "parquet": tmp_path / "train.parquet",
    }[fmt]
    if fmt == "image_folder":
        image_folder(tmp_path)
        write_images(tmp_path / "train", {"a": 1})
    for name in ("test.npz", "x_test.npy", "y_test.npy", "y_train.npy", "test.csv", "test.parquet"):
        (tmp_path / name).write_bytes(b"x")
    bad.write_bytes(b"\x89PNG\r\n\x1a\n garbage, not the file it claims to be")
    with pytest.raises(DatasetError) as err:
        read_dataset(data(tmp_path, fmt, lazy=False))
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


# -- end to end ---------------------------------------------------------------------------------
def _run_cli(tmp_path, capsys, command: str, **changes) -> tuple[int, str]:
    cfg = tiny_config(model="mlp", rounds=2, **changes)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    args = [command, str(path)] + (
        ["--out", str(tmp_path / "run"), "--no-progress"] * (command == "run")
    )
    code = main(args)
    return code, capsys.readouterr().err


E2E = {
    "data.dataset": "mine",
    "data.partition": "iid",
    "data.num_clients": 3,
    "data.min_samples": 2,
    "train.clients_per_round": 2,
    "train.batch_size": 4,
}


def test_splitfl_run_on_an_image_folder_with_transforms(tmp_path, capsys):
    image_folder(tmp_path / "imgs")
    tf = [{"random_crop": 1}, "hflip", {"normalize": {"mean": [0.5] * 3, "std": [0.25] * 3}}]
    changes = {**E2E, "data.format": "image_folder", "data.root": str(tmp_path / "imgs")}
    code, err = _run_cli(tmp_path, capsys, "run", **changes, **{"data.transforms": tf})
    assert code == 0, err
    rows = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 2


def test_splitfl_run_on_csv_and_a_corrupt_csv_exits_2(tmp_path, capsys):
    header = ["f1", "f2", "f3", "label"]
    write_csv(tmp_path / "tab" / "train.csv", csv_rows(12, 0, ("0", "1", "2")), header)
    write_csv(tmp_path / "tab" / "test.csv", csv_rows(6, 1, ("0", "1", "2")), header)
    changes = {**E2E, "data.format": "csv", "data.root": str(tmp_path / "tab")}
    code, err = _run_cli(tmp_path, capsys, "run", **changes)
    assert code == 0, err
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 2
    with open(tmp_path / "tab" / "train.csv", "a") as fh:
        fh.write("1.0,oops,2.0,1\n")
    code, err = _run_cli(tmp_path, capsys, "validate", **changes)
    assert code == 2 and err.count("\n") == 1 and "train.csv: line 14" in err, err


@pytest.mark.slow
def test_networked_run_with_transforms_equals_sequential_run(tmp_path):
    """Device processes augment their own batches exactly as the simulation does."""
    import splitfl
    from splitfl.net.server.testbed import Testbed
    from splitfl.testing import config_for

    devices = {"d0": [0, 2], "d1": [1, 3]}
    changes = {
        "rounds": 2,
        "data.num_clients": 4,
        "train.clients_per_round": 4,
        "data.transforms": [{"random_crop": 2}, "hflip"],
    }
    bed = Testbed.create(tmp_path / "bed", list(devices))
    threads = [bed.device(name, clients, None, retry_s=20.0) for name, clients in devices.items()]
    net = bed.server_overrides(min_devices=len(devices))
    runs = [
        splitfl.run(config_for("s2fl", **changes, **net), run_dir=tmp_path / "net"),
        splitfl.run(config_for("s2fl", **changes), run_dir=tmp_path / "seq"),
    ]
    for t in threads:
        t.join(30)
    a, b = (torch.load(r.run_dir / "model.pt", weights_only=True) for r in runs)
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-5
    plain = splitfl.run(
        config_for("s2fl", **{**changes, "data.transforms": []}), run_dir=tmp_path / "plain"
    )
    c = torch.load(plain.run_dir / "model.pt", weights_only=True)
    assert max((a[k].double() - c[k].double()).abs().max().item() for k in a) > 1e-3


BAD_DATA = [
    ({"data.format": "tiff_stack"}, "data.format: unknown 'tiff_stack'"),
    ({"data.format": "csv", "data.dataset": "mine"}, "data.root: data.format: csv reads data.root"),
    ({"data.format": "csv", "data.root": "."}, "data.dataset: 'digits' is a built-in dataset"),
    ({"data.partition": "folders"}, "data.partition: folders reads root/clients/"),
    ({"data.image_size": [32]}, "data.image_size: must be [height, width]"),
    ({"data.lazy": "sometimes"}, "data.lazy: expected true or false"),
    (
        {"data.transforms": [{"normalize": {"mean": [0, 0, 0], "std": [1, 1, 1]}}]},
        "data.transforms: digits: normalize has 3 channel values for 1 channels",
    ),
]


@pytest.mark.parametrize("change,message", BAD_DATA)
def test_bad_data_settings_are_one_line_errors(change, message, tmp_path, capsys):
    code, err = _run_cli(tmp_path, capsys, "validate", **change)
    assert code == 2 and err.count("\n") == 1 and message in err, err

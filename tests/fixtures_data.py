"""Tiny deterministic dataset files in the real on-disk formats, for loader tests.

Each writer puts files into ``dir`` using the dataset's conventional sub-layout and returns
the raw arrays it wrote (uint8 images, labels, writer ids) so tests can compare.
"""

from __future__ import annotations

import gzip
import json
import pickle
import struct
import wave
from pathlib import Path

import numpy as np


def _idx_bytes(arr: np.ndarray) -> bytes:
    """Encode a uint8 array as idx: magic ``0 0 0x08 ndim``, big-endian uint32 dims, data."""
    header = struct.pack(">BBBB", 0, 0, 0x08, arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes()


def write_mnist_idx(
    dir: Path,
    n_train: int = 60,
    n_test: int = 20,
    gz: bool = True,
    writer_ids: bool = False,
    folder: str = "MNIST",
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """Write ``dir/<folder>/raw/`` idx files (+ ``dir/<folder>/mnist-writer-ids.csv.gz``)."""
    rng = np.random.default_rng(seed)
    raw = Path(dir) / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    out = {
        "train_x": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_y": (np.arange(n_train) % 10).astype(np.uint8),
        "test_x": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_y": (np.arange(n_test) % 10).astype(np.uint8),
        "train_w": rng.integers(0, 5, n_train),
        "test_w": 100 + rng.integers(0, 3, n_test),
    }
    files = {
        "train-images-idx3-ubyte": out["train_x"],
        "train-labels-idx1-ubyte": out["train_y"],
        "t10k-images-idx3-ubyte": out["test_x"],
        "t10k-labels-idx1-ubyte": out["test_y"],
    }
    for name, arr in files.items():
        data = _idx_bytes(arr)
        if gz:
            (raw / f"{name}.gz").write_bytes(gzip.compress(data, mtime=0))
        else:
            (raw / name).write_bytes(data)
    if writer_ids:
        lines = ["split,index,label,writer_id,hsf_series"]
        for split, p in (("train", "train"), ("test", "test")):
            for i, (y, w) in enumerate(zip(out[f"{p}_y"], out[f"{p}_w"], strict=True)):
                lines.append(f"{split},{i},{y},{w},{i % 2 * 4}")
        text = "\n".join(lines) + "\n"
        (raw.parent / "mnist-writer-ids.csv.gz").write_bytes(gzip.compress(text.encode(), mtime=0))
    return out


def _cifar_batch(rng: np.random.Generator, n: int, label_keys: dict[str, int]) -> dict:
    batch: dict = {
        "batch_label": "fixture batch",
        "data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
        "filenames": [f"img_{i}.png" for i in range(n)],
    }
    for key, classes in label_keys.items():
        batch[key] = [int(v) for v in rng.integers(0, classes, n)]
    return batch


def _dump(path: Path, obj: dict) -> None:
    with open(path, "wb") as fh:
        pickle.dump(obj, fh, protocol=2)


def write_cifar10(dir: Path, n_per_batch: int = 10, seed: int = 0) -> dict[str, np.ndarray]:
    """Write ``dir/cifar-10-batches-py/`` (five data batches, test batch, meta)."""
    rng = np.random.default_rng(seed)
    folder = Path(dir) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    batches = [_cifar_batch(rng, n_per_batch, {"labels": 10}) for _ in range(6)]
    for i, batch in enumerate(batches[:5], start=1):
        _dump(folder / f"data_batch_{i}", batch)
    _dump(folder / "test_batch", batches[5])
    names = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship"]
    meta = {"num_cases_per_batch": n_per_batch, "label_names": names + ["truck"], "num_vis": 3072}
    _dump(folder / "batches.meta", meta)
    return {
        "train_x": np.concatenate([b["data"] for b in batches[:5]]),
        "train_y": np.concatenate([b["labels"] for b in batches[:5]]),
        "test_x": batches[5]["data"],
        "test_y": np.asarray(batches[5]["labels"]),
    }


def write_cifar100(dir: Path, n: int = 30, seed: int = 0) -> dict[str, np.ndarray]:
    """Write ``dir/cifar-100-python/`` (``train``, ``test``, ``meta``)."""
    rng = np.random.default_rng(seed)
    folder = Path(dir) / "cifar-100-python"
    folder.mkdir(parents=True, exist_ok=True)
    keys = {"fine_labels": 100, "coarse_labels": 20}
    train, test = _cifar_batch(rng, n, keys), _cifar_batch(rng, max(n // 3, 1), keys)
    _dump(folder / "train", train)
    _dump(folder / "test", test)
    meta = {
        "fine_label_names": [f"f{i}" for i in range(100)],
        "coarse_label_names": [f"c{i}" for i in range(20)],
    }
    _dump(folder / "meta", meta)
    return {
        "train_x": train["data"],
        "train_fine": np.asarray(train["fine_labels"]),
        "train_coarse": np.asarray(train["coarse_labels"]),
        "test_x": test["data"],
        "test_fine": np.asarray(test["fine_labels"]),
    }


def femnist_arrays(
    n_writers: int = 6, samples_per_writer: int = 8, test_only: int = 2, seed: int = 0
) -> dict[str, np.ndarray]:
    """Synthetic FEMNIST in npz form; writers numbered by first appearance (train, then test).

    The first ``n_writers - test_only`` writers have train and test samples, the last
    ``test_only`` only test samples (as in the real LEAF sample). ``split``: 0 = train, 1 = test.
    """
    rng = np.random.default_rng(seed)
    n_train_w = n_writers - test_only
    n_tr = samples_per_writer - max(samples_per_writer // 4, 1)
    writer, split = [], []
    for w in range(n_train_w):  # train part first, writer by writer
        writer += [w] * n_tr
        split += [0] * n_tr
    for w in range(n_writers):  # then test
        n_te = samples_per_writer - n_tr if w < n_train_w else samples_per_writer
        writer += [w] * n_te
        split += [1] * n_te
    n = len(writer)
    x = np.full((n, 28, 28), 255, dtype=np.uint8)
    x[:, 6:22, 6:22] = rng.integers(0, 256, (n, 16, 16), dtype=np.uint8)
    return {
        "x": x,
        "y": rng.integers(0, 62, n).astype(np.uint8),
        "writer": np.asarray(writer, dtype=np.int32),
        "split": np.asarray(split, dtype=np.uint8),
        "writer_names": np.asarray([f"f{1000 + w}_{w:02d}" for w in range(n_writers)]),
    }


def write_femnist_npz(
    dir: Path, n_writers: int = 6, samples_per_writer: int = 8, seed: int = 0
) -> dict[str, np.ndarray]:
    """Write ``dir/FEMNIST/femnist-fixture.npz`` in the compact layout."""
    arrays = femnist_arrays(n_writers, samples_per_writer, seed=seed)
    folder = Path(dir) / "FEMNIST"
    folder.mkdir(parents=True, exist_ok=True)
    leaf_file = np.zeros(len(arrays["y"]), dtype=np.int16)
    np.savez_compressed(folder / "femnist-fixture.npz", leaf_file=leaf_file, **arrays)
    return arrays


def write_femnist_leaf(
    dir: Path, n_writers: int = 6, samples_per_writer: int = 8, seed: int = 0, files: int = 2
) -> dict[str, np.ndarray]:
    """Write ``dir/FEMNIST/{train,test}/*.json`` (LEAF), the same images as the npz writer.

    Writers are spread in order over ``files`` json files named like LEAF's
    ``all_data_<i>_niid_05_keep_0_{train,test}_9.json``.
    """
    arrays = femnist_arrays(n_writers, samples_per_writer, seed=seed)
    names = arrays["writer_names"]
    for split_value, split in ((0, "train"), (1, "test")):
        folder = Path(dir) / "FEMNIST" / split
        folder.mkdir(parents=True, exist_ok=True)
        mask = arrays["split"] == split_value
        users = [int(w) for w in dict.fromkeys(arrays["writer"][mask].tolist())]
        for f, chunk in enumerate(np.array_split(np.asarray(users, dtype=np.int64), files)):
            mine = chunk.tolist()  # contiguous chunks keep the writer order across files
            blob: dict = {"users": [], "num_samples": [], "user_data": {}}
            for u in mine:
                sel = mask & (arrays["writer"] == u)
                blob["users"].append(str(names[u]))
                blob["num_samples"].append(int(sel.sum()))
                blob["user_data"][str(names[u])] = {
                    "x": (arrays["x"][sel].reshape(-1, 784) / 255.0).tolist(),
                    "y": arrays["y"][sel].astype(int).tolist(),
                }
            path = folder / f"all_data_{f}_niid_05_keep_0_{split}_9.json"
            path.write_text(json.dumps(blob))
    return arrays


HAR_SIGNALS = [
    f"{kind}_{axis}" for kind in ("body_acc", "body_gyro", "total_acc") for axis in "xyz"
]


def write_har(
    dir: Path, n_train: int = 12, n_test: int = 6, seed: int = 0
) -> dict[str, np.ndarray]:
    """Write ``dir/UCI HAR Dataset/{train,test}/`` (inertial signals, ``y_*``, ``subject_*``).

    Signal values have 4 decimals, written as in the official files (``%.7e``, leading and
    double spaces), so ``float32(value)`` is exactly what a loader can recover. Returns
    ``<split>_x`` ``[N, 128, 9]`` float64 (signals in the official order), ``<split>_y``
    (1..6) and ``<split>_subject``.
    """
    rng = np.random.default_rng(seed)
    base = Path(dir) / "UCI HAR Dataset"
    out: dict[str, np.ndarray] = {}
    for split, n, subjects in (("train", n_train, (1, 3, 5)), ("test", n_test, (2, 4))):
        signals = base / split / "Inertial Signals"
        signals.mkdir(parents=True, exist_ok=True)
        x = np.round(rng.normal(0.0, 0.5, (n, 128, 9)), 4)
        y = (np.arange(n) % 6 + 1).astype(np.int64)
        subject = np.asarray([subjects[i % len(subjects)] for i in range(n)], dtype=np.int64)
        for k, name in enumerate(HAR_SIGNALS):
            rows = ["  " + "  ".join(f"{v:.7e}" for v in x[i, :, k]) for i in range(n)]
            (signals / f"{name}_{split}.txt").write_text("\n".join(rows) + "\n")
        (base / split / f"y_{split}.txt").write_text("".join(f"{v}\n" for v in y))
        (base / split / f"subject_{split}.txt").write_text("".join(f"{v}\n" for v in subject))
        out.update({f"{split}_x": x, f"{split}_y": y, f"{split}_subject": subject})
    return out


SPEECH_SPEAKERS = ("0a7c2a8d", "1b4c9b89", "c1d39ce8")
SPEECH_LENGTHS = (16000, 9000, 12345, 16400)  # full, short (padded), short, long (trimmed)


def _write_wav(path: Path, samples: np.ndarray, rate: int = 16000) -> None:
    with wave.open(str(path), "wb") as fh:
        fh.setnchannels(1)
        fh.setsampwidth(2)
        fh.setframerate(rate)
        fh.writeframes(np.asarray(samples, dtype="<i2").tobytes())


def write_speech_commands(
    dir: Path, labels: tuple[str, ...] = ("yes", "no", "up"), per_label: int = 4, seed: int = 0
) -> dict:
    """Write ``dir/SpeechCommands/speech_commands_v0.02/`` with real 16-bit 16 kHz WAVs.

    Clip ``i`` of a label is ``<speaker>_nohash_<i // 3>.wav`` with speaker
    ``SPEECH_SPEAKERS[i % 3]`` and ``SPEECH_LENGTHS[i % 4]`` samples; clip 1 of every label goes
    to ``validation_list.txt``, clip 2 to ``testing_list.txt``. A ``_background_noise_`` folder
    (long WAV + README) and a top-level ``README.md`` are added and must be ignored.
    Returns ``folder``, ``labels`` (sorted), ``files`` (relative path → int16 samples),
    ``validation``, ``testing`` and ``train`` (sorted relative paths).
    """
    rng = np.random.default_rng(seed)
    folder = Path(dir) / "SpeechCommands" / "speech_commands_v0.02"
    files: dict[str, np.ndarray] = {}
    validation, testing = [], []
    for label in labels:
        (folder / label).mkdir(parents=True, exist_ok=True)
        for i in range(per_label):
            rel = f"{label}/{SPEECH_SPEAKERS[i % 3]}_nohash_{i // 3}.wav"
            samples = rng.integers(-32768, 32768, SPEECH_LENGTHS[i % 4]).astype(np.int16)
            samples[0] = -32768  # the extreme maps to exactly -1.0
            _write_wav(folder / rel, samples)
            files[rel] = samples
            if i == 1:
                validation.append(rel)
            elif i == 2:
                testing.append(rel)
    noise = folder / "_background_noise_"
    noise.mkdir(parents=True, exist_ok=True)
    _write_wav(noise / "white_noise.wav", rng.integers(-100, 100, 40000).astype(np.int16))
    (noise / "README.md").write_text("background noise clips\n")
    (folder / "README.md").write_text("Speech Commands fixture\n")
    (folder / "validation_list.txt").write_text("".join(f"{r}\n" for r in validation))
    (folder / "testing_list.txt").write_text("".join(f"{r}\n" for r in testing))
    held = set(validation) | set(testing)
    return {
        "folder": folder,
        "labels": sorted(labels),
        "files": files,
        "validation": sorted(validation),
        "testing": sorted(testing),
        "train": sorted(r for r in files if r not in held),
    }


QNLI_WORDS = (
    "what", "when", "who", "is", "the", "of", "a", "river", "city", "year", "Paris", "Ünïcode",
    "built", "in", "1889", "tower", "north", "empire", "won", "its", "Bob's", "x_y",
)  # fmt: skip
QNLI_LABELS = ("entailment", "not_entailment")


def write_qnli(dir: Path, n_train: int = 20, n_test: int = 8, seed: int = 0) -> dict[str, list]:
    """Write ``dir/QNLI/{train,dev,test}.tsv`` in the GLUE layout (tab-separated, header row).

    Texts are random words of :data:`QNLI_WORDS` with punctuation; row 1 of each split starts with
    an unbalanced double quote (read with ``QUOTE_NONE`` it is plain text), row 2 of train a
    100-word sentence (truncated by any short ``seq_len``). ``test.tsv`` has no label column,
    like GLUE's, and must be ignored. Returns ``<split>_q``, ``<split>_s`` (texts) and
    ``<split>_y`` (label strings) for ``split`` in ``train``, ``dev``.
    """
    rng = np.random.default_rng(seed)
    folder = Path(dir) / "QNLI"
    folder.mkdir(parents=True, exist_ok=True)

    def text(n: int, end: str) -> str:
        return " ".join(str(w) for w in rng.choice(QNLI_WORDS, n)).capitalize() + end

    out: dict[str, list] = {}
    for split, n in (("train", n_train), ("dev", n_test)):
        qs = [text(int(rng.integers(2, 8)), "?") for _ in range(n)]
        ss = [text(int(rng.integers(3, 20)), ".") for _ in range(n)]
        if n > 1:
            qs[1] = '"What does Ünïcode mean?'
        if split == "train" and n > 2:
            ss[2] = text(100, ".")
        ys = [QNLI_LABELS[int(v)] for v in rng.integers(0, 2, n)]
        lines = ["index\tquestion\tsentence\tlabel"]
        lines += [f"{i}\t{q}\t{s}\t{y}" for i, (q, s, y) in enumerate(zip(qs, ss, ys, strict=True))]
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
        out.update({f"{split}_q": qs, f"{split}_s": ss, f"{split}_y": ys})
    test = ["index\tquestion\tsentence"] + [f"{i}\tWhy?\tBecause." for i in range(3)]
    (folder / "test.tsv").write_text("\n".join(test) + "\n", encoding="utf-8")
    return out


# -- image folders (``data.format: image_folder``) ---------------------------------------------
def _png(path, arr: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    from PIL import Image

    Image.fromarray(arr).save(path)


def write_images(folder, counts: dict[str, int], seed: int = 0, size=(6, 6)) -> dict:
    """``folder/<class>/<i>.png`` RGB images; returns {class: [arrays]}."""
    rng = np.random.default_rng(seed)
    out: dict[str, list] = {}
    for c, n in counts.items():
        for i in range(n):
            arr = rng.integers(0, 256, (*size, 3), dtype=np.uint8)
            _png(folder / c / f"{i:03d}.png", arr)
            out.setdefault(c, []).append(arr)
    return out


def image_folder(root, per_class: int = 6) -> dict:
    train = write_images(root / "train", {"dog": per_class, "cat": per_class})
    write_images(root / "test", {"cat": 2, "dog": 2}, seed=1)
    return train

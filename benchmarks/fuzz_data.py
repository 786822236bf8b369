"""Data-file fuzzer: random damage to every loader's files; none may end in a traceback.

For each supported file format a small fixture set is written (the generators of
``tests/fixtures_data.py``), then each of its files is damaged at random, one file at a time —
truncated at a random offset, random bytes flipped, a random region zeroed, garbage appended,
or emptied — and the dataset is loaded as ``splitfl validate`` loads it. Outcomes:

- ``error``: a one-line :class:`~splitfl.data.DatasetError` naming the damaged file (wanted);
- ``accepted``: the damage left a loadable, consistent dataset (e.g. flipped pixel bytes,
  which no check without checksums can see);
- ``traceback``: any other exception, or an error line that does not name the file (bugs).

Run: ``python benchmarks/fuzz_data.py [--cases-per-file 40] [--seed 0] [--show 3]``.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import traceback
import warnings
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from fixtures_data import (  # noqa: E402  (test fixtures, importable from the repo)
    write_cifar10,
    write_cifar100,
    write_femnist_leaf,
    write_femnist_npz,
    write_har,
    write_mnist_idx,
    write_qnli,
    write_speech_commands,
)
from splitfl.data import DatasetError, load_dataset  # noqa: E402

#: format name -> (dataset name, fixture writer(dir)).
FORMATS: dict[str, tuple[str, Callable[[Path], object]]] = {
    "mnist-gz": ("mnist", lambda d: write_mnist_idx(d, gz=True)),
    "mnist-idx": ("mnist", lambda d: write_mnist_idx(d, gz=False)),
    "mnist-writers": ("mnist", lambda d: write_mnist_idx(d, writer_ids=True)),
    "fashion-mnist": ("fashion_mnist", lambda d: write_mnist_idx(d, folder="FashionMNIST")),
    "cifar10": ("cifar10", write_cifar10),
    "cifar100": ("cifar100", write_cifar100),
    "femnist-npz": ("femnist", write_femnist_npz),
    "femnist-leaf": ("femnist", write_femnist_leaf),
    "har": ("har", write_har),
    "speech": ("speech_commands", write_speech_commands),
    "qnli": ("qnli", write_qnli),
}


def damage(data: bytes, rng: np.random.Generator) -> tuple[str, bytes]:
    """One random kind of damage to a file's bytes."""
    n = len(data)
    kind = str(
        rng.choice(["truncate", "flip", "zero", "append", "empty"], p=[0.3, 0.3, 0.2, 0.1, 0.1])
    )
    if kind == "truncate" and n > 1:
        return kind, data[: int(rng.integers(1, n))]
    if kind == "flip" and n:
        buf = bytearray(data)
        for i in rng.integers(0, n, size=int(rng.integers(1, 9))):
            buf[int(i)] ^= int(rng.integers(1, 256))
        return kind, bytes(buf)
    if kind == "zero" and n > 1:
        a = int(rng.integers(0, n - 1))
        b = int(rng.integers(a + 1, min(n, a + 4096) + 1))
        return kind, data[:a] + bytes(b - a) + data[b:]
    if kind == "append":
        return kind, data + rng.bytes(int(rng.integers(1, 64)))
    return "empty", b""


def classify(dataset: str, root: Path, damaged: Path) -> tuple[str, str]:
    """Load ``dataset`` from ``root`` as ``validate`` does; the outcome and its message."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            load_dataset(dataset, root, verify="off")
    except DatasetError as err:
        line = str(err)
        ok = "\n" not in line and damaged.name in line
        return ("error" if ok else "traceback"), line
    except Exception:  # noqa: BLE001  (counting what escapes is the point)
        return "traceback", traceback.format_exc(limit=3)
    return "accepted", ""


def fuzz_format(
    name: str,
    cases_per_file: int,
    rng: np.random.Generator,
    out: Counter,
    examples: dict[str, list[str]],
) -> None:
    dataset, write = FORMATS[name]
    with tempfile.TemporaryDirectory() as tmp:
        clean = Path(tmp) / "clean"
        write(clean)
        files = sorted(p for p in clean.rglob("*") if p.is_file())
        work = Path(tmp) / "work"
        for path in files:
            for _ in range(cases_per_file):
                shutil.rmtree(work, ignore_errors=True)
                shutil.copytree(clean, work)
                target = work / path.relative_to(clean)
                kind, data = damage(path.read_bytes(), rng)
                target.write_bytes(data)
                outcome, message = classify(dataset, work, target)
                out[outcome] += 1
                examples.setdefault(outcome, []).append(
                    f"{name}: {path.relative_to(clean)} ({kind}): {message.strip()[:300]}"
                )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases-per-file", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--show", type=int, default=3, help="examples listed per outcome")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    counts: Counter = Counter()
    examples: dict[str, list[str]] = {}
    for name in FORMATS:
        before = sum(counts.values())
        fuzz_format(name, args.cases_per_file, rng, counts, examples)
        print(f"{name}: {sum(counts.values()) - before} cases", flush=True)
    total = sum(counts.values())
    print(
        f"cases tried: {total}; "
        + ", ".join(f"{k}: {counts[k]}" for k in ("error", "accepted", "traceback"))
    )
    for outcome, lines in examples.items():
        for line in lines[: args.show]:
            print(f"  [{outcome}] {line}")
    return 1 if counts["traceback"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

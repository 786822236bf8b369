"""Raw text tokenised with a Hugging Face tokenizer: ``data.format: text``.

Files: ``train.<ext>`` and ``test.<ext>`` (or ``dev.<ext>``, GLUE's labelled evaluation split)
in ``data.root``, ``<ext>`` one of ``tsv`` (tab-separated with a header, no quoting: GLUE's
QNLI files as they are), ``csv`` (with a header) or ``jsonl`` (one JSON object per line).
``data.text_columns`` names one column (a sentence) or two (a pair, such as QNLI's
``question`` and ``sentence``); ``data.label_column`` the label (integers as they are, else
the sorted class names of the training split). Each row is tokenised with the tokenizer in
``data.tokenizer`` (a folder saved with ``save_pretrained``; by default the ``model: hf:``
folder), truncated and padded to ``data.max_length`` tokens: the inputs are ``[N, 2, T]``
int64, token ids and attention mask, as :mod:`splitfl.models.hf` takes them. With
``data.text_target: next_token`` there is no label column: the targets are the token ids
``[N, T]`` with padding set to ``IGNORE`` (``train.loss: causal_lm`` shifts them), and the
number of classes is the tokenizer's vocabulary.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import torch

from splitfl.data.base import ArrayDataset, DatasetBundle, DatasetNotFoundError
from splitfl.data.formats.arrays import encode_labels
from splitfl.data.loaders._common import file_error, reading
from splitfl.data.tokens import load_tokenizer, next_tokens, tokenize

EXTENSIONS = (".tsv", ".csv", ".jsonl")
TEST_NAMES = ("test", "dev")


def find_split(root: Path, names: tuple[str, ...], name: str) -> Path:
    """The first ``<name>.<ext>`` that exists in ``root``."""
    for stem in names:
        for ext in EXTENSIONS:
            if (root / f"{stem}{ext}").is_file():
                return root / f"{stem}{ext}"
    wanted = ", ".join(f"{s}{{{','.join(EXTENSIONS)}}}" for s in names)
    raise DatasetNotFoundError(f"{name}: missing file {root}/{wanted}")


def _records(path: Path):
    """The rows of ``path`` as dicts (column name -> text)."""
    with path.open(encoding="utf-8", newline="") as f:
        if path.suffix == ".jsonl":
            yield from (json.loads(line) for line in f if line.strip())
        elif path.suffix == ".tsv":
            yield from csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
        else:
            yield from csv.DictReader(f)


def read_rows(
    path: Path, name: str, columns: list[str], label_column: str | None
) -> tuple[list[list[str]], list[str]]:
    """Per text column its texts, and the labels as strings (none without ``label_column``);
    a row lacking a column is a one-line error naming the file and the row."""
    texts: list[list[str]] = [[] for _ in columns]
    labels: list[str] = []
    wanted = (*columns, label_column) if label_column else tuple(columns)
    with reading(name, path):
        for i, row in enumerate(_records(path), 1):
            missing = [c for c in wanted if row.get(c) is None]
            if missing:
                raise file_error(name, path, f"row {i} has no column {missing[0]!r}")
            for texts_of, column in zip(texts, columns, strict=True):
                texts_of.append(str(row[column]))
            if label_column:
                labels.append(str(row[label_column]))
    if not texts[0]:
        raise file_error(name, path, "holds no rows")
    return texts, labels


def table_rows(
    ds, name: str, where, columns: list[str], label_column: str | None
) -> tuple[list[list[str]], list[str]]:
    """:func:`read_rows` for a Hugging Face ``Dataset`` (``data.format: hf | parquet``): its
    text columns and label column (a ``ClassLabel``'s integers, as strings)."""
    wanted = [*columns, label_column] if label_column else list(columns)
    missing = [c for c in wanted if c not in ds.column_names]
    if missing:
        raise file_error(name, where, f"has no column {missing[0]!r} (has {ds.column_names})")
    texts = [[str(v) for v in ds[c]] for c in columns]
    labels = [str(v) for v in ds[label_column]] if label_column else []
    if not texts[0]:
        raise file_error(name, where, "holds no rows")
    return texts, labels


def file_splits(root: Path, name: str, columns: list[str], label_column: str | None):
    """``train`` and ``test``/``dev`` files' rows (``data.format: text``) and the files."""
    train_file = find_split(root, ("train",), name)
    test_file = find_split(root, TEST_NAMES, name)
    rows = tuple(read_rows(f, name, columns, label_column) for f in (train_file, test_file))
    return rows, (train_file, test_file)


def tokenized_bundle(
    name: str,
    splits: tuple,
    where: tuple,
    tokenizer: str,
    max_length: int,
    next_token: bool,
) -> DatasetBundle:
    """The bundle of two splits' ``(texts, labels)`` rows, tokenised (module docstring); with
    ``next_token`` the targets are the next tokens, else the labels."""
    (train_texts, train_raw), (test_texts, test_raw) = splits
    tok = load_tokenizer(tokenizer, name)
    x, test_x = tokenize(train_texts, tok, max_length), tokenize(test_texts, tok, max_length)
    names = None
    if next_token:
        y, test_y, classes = next_tokens(x), next_tokens(test_x), len(tok)
    else:
        ys = encode_labels(train_raw, test_raw, name, where)
        y, test_y = (torch.from_numpy(np.asarray(v, dtype=np.int64)) for v in ys[:2])
        classes, names = ys[2], ys[3]
    train, test = ArrayDataset(x, y), ArrayDataset(test_x, test_y)
    bundle = DatasetBundle(name, train, test, classes, (2, max_length))
    bundle.class_names = names
    return bundle

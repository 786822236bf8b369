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
from splitfl.training.losses import IGNORE

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


def load_tokenizer(tokenizer_dir: str, name: str):
    """The Hugging Face tokenizer saved in ``tokenizer_dir`` (local files only); one without a
    padding token pads with its end-of-text token (GPT-2, Llama)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DatasetNotFoundError(
            f"{name}: data.format text needs the Hugging Face extra: pip install -e '.[hf]'"
        ) from None
    try:
        tok = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    except (OSError, ValueError) as err:
        raise DatasetNotFoundError(
            f"{name}: no tokenizer in {tokenizer_dir!r} (data.tokenizer): "
            f"{str(err).splitlines()[0]}"
        ) from None
    if tok.pad_token is None:  # GPT-2 and Llama tokenizers have none: pad with end-of-text
        tok.pad_token = tok.eos_token
    return tok


def tokenize(texts: list[list[str]], tok, max_length: int) -> torch.Tensor:
    """``[N, 2, max_length]`` int64: the tokenizer's ids and attention mask (truncation, padding
    to ``max_length``; a pair is truncated longest first)."""
    enc = tok(*texts, truncation=True, padding="max_length", max_length=max_length)
    ids = torch.tensor(enc["input_ids"], dtype=torch.int64)
    mask = torch.tensor(enc["attention_mask"], dtype=torch.int64)
    return torch.stack([ids, mask], 1)


def next_tokens(x: torch.Tensor) -> torch.Tensor:
    """``causal_lm`` targets: the token ids, ``IGNORE`` where the mask is 0."""
    return x[:, 0].masked_fill(x[:, 1] == 0, IGNORE)


def load_text(
    root: Path,
    name: str,
    columns: list[str],
    label_column: str | None,
    tokenizer: str,
    max_length: int,
) -> DatasetBundle:
    """The train and test splits of ``root``, tokenised (module docstring); without
    ``label_column`` the targets are the next tokens."""
    train_file = find_split(root, ("train",), name)
    test_file = find_split(root, TEST_NAMES, name)
    train_texts, train_raw = read_rows(train_file, name, columns, label_column)
    test_texts, test_raw = read_rows(test_file, name, columns, label_column)
    tok = load_tokenizer(tokenizer, name)
    x, test_x = tokenize(train_texts, tok, max_length), tokenize(test_texts, tok, max_length)
    if label_column is None:
        y, test_y, classes = next_tokens(x), next_tokens(test_x), len(tok)
    else:
        ys = encode_labels(train_raw, test_raw, name, (train_file, test_file))
        y, test_y = (torch.from_numpy(np.asarray(v, dtype=np.int64)) for v in ys[:2])
        classes = ys[2]
    train, test = ArrayDataset(x, y), ArrayDataset(test_x, test_y)
    return DatasetBundle(name, train, test, classes, (2, max_length))

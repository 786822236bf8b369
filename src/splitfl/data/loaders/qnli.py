"""GLUE QNLI (question / sentence entailment) from its TSV files, with a hashing tokenizer.

Folder layout (the GLUE download): ``root/QNLI/`` (also ``root/glue_data/QNLI/`` or ``root``
pointing at the QNLI folder itself) holding ``train.tsv`` (104,743 rows) and ``dev.tsv``
(5,463 rows), tab-separated with the header ``index question sentence label``; labels
``entailment`` → 0, ``not_entailment`` → 1. GLUE's ``test.tsv`` has no labels, so ``dev.tsv``
is the test split (as ParallelSFL's 104,743 / 5,463 counts, paper §5.1).

The files are read with ``csv`` (tab delimiter, ``QUOTE_NONE``: QNLI text holds stray quote
characters). A row whose field count differs from the header's, or whose label is neither
``entailment`` nor ``not_entailment``, is skipped and counted; a warning names the count. A file
that cannot be decoded (not UTF-8, broken header) or holds no well-formed row is a one-line
:class:`~splitfl.data.base.DatasetFileError` naming it.

Tokenizer (deterministic, no vocabulary download): lower-case, split into runs of Unicode
letters/digits, word ``w`` → ``2 + crc32(utf-8(w)) mod (VOCAB_SIZE - 2)``; id 0 is PAD and id 1
the ``[SEP]`` put between question and sentence. A pair longer than ``seq_len`` is truncated
"longest first" (the longer part loses its tail, so ``[SEP]`` and both parts survive), a shorter
one is padded with PAD. Samples are float32 ``[N, seq_len]`` token ids (exact: ids < 2^24) for
the ``transformer`` model, ``input_shape = (seq_len,)``, 2 classes.
"""

from __future__ import annotations

import csv
import re
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from splitfl.data import tokens
from splitfl.data.base import ArrayDataset, DatasetBundle, DatasetWarning, register_dataset
from splitfl.data.loaders._common import file_error, find_folder, reading
from splitfl.models.zoo.transformer import PAD_ID, SEP_ID, VOCAB_SIZE

LABELS = {"entailment": 0, "not_entailment": 1}
FILES = ["train.tsv", "dev.tsv"]
SUBDIRS = ["QNLI", "glue_data/QNLI"]
COLUMNS = ("question", "sentence", "label")
SEQ_LEN = 64
_WORD = re.compile(r"[^\W_]+")  # runs of Unicode letters and digits


def tokenize(text: str, vocab_size: int = VOCAB_SIZE) -> list[int]:
    """Word ids of ``text``: lower-case, letter/digit runs, ``2 + crc32 mod (vocab_size - 2)``."""
    return [
        2 + zlib.crc32(w.encode("utf-8")) % (vocab_size - 2) for w in _WORD.findall(text.lower())
    ]


def encode_pair(question: list[int], sentence: list[int], seq_len: int = SEQ_LEN) -> list[int]:
    """``question [SEP] sentence`` truncated longest-first to ``seq_len`` and PAD-padded."""
    budget = seq_len - 1
    if len(question) + len(sentence) > budget:
        keep_q = min(len(question), max(budget - len(sentence), budget // 2))
        question, sentence = question[:keep_q], sentence[: budget - keep_q]
    ids = question + [SEP_ID] + sentence
    return ids + [PAD_ID] * (seq_len - len(ids))


@dataclass
class QnliRows:
    """Rows read from one QNLI TSV file (``skipped`` malformed rows left out)."""

    questions: list[str]
    sentences: list[str]
    labels: list[int]
    skipped: int


def read_tsv(path: Path, limit: int | None = None) -> QnliRows:
    """Read up to ``limit`` well-formed rows of a QNLI TSV file (header names the columns)."""
    rows = QnliRows([], [], [], 0)
    with open(path, encoding="utf-8", newline="") as fh:
        reader = csv.reader(fh, delimiter="\t", quoting=csv.QUOTE_NONE)
        header = next(reader, None)
        if header is None or not set(COLUMNS) <= set(header):
            missing = ", ".join(COLUMNS)
            raise file_error("qnli", path, f"header {header} lacks columns {missing}")
        q_col, s_col, y_col = (header.index(c) for c in COLUMNS)
        for row in reader:
            if limit is not None and len(rows.labels) >= limit:
                break
            if len(row) != len(header) or row[y_col] not in LABELS:
                rows.skipped += 1
                continue
            rows.questions.append(row[q_col])
            rows.sentences.append(row[s_col])
            rows.labels.append(LABELS[row[y_col]])
    return rows


def _rows(path: Path, limit: int | None) -> QnliRows:
    """The well-formed rows of ``path`` (a warning counts the malformed ones)."""
    with reading("qnli", path):
        rows = read_tsv(path, limit)
    if not rows.labels:
        raise file_error("qnli", path, f"holds no well-formed rows ({rows.skipped} malformed)")
    if rows.skipped:
        msg = f"qnli: skipped {rows.skipped} malformed rows of {path}"
        warnings.warn(msg, DatasetWarning, stacklevel=2)
    return rows


def _tokenized(path: Path, tok, max_length: int, limit: int | None) -> ArrayDataset:
    """The pairs of ``path`` through a Hugging Face tokenizer: ``[N, 2, max_length]``."""
    rows = _rows(path, limit)
    x = tokens.tokenize([rows.questions, rows.sentences], tok, max_length)
    return ArrayDataset(x, torch.as_tensor(rows.labels, dtype=torch.int64))


def _encode(path: Path, seq_len: int, limit: int | None) -> ArrayDataset:
    rows = _rows(path, limit)
    cache: dict[str, list[int]] = {}  # questions repeat across QNLI rows

    def ids(text: str) -> list[int]:
        if text not in cache:
            cache[text] = tokenize(text)
        return cache[text]

    x = np.zeros((len(rows.labels), seq_len), dtype=np.float32)
    for i, (q, s) in enumerate(zip(rows.questions, rows.sentences, strict=True)):
        x[i] = encode_pair(ids(q), tokenize(s), seq_len)
    y = np.asarray(rows.labels, dtype=np.int64)
    return ArrayDataset(torch.from_numpy(x), torch.from_numpy(y))


@register_dataset(
    "qnli", "GLUE QNLI (root/QNLI/{train,dev}.tsv), hashed token ids (64,), 2 classes"
)
def load_qnli(
    root: Path | None = None,
    seq_len: int = SEQ_LEN,
    max_train: int | None = None,
    max_test: int | None = None,
    tokenizer: str | None = None,
    max_length: int = 128,
) -> DatasetBundle:
    """QNLI: train = ``train.tsv``, test = ``dev.tsv``; float32 token ids ``[N, seq_len]``, or,
    with ``tokenizer`` (``data.tokenizer``, by default the ``model: hf:`` folder), the pairs
    through that Hugging Face tokenizer: ``[N, 2, max_length]`` ids and masks.

    Args:
        root: Folder holding ``QNLI/`` (or the QNLI folder itself).
        seq_len: Tokens per pair, ``[SEP]`` and padding included (>= 3), hashed ids.
        max_train: Keep only the first ``max_train`` well-formed training rows (quick runs).
        max_test: Keep only the first ``max_test`` well-formed dev rows.
        tokenizer: A Hugging Face tokenizer's folder (``data.tokenizer``).
        max_length: Tokens per pair with ``tokenizer`` (``data.max_length``).
    """
    if seq_len < 3:
        raise ValueError(f"qnli: seq_len must be >= 3, got {seq_len}")
    folder = find_folder(root, SUBDIRS, FILES, "qnli")
    if tokenizer is not None:
        tok = tokens.load_tokenizer(tokenizer, "qnli")
        train = _tokenized(folder / "train.tsv", tok, max_length, max_train)
        test = _tokenized(folder / "dev.tsv", tok, max_length, max_test)
        return DatasetBundle("qnli", train, test, len(LABELS), (2, max_length))
    train = _encode(folder / "train.tsv", seq_len, max_train)
    test = _encode(folder / "dev.tsv", seq_len, max_test)
    return DatasetBundle("qnli", train, test, len(LABELS), (seq_len,))

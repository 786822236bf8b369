"""Hugging Face tokenizers for raw text (``data.format: text``, text columns, the built-in
``qnli`` with a tokenizer): load one from its folder, turn texts into ``[N, 2, T]`` ids and
masks, and next-token targets. ``transformers`` is imported where a tokenizer is loaded (the
``hf`` extra)."""

from __future__ import annotations

import torch

from splitfl.core.extras import install_extra
from splitfl.data.base import DatasetNotFoundError
from splitfl.training.losses import IGNORE


def load_tokenizer(tokenizer_dir: str, name: str):
    """The Hugging Face tokenizer saved in ``tokenizer_dir`` (local files only); one without a
    padding token pads with its end-of-text token (GPT-2, Llama)."""
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise DatasetNotFoundError(
            f"{name}: tokenising text needs the Hugging Face extra: {install_extra('hf')}"
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

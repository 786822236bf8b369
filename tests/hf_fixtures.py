"""Tiny Hugging Face models and data for the tests (built here, nothing downloaded): model
folders saved with ``save_pretrained`` (random weights) and a token dataset ``[N, 2, T]``
(token ids, attention mask) with right padding."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB, SEQ = 60, 8


def tiny_model(kind: str, classes: int = 2):
    """A tiny random task model of ``kind`` (roberta, bert, gpt2, gpt2-cls, llama)."""
    import transformers as tf

    common = {"vocab_size": VOCAB, "attn_implementation": "eager"}
    encoder = {
        "hidden_size": 16,
        "num_hidden_layers": 4,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": SEQ + 4,
        **common,
    }
    if kind == "roberta":
        return tf.RobertaForSequenceClassification(tf.RobertaConfig(num_labels=classes, **encoder))
    if kind == "bert":
        return tf.BertForSequenceClassification(tf.BertConfig(num_labels=classes, **encoder))
    gpt2 = {
        "n_embd": 16,
        "n_layer": 4,
        "n_head": 2,
        "n_positions": SEQ + 4,
        "bos_token_id": 0,
        "eos_token_id": 0,
        "pad_token_id": 0,
        **common,
    }
    if kind == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(**gpt2))
    if kind == "gpt2-cls":
        return tf.GPT2ForSequenceClassification(tf.GPT2Config(num_labels=classes, **gpt2))
    if kind == "llama":
        return tf.LlamaForCausalLM(
            tf.LlamaConfig(
                hidden_size=16,
                num_hidden_layers=4,
                num_attention_heads=2,
                num_key_value_heads=1,
                intermediate_size=32,
                max_position_embeddings=SEQ + 4,
                pad_token_id=0,
                **common,
            )
        )
    raise ValueError(kind)


def save_tiny(folder: Path, kind: str, classes: int = 2, seed: int = 0, dropout=None) -> Path:
    """``tiny_model(kind)`` saved to ``folder`` (config.json with its architecture, weights);
    ``dropout`` replaces the config's dropout probabilities."""
    torch.manual_seed(seed)
    model = tiny_model(kind, classes)
    if dropout is not None:
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            setattr(model.config, key, dropout)
    model.save_pretrained(folder)
    return folder


def token_batch(n: int = 4, seed: int = 0) -> torch.Tensor:
    """``[n, 2, SEQ]`` int64: ids in [1, VOCAB) and a mask, sample 1 padded after 5 tokens."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (n, SEQ), generator=gen)
    mask = torch.ones(n, SEQ, dtype=torch.int64)
    mask[1, 5:] = 0
    ids[1, 5:] = 0
    return torch.stack([ids, mask], 1)


def token_classification_data(n_train: int = 120, n_test: int = 16, classes: int = 2):
    """A learnable task: the label is whether token 1 is below VOCAB / 2 (train, test)."""

    def split(n: int, seed: int):
        x = token_batch(n, seed)
        y = (x[:, 0, 1] < VOCAB // 2).long() % classes
        return torch.utils.data.TensorDataset(x, y)

    return split(n_train, 1), split(n_test, 2)


WORDS = (
    "what is the capital of france paris lies on the seine who wrote this book "
    "a river runs through it cats sleep most of the day"
).split()


def save_tokenizer(folder: Path) -> Path:
    """A word-level Hugging Face tokenizer over :data:`WORDS` (``tokenizers``, no download),
    with ``<pad>`` = 0, ``<s>``, ``</s>``, ``<unk>``, saved with ``save_pretrained``."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocab = {w: i for i, w in enumerate([*specials, *sorted(set(WORDS))])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> $B </s>",
        special_tokens=[("<s>", 1), ("</s>", 2)],
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
    )
    fast.save_pretrained(folder)
    return folder


QNLI_ROWS = [
    ("what is the capital of france", "paris lies on the seine", "entailment"),
    ("who wrote this book", "cats sleep most of the day", "not_entailment"),
    ("what is the capital of france", "a river runs through it", "not_entailment"),
    ("who wrote this book", "who wrote this book", "entailment"),
]


def write_qnli(folder: Path, copies: int = 6) -> Path:
    """GLUE QNLI's layout: ``train.tsv`` and ``dev.tsv``, header ``index question sentence
    label``, tab-separated, unquoted."""
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", copies), ("dev", 2)):
        lines = ["index\tquestion\tsentence\tlabel"]
        rows = [r for _ in range(n) for r in QNLI_ROWS]
        lines += [f"{i}\t{q}\t{s}\t{label}" for i, (q, s, label) in enumerate(rows)]
        (folder / f"{split}.tsv").write_text("\n".join(lines) + "\n")
    return folder


def write_lines(folder: Path, copies: int = 8) -> Path:
    """``train.jsonl`` and ``test.jsonl`` with one ``text`` field of :data:`WORDS` phrases."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    phrases = [" ".join(WORDS[i : i + 5]) for i in range(0, len(WORDS) - 5, 3)]
    for split, n in (("train", copies), ("test", 1)):
        rows = [{"text": p} for _ in range(n) for p in phrases]
        (folder / f"{split}.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return folder

"""Tiny random Hugging Face architectures (issue 48 item 2): each built from
``AutoConfig.for_model`` with 2-3 layers and a hidden size of at most 32, saved with
``save_pretrained`` into a folder that ``model: hf-config:`` reads. Nothing is downloaded.

``ARCHITECTURES`` maps a row name to ``(model_type, task, config overrides)``; ``REFUSED``
the model types that are refused, with a config to try them on."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB, SEQ, IMAGE = 60, 8, 16

_DECODER = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 32,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
_ENCODER = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "max_position_embeddings": 32,
    "pad_token_id": 0,
}
_IMAGE = {"image_size": IMAGE, "patch_size": 4, "num_channels": 3}

#: model type -> config overrides of the decoders (causal LM and sequence classification).
DECODERS = {
    "llama": {},
    "qwen2": {},
    "qwen3": {"head_dim": 8},
    "mistral": {"sliding_window": None},
    "gemma": {"head_dim": 8},
    "gemma2": {"head_dim": 8, "sliding_window": 4},
    "phi": {"num_key_value_heads": 4},
    "phi3": {},
    "olmo": {},
    "gpt2": {"n_positions": 32},
    "gpt_neox": {"num_key_value_heads": None},
    "opt": {"ffn_dim": 64, "word_embed_proj_dim": 32, "num_key_value_heads": None},
    "falcon": {"num_kv_heads": 2, "new_decoder_architecture": True},
}
#: model type -> config overrides of the encoder sequence classifiers.
ENCODERS = {
    "bert": {},
    "roberta": {"max_position_embeddings": 40},
    "xlm-roberta": {"max_position_embeddings": 40},
    "distilbert": {"dim": 32, "hidden_dim": 64, "n_layers": 3, "n_heads": 4},
    "albert": {"embedding_size": 16, "num_hidden_groups": 1},
    "electra": {"embedding_size": 16},
    "deberta-v2": {},
    "modernbert": {
        "global_attn_every_n_layers": 2,
        "local_attention": 4,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "cls_token_id": 1,
        "sep_token_id": 2,
    },
}
#: model type -> config overrides of the image classifiers.
IMAGES = {
    "vit": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4},
    "deit": {"hidden_size": 32, "num_hidden_layers": 3, "num_attention_heads": 4},
    "swin": {
        "embed_dim": 16,
        "depths": [1, 1, 1],
        "num_heads": [2, 2, 2],
        "window_size": 2,
        "patch_size": 2,
    },
}

ARCHITECTURES: dict[str, tuple[str, str, dict]] = {
    **{f"{t}-lm": (t, "causal_lm", {**_DECODER, **o}) for t, o in DECODERS.items()},
    **{f"{t}-cls": (t, "sequence_classification", {**_DECODER, **o}) for t, o in DECODERS.items()},
    **{t: (t, "sequence_classification", {**_ENCODER, **o}) for t, o in ENCODERS.items()},
    **{t: (t, "image_classification", {**_IMAGE, **o}) for t, o in IMAGES.items()},
}

#: model types refused, with their task class and the config overrides to try them on.
REFUSED = {
    "t5": ("T5ForConditionalGeneration", {"vocab_size": VOCAB, "d_model": 32, "num_layers": 2}),
    "bart": ("BartForSequenceClassification", {"vocab_size": VOCAB, "d_model": 32}),
}


def build_config(name: str, classes: int = 3, attn: str = "eager"):
    """The config of row ``name`` (``ARCHITECTURES``), its ``architectures`` set to the
    task's class so that ``model: hf-config:`` builds that task."""
    import transformers as tf

    model_type, task, overrides = ARCHITECTURES[name]
    overrides = {k: v for k, v in overrides.items() if v is not None or k == "sliding_window"}
    config = tf.AutoConfig.for_model(model_type, **overrides)
    config.num_labels = classes
    cls = auto_class(task)._model_mapping[type(config)]
    config.architectures = [(cls[0] if isinstance(cls, tuple) else cls).__name__]
    return config


def auto_class(task: str):
    import transformers as tf

    return {
        "causal_lm": tf.AutoModelForCausalLM,
        "image_classification": tf.AutoModelForImageClassification,
    }.get(task, tf.AutoModelForSequenceClassification)


def build(name: str, classes: int = 3, attn: str = "eager", seed: int = 0):
    """Row ``name`` built with random weights (seeded), with ``attn`` attention where its
    class has it (else eager: :func:`splitfl.models.hf.attention_of`)."""
    from splitfl.models.hf import attention_of

    config = build_config(name, classes, attn)
    auto = auto_class(ARCHITECTURES[name][1])
    cls = auto._model_mapping[type(config)]
    attn = attention_of(cls[0] if isinstance(cls, tuple) else cls, attn)
    torch.manual_seed(seed)
    return auto.from_config(config, attn_implementation=attn)


def save(name: str, folder: Path, classes: int = 3, seed: int = 0) -> Path:
    """Row ``name`` saved with ``save_pretrained`` (config and random weights)."""
    build(name, classes, seed=seed).save_pretrained(folder)
    return folder


def inputs(name: str, n: int = 4, seed: int = 0) -> torch.Tensor:
    """A batch for row ``name``: ``[n, 2, SEQ]`` ids and mask (sample 1 right-padded after
    5 tokens) or ``[n, 3, IMAGE, IMAGE]`` pixels."""
    gen = torch.Generator().manual_seed(seed)
    if ARCHITECTURES[name][1] == "image_classification":
        return torch.randn(n, 3, IMAGE, IMAGE, generator=gen)
    ids = torch.randint(3, VOCAB, (n, SEQ), generator=gen)
    mask = torch.ones(n, SEQ, dtype=torch.int64)
    mask[1, 5:] = 0
    ids[1, 5:] = 0
    return torch.stack([ids, mask], 1)


def dataset(name: str, n_train: int = 16, n_test: int = 8, classes: int = 3):
    """(train, test) ``TensorDataset``s for row ``name``: its inputs, labels from them."""

    def split(n: int, seed: int):
        x = inputs(name, n, seed)
        y = (x.flatten(1)[:, 1] * 7).long() % classes if x.dtype == torch.int64 else None
        if y is None:
            y = (x.flatten(1)[:, 0] > 0).long()
        return torch.utils.data.TensorDataset(x, y)

    return split(n_train, 1), split(n_test, 2)


def original_logits(model, x: torch.Tensor) -> torch.Tensor:
    """The unsplit model's logits on a batch of :func:`inputs`."""
    if x.dtype == torch.int64:
        return model(input_ids=x[:, 0], attention_mask=x[:, 1]).logits
    return model(pixel_values=x).logits

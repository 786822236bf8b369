"""Hugging Face transformers as split models: ``model: hf:<folder or hub id>`` (pre-trained
weights, ``from_pretrained`` from a local folder or the Hugging Face cache, never a download at
run time) and ``model: hf-config:<folder or config.json>`` (the architecture with random
weights, for tests and timing).

Every architecture is cut by one mechanism (:mod:`splitfl.models.hf_stack`): between the layers
of its layer stack, as the papers do (ParallelSFL §5: RoBERTa "split at the 3rd layer";
SplitLoRA: GPT-2 after block 3). Block 0 is the prelude (embeddings, masks, position tensors)
and the first layer call, block k the (k+1)-th layer call, the last block the tail (final norm,
pooling, task head), so ``cut: 3`` puts the embeddings and three layers on the device. Inputs
are ``[B, 2, T]`` int64 (token ids and attention mask) for text, ``[B, C, H, W]`` pixels for
image classifiers (at the config's ``image_size``). Labels stay with the server.

Tasks (from the folder's ``architectures``): causal language modelling (``...ForCausalLM``,
``...LMHeadModel``), image classification (``...ForImageClassification``), else sequence
classification. Encoder–decoder models (T5, BART) are refused: their decoder reads the
encoder's output at every layer, so no one stack can be cut.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from splitfl.core.extras import install_extra
from splitfl.models.base import BlockModel
from splitfl.models.hf_stack import Unsplittable, split_stack

#: ``model:`` prefixes: pre-trained weights, or a config with random weights.
PRETRAINED, FROM_CONFIG = "hf:", "hf-config:"
#: The tasks a Hugging Face model is built for (``train.loss``: causal_lm is the language one).
TASKS = ("sequence_classification", "causal_lm", "image_classification")


def missing_hf() -> str:
    """The one line for a missing ``transformers``/``peft``: the install hint from where
    splitfl was installed (a checkout's ``pip install -e '.[hf]'``, a wheel's extras)."""
    return f"model: hf: needs the Hugging Face extra: {install_extra('hf')} (transformers, peft)"


def is_hf_spec(spec: str) -> bool:
    return spec.startswith((PRETRAINED, FROM_CONFIG))


def _transformers():
    try:
        import transformers
    except ImportError as err:  # one line naming the extra
        raise ImportError(missing_hf()) from err
    return transformers


def hf_folder(spec: str) -> str:
    """The folder (or hub id) of ``spec``; a ``config.json`` path names its folder."""
    path = Path(spec.split(":", 1)[1])
    return str(path.parent if path.suffix == ".json" else path)


def hf_config(spec: str):
    """The model's ``PretrainedConfig``, from the folder or the local Hugging Face cache
    (never downloaded). Raises a one-line ``ValueError`` when neither has it."""
    tf = _transformers()
    source = hf_folder(spec)
    try:
        return tf.AutoConfig.from_pretrained(source, local_files_only=True)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"{spec}: no Hugging Face config in {source!r} (a local folder or a model in the "
            f"Hugging Face cache; nothing is downloaded): {str(err).splitlines()[0]}"
        ) from None


def task_of(config) -> str:
    """The task the folder's ``architectures`` name (module docstring)."""
    names = getattr(config, "architectures", None) or []
    if any(n.endswith(("ForCausalLM", "LMHeadModel")) for n in names):
        return "causal_lm"
    if any(n.endswith("ForImageClassification") for n in names):
        return "image_classification"
    return "sequence_classification"


def _auto_class(config, task: str):
    """The transformers Auto class of ``task`` and the model class it builds for ``config``;
    a one-line ``ValueError`` naming why where there is none, or it cannot be split."""
    tf = _transformers()
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(
            f"model type {config.model_type!r} is an encoder-decoder model: its decoder reads "
            "the encoder's output at every layer, so no one layer stack can be cut"
        )
    auto = {
        "causal_lm": tf.AutoModelForCausalLM,
        "image_classification": tf.AutoModelForImageClassification,
    }.get(task, tf.AutoModelForSequenceClassification)
    try:
        cls = auto._model_mapping[type(config)]
    except KeyError:
        raise ValueError(
            f"model type {config.model_type!r} has no {auto.__name__} in transformers "
            f"{tf.__version__} (the {task} task)"
        ) from None
    return auto, cls[0] if isinstance(cls, tuple) else cls


def check_hf_spec(spec: str) -> None:
    """The extra is installed, the config is there and transformers builds its task model."""
    config = hf_config(spec)
    try:
        _auto_class(config, task_of(config))
    except ValueError as err:
        raise ValueError(f"{spec}: {err}") from None


def attention_of(cls, wanted: str) -> str:
    """``wanted`` (``hf.attn_implementation``), or ``eager`` where the model class has no
    SDPA attention."""
    return wanted if wanted == "eager" or getattr(cls, "_supports_sdpa", False) else "eager"


def load_hf_model(spec: str, num_classes: int, attention: str = "sdpa") -> tuple[nn.Module, str]:
    """The task model ``spec`` names and its task (module docstring), with ``attention``
    (:func:`attention_of`) and no key/value cache."""
    config = hf_config(spec)
    task = task_of(config)
    auto, cls = _auto_class(config, task)
    config.use_cache = False
    if task != "causal_lm":
        config.num_labels = num_classes
    attn = attention_of(cls, attention)
    if spec.startswith(FROM_CONFIG):
        return auto.from_config(config, attn_implementation=attn), task
    model = auto.from_pretrained(
        hf_folder(spec),
        config=config,
        local_files_only=True,
        attn_implementation=attn,
        ignore_mismatched_sizes=task != "causal_lm",  # a new head for the data's classes
    )
    return model, task


def lora_config(task: str, lora):
    """peft's ``LoraConfig`` of a ``train.lora`` section for ``task``."""
    try:
        import peft
    except ImportError as err:
        raise ImportError(missing_hf()) from err
    targets = lora.target_modules
    return peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets,  # peft's word
        task_type=_peft_task(task),
        modules_to_save=_image_head(task),
    )


def _peft_task(task: str):
    """peft's task type: its sequence-classification wrapper calls the model with
    ``input_ids``/``attention_mask`` keywords, which an image classifier passes down to its
    layers (Swin's attention then gets ``attention_mask`` twice), so an image classifier has
    none, as in peft's image-classification guide (the head saved by ``modules_to_save``)."""
    import peft

    return {
        "causal_lm": peft.TaskType.CAUSAL_LM,
        "image_classification": None,
    }.get(task, peft.TaskType.SEQ_CLS)


def _image_head(task: str) -> list[str] | None:
    """An image classifier's new head trains too (peft names no head without a task type)."""
    return ["classifier"] if task == "image_classification" else None


def with_lora(model: nn.Module, task: str, lora):
    """``model`` with ``peft`` LoRA adapters injected (``lora``: a ``train.lora`` section):
    the base weights frozen, the adapters and (for classification) the task head trainable.
    Returns the peft model; its ``base_model.model`` is the injected model itself, cut as
    usual."""
    import peft

    return peft.get_peft_model(model, lora_config(task, lora))


def probe_inputs(model: nn.Module, kind: str) -> dict:
    """A tiny batch for :func:`~splitfl.models.hf_stack.probe`: two 4-token rows, the second
    padded at its end (text), or one image of the config's size."""
    config = model.config
    dtype = next(model.parameters()).dtype
    if kind == "pixels":
        size = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
        return {"pixel_values": torch.zeros(1, config.num_channels, size, size, dtype=dtype)}
    ids = (torch.arange(1, 9).reshape(2, 4) % config.vocab_size).long()
    mask = torch.ones(2, 4, dtype=torch.long)
    mask[1, 3] = 0
    ids[1, 3] = config.pad_token_id if config.pad_token_id is not None else 0
    return {"input_ids": ids, "attention_mask": mask}


def hf_block_model(spec: str, num_classes: int, lora=None, hf=None) -> BlockModel:
    """``spec`` as a :class:`BlockModel` cut between layer calls (cut points 1..L), with
    LoRA adapters where ``lora`` (``train.lora``) is given (:func:`with_lora`); ``hf`` is the
    ``hf`` config section (attention implementation, tied weights; defaults when None)."""
    attention = hf.attn_implementation if hf is not None else "sdpa"
    tied = hf.tied_weights if hf is not None else "copy"
    model, task = load_hf_model(spec, num_classes, attention)
    peft_model = None
    if lora is not None:
        peft_model = with_lora(model, task, lora)
        model = peft_model.base_model.model
    kind = "pixels" if model.main_input_name == "pixel_values" else "text"
    try:
        blocks, prefixes, plan = split_stack(model, probe_inputs(model, kind), kind, tied)
    except Unsplittable as err:
        raise Unsplittable(f"{spec}: cannot be split: {err}") from None
    layers = len(blocks) - 1
    out = BlockModel(blocks, range(1, layers + 1), name=spec, default_cut=min(3, layers))
    out.input_dtype = torch.int64 if kind == "text" else torch.float32
    out.origin = "hf"
    out.task = task
    out.attention = model.config._attn_implementation
    out.crossing = _crossing(plan)
    #: the base weights stay on every device (LoRA): only trainable tensors are model traffic
    out.frozen_base = lora is not None
    out.user_names = _user_names(out, prefixes)
    out.__dict__["peft_model"] = peft_model  # not a submodule: for the adapter's export
    return out


def _crossing(plan) -> str:
    """What crosses every cut, in words (``splitfl validate`` lists it)."""
    if plan.inputs == "pixels":
        return "the hidden states (float)"
    ids = ", the token ids [T] int64 (the model's tail pools its last non-padding token)"
    return "the hidden states [T, H] (float), the padding mask [T] int64" + (
        ids if plan.carry_ids else ""
    )


def _user_names(model: BlockModel, prefixes: dict[int, dict[str, str]]) -> dict[str, str]:
    """``blocks.<i>...`` key -> the task model's own state-dict key. A layer run at several
    depths under ``tied_weights: copy`` (ALBERT) has one copy per depth: the second and later
    are named ``<layer>@<depth>.…`` (the model's class has no place for them)."""
    names: dict[str, str] = {}
    taken: dict[str, int] = {}
    for key, tensor in model.state_dict(keep_vars=True).items():
        _, i, rest = key.split(".", 2)
        for prefix, own in prefixes.get(int(i), {}).items():
            if rest.startswith(prefix):
                name = own + rest[len(prefix) :]
                if taken.setdefault(name, id(tensor)) != id(tensor):
                    name = f"{own[:-1]}@{i}.{rest[len(prefix) :]}"
                names[key] = name
                break
    return names

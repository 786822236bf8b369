"""Hugging Face transformers as split models: ``model: hf:<folder or hub id>`` (pre-trained
weights, ``from_pretrained`` from a local folder or the Hugging Face cache, never a download at
run time) and ``model: hf-config:<folder or config.json>`` (the architecture with random
weights, for tests and timing).

The model is cut in transformer layers, as the papers do (ParallelSFL §5: RoBERTa "split at the
3rd layer"; SplitLoRA: GPT-2 after block 3): block 0 is the embeddings and the first layer,
block k the (k+1)-th layer, the last block the final norm and the task head, so ``cut: 3`` puts
the embeddings and three layers on the device. The tensors that cross a cut are the hidden
states and the ``[B, T]`` attention mask (the padding); every layer block rebuilds the 4-D
additive mask it needs from it (bidirectional for encoders, causal for decoders), and decoders'
layers recompute their position ids (right padding) and, for Llama, the rotary embeddings.
Labels stay with the server. Inputs are ``[B, 2, T]`` int64: token ids and attention mask.

Why by layers and not by graph: ``torch.fx`` cannot trace transformers 5's models ("co_varnames
is too small") and transformers 5 dropped its own fx tracer; ``torch.export`` bakes the
train/eval mode into the graph. The layer modules are the user's own modules, called as the
model's ``forward`` calls them; ``tests/test_hf_models.py`` checks that device ∘ server equals
the original model in float64, in train and eval mode, with padding, for each family.

Families (``config.model_type``): ``bert``, ``roberta`` (sequence classification),
``gpt2``, ``llama`` (causal language modelling, or sequence classification on the last
non-padding token). GPT-2 ties its output head to its input embedding; a split cannot share a
tensor across the cut, so the server's head starts as a copy (with LoRA both stay frozen).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from splitfl.models.base import BlockModel

#: ``model:`` prefixes: pre-trained weights, or a config with random weights.
PRETRAINED, FROM_CONFIG = "hf:", "hf-config:"
#: The tasks a Hugging Face model is built for (``train.loss``: causal_lm is the language one).
TASKS = ("sequence_classification", "causal_lm")
MISSING = "model: hf: needs the Hugging Face extra: pip install -e '.[hf]' (transformers, peft)"


def is_hf_spec(spec: str) -> bool:
    return spec.startswith((PRETRAINED, FROM_CONFIG))


def _transformers():
    try:
        import transformers
    except ImportError as err:  # one line naming the extra
        raise ImportError(MISSING) from err
    return transformers


def additive_mask(mask: torch.Tensor, dtype: torch.dtype, causal: bool) -> torch.Tensor:
    """``[B, 1, 1, T]`` (bidirectional) or ``[B, 1, T, T]`` (causal) additive mask from the
    ``[B, T]`` padding mask: 0 where attention is allowed, the dtype's minimum elsewhere."""
    allowed = mask[:, None, None, :].bool()
    if causal:
        t = mask.shape[-1]
        allowed = allowed & torch.ones(t, t, dtype=torch.bool, device=mask.device).tril()
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    return zero.masked_fill(~allowed, torch.finfo(dtype).min).expand(allowed.shape).contiguous()


@dataclass(frozen=True)
class Family:
    """Where a model type keeps its parts (attribute paths from the task model)."""

    base: str  # the base model's attribute on the task model
    causal: bool


FAMILIES = {
    "bert": Family("bert", False),
    "roberta": Family("roberta", False),
    "gpt2": Family("transformer", True),
    "llama": Family("model", True),
}


def _layer_output(out) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out


class Embed(nn.Module):
    """Token (and position) embeddings, then the first layer's input: ``(hidden, mask)``."""

    def __init__(self, model: nn.Module, family: str):
        super().__init__()
        base = getattr(model, FAMILIES[family].base)
        self.family = family
        if family in ("bert", "roberta"):
            self.embeddings = base.embeddings
        elif family == "gpt2":
            self.wte, self.wpe, self.drop = base.wte, base.wpe, base.drop
        else:
            self.embed_tokens = base.embed_tokens

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = x[:, 0], x[:, 1]
        if self.family in ("bert", "roberta"):
            return self.embeddings(input_ids=ids), mask
        if self.family == "gpt2":
            positions = torch.arange(ids.shape[1], device=ids.device)[None]
            return self.drop(self.wte(ids) + self.wpe(positions)), mask
        return self.embed_tokens(ids), mask


class Layer(nn.Module):
    """One transformer layer on ``(hidden, mask)``; the mask passes through."""

    def __init__(self, layer: nn.Module, family: str, rotary: nn.Module | None = None):
        super().__init__()
        self.layer, self.family = layer, family
        self.causal = FAMILIES[family].causal
        self.rotary = rotary

    def forward(
        self, hidden: torch.Tensor, mask: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        attn = additive_mask(mask, hidden.dtype, self.causal)
        if self.family == "llama":
            b, t = mask.shape
            positions = torch.arange(t, device=mask.device)[None].expand(b, t)
            rope = self.rotary(hidden, positions)
            out = self.layer(
                hidden, attention_mask=attn, position_embeddings=rope, position_ids=positions
            )
        else:
            out = self.layer(hidden, attention_mask=attn)
        return _layer_output(out), mask


class Head(nn.Module):
    """Final norm and task head: logits ``[B, C]`` (classification) or ``[B, T, V]``."""

    def __init__(self, model: nn.Module, family: str, task: str):
        super().__init__()
        base = getattr(model, FAMILIES[family].base)
        self.family, self.task = family, task
        self.norm = {"gpt2": getattr(base, "ln_f", None), "llama": getattr(base, "norm", None)}.get(
            family
        )
        if family == "bert":
            self.pooler, self.dropout = base.pooler, model.dropout
        if family in ("bert", "roberta"):
            self.classifier = model.classifier
        elif task == "causal_lm":
            self.lm_head = _untied(model.lm_head)
        else:
            self.score = model.score

    def forward(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        if self.family == "bert":
            return self.classifier(self.dropout(self.pooler(hidden)))
        if self.family == "roberta":
            return self.classifier(hidden)
        hidden = self.norm(hidden)
        if self.task == "causal_lm":
            return self.lm_head(hidden)
        logits = self.score(hidden)  # the last non-padding token's (right padding)
        last = mask.long().sum(1).clamp(min=1) - 1
        return logits[torch.arange(logits.shape[0], device=logits.device), last]


class First(nn.Module):
    """Block 0: the embeddings, then the first layer."""

    def __init__(self, embed: Embed, layer: Layer):
        super().__init__()
        self.embed, self.layer = embed, layer

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layer(*self.embed(x))


def _untied(head: nn.Linear) -> nn.Linear:
    """A copy of ``head`` whose weight is its own tensor (GPT-2 ties it to the input
    embedding; see the module docstring)."""
    out = copy.deepcopy(head)
    out.weight = nn.Parameter(head.weight.detach().clone(), head.weight.requires_grad)
    return out


def split_blocks(model: nn.Module, task: str) -> list[nn.Module]:
    """The model as ``[embeddings + layer 0, layer 1, ..., layer L-1, norm + head]``."""
    family = model.config.model_type
    if family not in FAMILIES:
        raise ValueError(
            f"model type {family!r} is not supported (supported: {', '.join(FAMILIES)})"
        )
    base = getattr(model, FAMILIES[family].base)
    if family in ("bert", "roberta"):
        layers = list(base.encoder.layer)
    elif family == "gpt2":
        layers = list(base.h)
    else:
        layers = list(base.layers)
    rotary = getattr(base, "rotary_emb", None)
    wrapped = [
        Layer(layer, family, copy.deepcopy(rotary) if rotary is not None else None)
        for layer in layers
    ]
    return [First(Embed(model, family), wrapped[0]), *wrapped[1:], Head(model, family, task)]


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
    """``causal_lm`` for a model saved as a causal LM (``architectures`` ``...ForCausalLM``
    or ``...LMHeadModel``), else ``sequence_classification``."""
    names = getattr(config, "architectures", None) or []
    causal = any(n.endswith(("ForCausalLM", "LMHeadModel")) for n in names)
    return "causal_lm" if causal else "sequence_classification"


def check_hf_spec(spec: str) -> None:
    """The extra is installed, the config is there and its model type is supported."""
    config = hf_config(spec)
    if config.model_type not in FAMILIES:
        raise ValueError(
            f"{spec}: model type {config.model_type!r} is not supported "
            f"(supported: {', '.join(FAMILIES)})"
        )


def load_hf_model(spec: str, num_classes: int) -> tuple[nn.Module, str]:
    """The task model ``spec`` names and its task (module docstring), eager attention."""
    tf = _transformers()
    config = hf_config(spec)
    task = task_of(config)
    auto = tf.AutoModelForCausalLM if task == "causal_lm" else tf.AutoModelForSequenceClassification
    config._attn_implementation = "eager"
    if task != "causal_lm":
        config.num_labels = num_classes
    if spec.startswith(FROM_CONFIG):
        return auto.from_config(config), task
    return auto.from_pretrained(hf_folder(spec), config=config, local_files_only=True), task


def with_lora(model: nn.Module, task: str, lora) -> nn.Module:
    """``model`` with ``peft`` LoRA adapters injected (``lora``: a ``train.lora`` section):
    the base weights frozen, the adapters and (for classification) the task head trainable.
    Returns the injected model itself (``get_peft_model(...).base_model.model``), whose
    modules :func:`split_blocks` cuts as usual."""
    try:
        import peft
    except ImportError as err:
        raise ImportError(MISSING) from err
    task_type = peft.TaskType.CAUSAL_LM if task == "causal_lm" else peft.TaskType.SEQ_CLS
    config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=lora.target_modules,
        task_type=task_type,
    )
    return peft.get_peft_model(model, config).base_model.model


def hf_block_model(spec: str, num_classes: int, lora=None) -> BlockModel:
    """``spec`` as a :class:`BlockModel` cut between layers (cut points 1..L), with LoRA
    adapters where ``lora`` (``train.lora``) is given (:func:`with_lora`)."""
    model, task = load_hf_model(spec, num_classes)
    if lora is not None:
        model = with_lora(model, task, lora)
    blocks = split_blocks(model, task)
    layers = len(blocks) - 1
    out = BlockModel(blocks, range(1, layers + 1), name=spec, default_cut=min(3, layers))
    out.input_dtype = torch.int64
    out.origin = "hf"
    out.task = task
    #: the base weights stay on every device (LoRA): only trainable tensors are model traffic
    out.frozen_base = lora is not None
    out.user_names = _original_names(model, out)
    return out


def _original_names(model: nn.Module, blocks: BlockModel) -> dict[str, str]:
    """``blocks.<i>...`` key -> the task model's own state-dict key (the same tensor); the
    server's untied head keeps the name ``lm_head.*`` (``model.pt`` loads into the original
    model with ``load_state_dict``)."""
    original: dict[int, list[str]] = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        original.setdefault(id(tensor), []).append(name)
    names = {}
    for key, tensor in blocks.state_dict(keep_vars=True).items():
        if id(tensor) in original:  # a tied tensor has several names: the one ending like key
            names[key] = max(original[id(tensor)], key=lambda n: _common_suffix(n, key))
        elif ".lm_head." in key:
            names[key] = "lm_head." + key.rpartition(".lm_head.")[2]
    return names


def _common_suffix(a: str, b: str) -> int:
    """How many trailing dotted components ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(reversed(a.split(".")), reversed(b.split(".")), strict=False):
        if x != y:
            break
        n += 1
    return n

"""A trained Hugging Face model back in the ecosystem's formats (issue 48 item 3).

Full fine-tuning: ``model.pt`` is the model's own state dict (its own keys), which loads with
``load_state_dict(strict=True)`` into the folder's Auto class. LoRA (``train.lora``): the run
also writes ``adapter/``, peft's ``save_pretrained`` folder (``adapter_config.json``,
``adapter_model.safetensors``: the adapters and the trained task head), which
``PeftModel.from_pretrained(base, "adapter")`` loads; and ``model.pt`` is the merged model
(peft's ``merge_and_unload``: adapters folded into the base weights), whose state dict loads
strictly into the base model's class. ALBERT under ``hf.tied_weights: copy`` holds one copy of
its layer group per depth (:mod:`splitfl.models.hf_stack`), which neither form has a place for:
its ``model.pt`` keeps those copies under ``<layer>@<depth>`` names and no adapter is written.
"""

from __future__ import annotations

import copy
import os
import shutil
from pathlib import Path

import torch

from splitfl.models.base import BlockModel

ADAPTER = "adapter"


def exported_state(
    model: BlockModel, state: dict[str, torch.Tensor], run_dir: Path
) -> dict[str, torch.Tensor]:
    """``model.pt``'s tensors for ``state`` (the user's own names,
    :func:`~splitfl.models.base.user_state_dict`); for a LoRA model, ``adapter/`` written in
    ``run_dir`` first and the merged model's state returned (module docstring)."""
    peft_model = model.__dict__.get("peft_model")
    if peft_model is None or any("@" in key for key in state):
        return state
    work = copy.deepcopy(peft_model)
    work.base_model.model.load_state_dict(state, strict=True)
    tmp = run_dir / f".{ADAPTER}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    work.save_pretrained(tmp)
    final = run_dir / ADAPTER
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    merged = work.merge_and_unload()
    return {k: v.detach().clone() for k, v in merged.state_dict().items()}

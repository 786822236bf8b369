"""Issue 48 item 2: every architecture of ``hf_catalog`` (decoder LMs and sequence
classifiers, encoder classifiers, image classifiers; tiny, random weights) is cut by the one
mechanism of :mod:`splitfl.models.hf_stack`: device ∘ server equals the model bit for bit in
float64, in train mode (dropout drawing the same masks) and eval mode, with padding, with eager
and SDPA attention; one round of SplitFed V1 and of S²FL trains it; encoder–decoder models are
refused in one line naming why."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_map

pytest.importorskip("transformers")

import hf_catalog as catalog  # noqa: E402
import splitfl  # noqa: E402
from hf_fixtures import save_tokenizer, write_lines  # noqa: E402
from splitfl.config import ConfigError  # noqa: E402
from splitfl.models.base import run_block  # noqa: E402
from splitfl.models.hf import attention_of, probe_inputs  # noqa: E402
from splitfl.models.hf_stack import Unsplittable, split_stack  # noqa: E402

NAMES = sorted(catalog.ARCHITECTURES)


def _kind(name: str) -> str:
    return "pixels" if catalog.ARCHITECTURES[name][1] == "image_classification" else "text"


def _compare(name: str, attn: str, dtype: torch.dtype) -> dict[bool, float]:
    """Largest |split − model| of the logits in eval and train mode (same seed for dropout)."""
    model = catalog.build(name, attn=attn).to(dtype)
    blocks, _, _ = split_stack(model, probe_inputs(model, _kind(name)), _kind(name))
    blocks = torch.nn.ModuleList(blocks)
    x = catalog.inputs(name)
    x = x.to(dtype) if x.is_floating_point() else x
    out = {}
    for train in (False, True):
        model.train(train)
        torch.manual_seed(1)
        want = catalog.original_logits(model, x)
        torch.manual_seed(1)  # dropout draws in the same order
        h = x
        for block in blocks:
            h = run_block(block, h)
        if want.dim() == 3:  # causal LM: the padding positions' logits are not used
            real = x[:, 1].bool()
            h, want = h[real], want[real]
        assert h.shape == want.shape and torch.isfinite(want).all()
        out[train] = (h - want).abs().max().item()
    return out


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("name", NAMES)
def test_device_then_server_is_the_model_bit_for_bit(name, attn):
    """float64; ModernBERT's own eager attention gives NaN for a padded row in float64
    (transformers 5.24, the unsplit model too), so its eager case is compared in float32."""
    dtype = torch.float32 if (name, attn) == ("modernbert", "eager") else torch.float64
    assert _compare(name, attn, dtype) == {False: 0.0, True: 0.0}


def test_sdpa_falls_back_to_eager_only_where_the_model_lacks_it():
    import transformers as tf

    assert attention_of(tf.LlamaForCausalLM, "sdpa") == "sdpa"
    assert attention_of(tf.LlamaForCausalLM, "eager") == "eager"
    assert attention_of(tf.DebertaV2ForSequenceClassification, "sdpa") == "eager"
    assert catalog.build("llama-lm", attn="sdpa").config._attn_implementation == "sdpa"


def _text_data():
    return catalog.dataset("llama-cls", classes=2)


def _image_folder(root: Path) -> Path:
    """``train``/``test`` folders of 16×16 RGB PNGs in two classes."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("test", 2)):
        for c in ("cat", "dog"):
            (root / split / c).mkdir(parents=True)
            for i in range(n):
                arr = rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)
                Image.fromarray(arr).save(root / split / c / f"{i}.png")
    return root


def round_config(name: str, folder: Path, algorithm: str, tmp_path: Path) -> dict:
    """One round of ``algorithm`` on the tiny model in ``folder`` and data for its task."""
    task = catalog.ARCHITECTURES[name][1]
    train = {"clients_per_round": 2, "batch_size": 4, "lr": 0.05, "local_steps": 1}
    data: dict = {"num_clients": 2, "partition": "iid", "min_samples": 2}
    if task == "image_classification":
        data |= {"dataset": "imgs", "format": "image_folder", "root": str(tmp_path / "img")}
        data["image_size"] = [catalog.IMAGE, catalog.IMAGE]
        if not (tmp_path / "img").exists():
            _image_folder(tmp_path / "img")
    elif task == "causal_lm":  # next-token targets of a .jsonl's lines, a tokenizer's ids
        if not (tmp_path / "lines").exists():
            write_lines(tmp_path / "lines", copies=2)
            save_tokenizer(tmp_path / "tok")
        data |= {"dataset": "lines", "format": "text", "root": str(tmp_path / "lines")}
        data |= {"text_columns": ["text"], "text_target": "next_token", "max_length": 8}
        data["tokenizer"] = str(tmp_path / "tok")
        train["loss"] = "causal_lm"
    else:
        data["dataset"] = "test_hf_architectures:_text_data"
    return {
        "model": f"hf-config:{folder}",
        "algorithm": algorithm,
        "rounds": 1,
        "seed": 0,
        "data": data,
        "train": train,
        "eval": {"metrics": ["perplexity"]} if task == "causal_lm" else {},
        "output": {"progress": False, "plots": False},
        "import_dirs": [str(Path(__file__).parents[1])],
    }


@pytest.mark.parametrize("name", NAMES)
def test_one_round_of_splitfed_v1_and_s2fl_trains(tmp_path, name):
    """S²FL groups clients by their class counts (Eq. 2): a causal LM has no class labels,
    so S²FL refuses it in one line (its sequence classifier of the same family trains)."""
    folder = catalog.save(name, tmp_path / "model", classes=2)
    algorithms = ["splitfed_v1", "s2fl"]
    if catalog.ARCHITECTURES[name][1] == "causal_lm":
        with pytest.raises(ConfigError, match=r"^train.loss: s2fl's .* needs class labels"):
            splitfl.validate(round_config(name, folder, "s2fl", tmp_path))
        algorithms.remove("s2fl")
    for algorithm in algorithms:
        cfg = round_config(name, folder, algorithm, tmp_path)
        res = splitfl.run(cfg, run_dir=tmp_path / algorithm, progress=False)
        (row,) = res.metrics
        assert math.isfinite(row["train_loss"]) and row["train_loss"] > 0
        trained = torch.load(tmp_path / algorithm / "model.pt", weights_only=True)
        initial = catalog.build(name, classes=2)
        if name != "albert":  # ALBERT: one copy of its layer group per depth (test_hf_export)
            initial.load_state_dict(trained, strict=True)  # issue 48 item 3
            initial = catalog.build(name, classes=2)
        initial = initial.state_dict()
        moved = [k for k in trained if k in initial and not torch.equal(trained[k], initial[k])]
        assert moved, "nothing trained"


@pytest.mark.parametrize("model_type", sorted(catalog.REFUSED))
def test_encoder_decoder_models_are_refused_in_one_line(tmp_path, model_type):
    import transformers as tf

    architecture, overrides = catalog.REFUSED[model_type]
    config = tf.AutoConfig.for_model(model_type, **overrides)
    config.architectures = [architecture]
    config.save_pretrained(tmp_path / model_type)
    with pytest.raises(ConfigError, match=r"^model: .*is an encoder-decoder model: ") as err:
        splitfl.validate({"model": f"hf-config:{tmp_path / model_type}"})
    assert "\n" not in str(err.value)


def test_layers_handed_weights_made_before_the_stack_are_refused_unless_frozen():
    """DeBERTa-v2 with relative attention (DeBERTa-v3's setting) hands every layer the
    relative-position embeddings, made from trainable weights before the stack: refused in
    full fine-tuning, naming them, unless ``hf.tied_weights: frozen`` freezes them."""
    import transformers as tf

    config = catalog.build_config("deberta-v2")
    config.relative_attention, config.pos_att_type = True, ["p2c", "c2p"]
    model = tf.AutoModelForSequenceClassification.from_config(config).to(torch.float64)
    with pytest.raises(Unsplittable, match="trainable weights before the stack") as err:
        split_stack(model, probe_inputs(model, "text"), "text")
    behind = ["deberta.encoder.rel_embeddings.weight"]  # (norm_rel_ebd: none here)
    assert all(name in str(err.value) for name in behind), err.value
    assert "hf.tied_weights: frozen" in str(err.value)
    # hf.tied_weights: frozen freezes them: the split is the model with them frozen
    blocks, _, _ = split_stack(model, probe_inputs(model, "text"), "text", "frozen")
    assert not any(model.get_parameter(n).requires_grad for n in behind)
    x = catalog.inputs("deberta-v2")
    for train in (False, True):
        model.train(train)
        torch.manual_seed(1)
        want = catalog.original_logits(model, x)
        torch.manual_seed(1)
        h = x
        for block in blocks:
            h = run_block(block, tree_map(lambda t: t.detach().clone(), h))
        assert torch.equal(h, want), train


def test_deberta_relative_attention_splits_with_lora_or_frozen_embeddings(tmp_path):
    """With ``train.lora`` (how DeBERTa-v3 is fine-tuned) the relative-position embeddings
    are frozen base weights, so the server side rebuilds them exactly from its own copy:
    device ∘ server equals the peft model in float64 (train and eval mode, padding), and one
    round of SplitFed V1 trains only adapters and the head."""
    import transformers as tf

    from splitfl.config.schema import LoraConfig
    from splitfl.models.hf import hf_block_model

    config = catalog.build_config("deberta-v2")
    config.relative_attention, config.pos_att_type = True, ["p2c", "c2p"]
    config.architectures = ["DebertaV2ForSequenceClassification"]
    torch.manual_seed(0)
    tf.AutoModelForSequenceClassification.from_config(config).save_pretrained(tmp_path / "deb")
    lora = LoraConfig(r=4, target_modules=["query_proj", "value_proj"])
    split = hf_block_model(f"hf-config:{tmp_path / 'deb'}", 2, lora=lora).to(torch.float64)
    peft_model = split.__dict__["peft_model"]
    x = catalog.inputs("deberta-v2")
    for train in (False, True):
        split.train(train), peft_model.train(train)
        torch.manual_seed(1)
        want = catalog.original_logits(peft_model, x)
        torch.manual_seed(1)
        h = x
        for block in split.blocks:  # each crossing a copy, as on the wire: the receiving
            h = run_block(block, tree_map(lambda t: t.detach().clone(), h))  # side rebuilds
        assert torch.equal(h, want), (train, (h - want).abs().max())
    cfg = round_config("deberta-v2", tmp_path / "deb", "splitfed_v1", tmp_path)
    cfg["train"]["lora"] = {"r": 4, "target_modules": ["query_proj", "value_proj"]}
    result = splitfl.run(cfg, run_dir=tmp_path / "run", progress=False)
    assert result.summary["status"] == "ok" and math.isfinite(result.metrics[0]["train_loss"])
    del cfg["train"]["lora"]  # full fine-tuning: refused, unless the embeddings are frozen
    with pytest.raises(ConfigError, match="or set hf.tied_weights: frozen"):
        splitfl.validate(cfg)
    cfg["hf"] = {"tied_weights": "frozen"}
    result = splitfl.run(cfg, run_dir=tmp_path / "full", progress=False)
    assert result.summary["status"] == "ok" and math.isfinite(result.metrics[0]["train_loss"])


def test_validate_lists_what_crosses_each_cut(tmp_path):
    """A decoder classifier's tail pools the last non-padding token from the ids, so they
    cross; an encoder's do not."""
    for name, ids in (("qwen2-cls", True), ("bert", False)):
        folder = catalog.save(name, tmp_path / name, classes=2)
        text = splitfl.validate(round_config(name, folder, "splitfed_v1", tmp_path))
        line = next(x for x in text.splitlines() if x.startswith("note: model: "))
        assert "sdpa attention" in line and "the padding mask [T] int64" in line
        assert ("token ids" in line) == ids

"""Issue 48 items 3 and 4: a trained Hugging Face model back in the ecosystem's formats
(``model.pt`` strict into the Auto class; LoRA: peft's ``adapter/`` and the merged model),
string labels named in ``data.json``, and the two ways a tied tensor crosses the cut."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytest.importorskip("peft")

from test_hf_architectures import round_config  # noqa: E402

import hf_catalog as catalog  # noqa: E402
import splitfl  # noqa: E402
from hf_fixtures import save_tokenizer, write_lines, write_qnli  # noqa: E402
from splitfl.data.source import read_dataset  # noqa: E402
from splitfl.experiment.runner import as_config  # noqa: E402


def _run(tmp_path: Path, name: str, spec: str, **more) -> Path:
    """Two rounds of SplitFed V1 on row ``name`` of the catalog saved in ``spec``'s folder."""
    folder = catalog.save(name, tmp_path / "model", classes=2)
    cfg = round_config(name, folder, "splitfed_v1", tmp_path)
    cfg["model"] = f"{spec}:{folder}"
    cfg["rounds"] = 2
    cfg["options"] = {"splitfed_v1": {"cut": 2}}  # a layer on each side (LoRA trains both)
    cfg["train"] = {**cfg["train"], "lr": 0.5, **more.pop("train", {})}
    cfg.update(more)
    run = tmp_path / "run"
    splitfl.run(cfg, run_dir=run, progress=False)
    return run


def _logits(model, name: str) -> torch.Tensor:
    with torch.no_grad():
        return catalog.original_logits(model.eval(), catalog.inputs(name))


@pytest.mark.parametrize("name", ["llama-lm", "bert", "swin"])
def test_lora_writes_a_peft_adapter_and_a_merged_model(tmp_path, name):
    """``PeftModel.from_pretrained(base, run/adapter)`` loads the adapters; ``model.pt`` is
    the merged model, strict into the base class, computing what the adapted model does. An
    image classifier's adapter has no peft task type (Swin's layers got ``attention_mask``
    twice under peft's sequence-classification wrapper)."""
    from peft import PeftModel

    lora = {"r": 2, "alpha": 4.0}
    if name == "swin":  # peft knows no default target modules for Swin
        lora["target_modules"] = ["q_proj", "v_proj"]
    run = _run(tmp_path, name, "hf", train={"lora": lora})
    auto = catalog.auto_class(catalog.ARCHITECTURES[name][1])
    folder = tmp_path / "model"
    adapted = PeftModel.from_pretrained(auto.from_pretrained(folder), run / "adapter")
    assert (run / "adapter" / "adapter_config.json").is_file()
    merged = auto.from_pretrained(folder)
    merged.load_state_dict(torch.load(run / "model.pt", weights_only=True), strict=True)
    base = _logits(auto.from_pretrained(folder), name)
    want = _logits(adapted, name)
    assert (want - base).abs().max() > 1e-4  # the adapters (and head) trained
    torch.testing.assert_close(_logits(merged, name), want, rtol=0, atol=1e-5)


def test_full_fine_tuning_model_pt_is_the_trained_model(tmp_path):
    """Full fine-tuning: ``model.pt`` strict into the Auto class; no adapter folder."""
    run = _run(tmp_path, "qwen2-cls", "hf")
    config = catalog.build_config("qwen2-cls", classes=2)
    model = catalog.auto_class("sequence_classification").from_config(config)
    model.load_state_dict(torch.load(run / "model.pt", weights_only=True), strict=True)
    assert not (run / "adapter").exists()


@pytest.mark.parametrize("tied", ["copy", "frozen"])
def test_a_tied_head_across_the_cut(tmp_path, tied):
    """GPT-2's head is its input embedding. ``copy`` (the SplitLoRA code's): the server's head
    trains on its own, so it and the embedding differ after training, and ``model.pt`` loads
    into the class untied (``tie_word_embeddings=False``). ``frozen``: one tensor, unchanged."""
    run = _run(tmp_path, "gpt2-lm", "hf", hf={"tied_weights": tied})
    saved = torch.load(run / "model.pt", weights_only=True)
    initial = catalog.build("gpt2-lm", classes=2).state_dict()["transformer.wte.weight"]
    head, embedding = saved["lm_head.weight"], saved["transformer.wte.weight"]
    if tied == "frozen":
        assert torch.equal(head, embedding) and torch.equal(head, initial)
    else:
        assert not torch.equal(head, embedding)
        assert not torch.equal(head, initial) and not torch.equal(embedding, initial)
    config = catalog.build_config("gpt2-lm")
    config.tie_word_embeddings = tied == "frozen"
    model = catalog.auto_class("causal_lm").from_config(config)
    model.load_state_dict(saved, strict=True)
    assert torch.equal(model.lm_head.weight, head)
    assert torch.equal(model.transformer.wte.weight, embedding)


def test_albert_shared_layer_under_each_tied_rule(tmp_path):
    """ALBERT runs one layer group at every depth. ``frozen``: one tensor, ``model.pt`` strict
    into ALBERT's class. ``copy``: one copy per depth, named ``<layer>@<depth>``."""
    run = _run(tmp_path, "albert", "hf", hf={"tied_weights": "frozen"})
    config = catalog.build_config("albert", classes=2)
    model = catalog.auto_class("sequence_classification").from_config(config)
    model.load_state_dict(torch.load(run / "model.pt", weights_only=True), strict=True)
    folder = tmp_path / "copy"
    folder.mkdir()
    run = _run(folder, "albert", "hf")
    keys = torch.load(run / "model.pt", weights_only=True)
    assert any("albert_layer_groups.0@1." in k for k in keys)
    assert any("albert_layer_groups.0@2." in k for k in keys)


def test_bad_hf_values_are_one_line_naming_the_field():
    with pytest.raises(splitfl.config.ConfigError, match=r"^hf.attn_implementation: unknown"):
        splitfl.validate({"hf": {"attn_implementation": "flash"}})
    with pytest.raises(splitfl.config.ConfigError, match=r"^hf.tied_weights: unknown"):
        splitfl.validate({"hf": {"tied_weights": "shared"}})


def test_string_labels_are_class_names_in_label_order(tmp_path):
    """TSV (QNLI's), JSONL and CSV string labels: ``class_names`` sorted, label k the k-th
    name, and ``data.json`` says so."""
    tok = save_tokenizer(tmp_path / "tok")
    qnli = write_qnli(tmp_path / "QNLI")
    lines = write_lines(tmp_path / "lines")
    for split in ("train", "test"):  # a label per line: "b-long" or "a-short"
        path = lines / f"{split}.jsonl"
        rows = [json.loads(r) for r in path.read_text().splitlines()]
        labels = ["b-long" if len(r["text"]) > 25 else "a-short" for r in rows]
        out = [json.dumps({**r, "label": lab}) for r, lab in zip(rows, labels, strict=True)]
        path.write_text("\n".join(out) + "\n")
    csv = tmp_path / "csv"
    csv.mkdir()
    for split in ("train", "test"):
        rows = [f"{i},{i * 2},{'yes' if i % 2 else 'no'}" for i in range(8)]
        (csv / f"{split}.csv").write_text("a,b,label\n" + "\n".join(rows) + "\n")
    text = {"format": "text", "tokenizer": str(tok), "max_length": 8}
    cases = {
        "tsv": ({**text, "root": str(qnli), "text_columns": ["question", "sentence"]}, 0),
        "jsonl": ({**text, "root": str(lines), "text_columns": ["text"]}, 0),
        "csv": ({"format": "csv", "root": str(csv)}, 0),
    }
    want = {
        "tsv": ("entailment", "not_entailment"),
        "jsonl": ("a-short", "b-long"),
        "csv": ("no", "yes"),
    }
    for fmt, (data, _) in cases.items():
        bundle = read_dataset(as_config({"data": {"dataset": fmt, **data}}).data)
        assert bundle.class_names == want[fmt]
    row = next(r for r in (lines / "train.jsonl").read_text().splitlines())
    bundle = read_dataset(as_config({"data": {"dataset": "j", **cases["jsonl"][0]}}).data)
    assert bundle.train.y[0].item() == want["jsonl"].index(json.loads(row)["label"])
    cfg = {
        "model": "mlp",
        "algorithm": "fedavg",
        "rounds": 1,
        "data": {"dataset": "mine", "num_clients": 2, "min_samples": 2, **cases["csv"][0]},
        "train": {"clients_per_round": 2},
        "output": {"progress": False, "plots": False},
    }
    splitfl.run(cfg, run_dir=tmp_path / "run", progress=False)
    record = json.loads((tmp_path / "run" / "data.json").read_text())
    assert record["class_names"] == ["no", "yes"]
    assert record["class_order"].startswith("label k is class_names[k]")

"""Hugging Face transformers cut in layers (issue 33 item 1): device ∘ server is the original
model (float64, train and eval mode, with padding) for RoBERTa, BERT, GPT-2 and Llama; the
trained weights load back into the user's model; ``hf-config:`` runs end to end."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")

import splitfl  # noqa: E402
from hf_fixtures import (  # noqa: E402
    save_tiny,
    save_tokenizer,
    tiny_model,
    token_batch,
    write_lines,
    write_qnli,
)
from splitfl.algorithms import algorithm_names  # noqa: E402
from splitfl.config import ConfigError, LoraConfig  # noqa: E402
from splitfl.data.tokens import next_tokens  # noqa: E402
from splitfl.experiment.runner import as_config, prepare  # noqa: E402
from splitfl.extensions import profile_model  # noqa: E402
from splitfl.models.base import run_block, split, user_state_dict  # noqa: E402
from splitfl.models.hf import hf_block_model, probe_inputs  # noqa: E402
from splitfl.models.hf_stack import split_stack  # noqa: E402
from splitfl.net.server.testbed import Testbed  # noqa: E402
from splitfl.testing import config_for  # noqa: E402
from splitfl.training.losses import IGNORE, loss_fn  # noqa: E402

DEVICES = {"d0": [0, 3, 6, 9], "d1": [1, 4, 7, 10], "d2": [2, 5, 8, 11]}
KINDS = {
    "roberta": "sequence_classification",
    "bert": "sequence_classification",
    "gpt2": "causal_lm",
    "gpt2-cls": "sequence_classification",
    "llama": "causal_lm",
}


@pytest.mark.parametrize("kind", sorted(KINDS))
@pytest.mark.parametrize("train", [False, True])
def test_device_then_server_is_the_original_model(kind, train):
    torch.manual_seed(0)
    model = tiny_model(kind).double().train(train)
    blocks, _, _ = split_stack(model, probe_inputs(model, "text"), "text")
    blocks = torch.nn.ModuleList(blocks).double().train(train)
    x = token_batch()
    torch.manual_seed(1)
    want = model(input_ids=x[:, 0], attention_mask=x[:, 1]).logits
    torch.manual_seed(1)  # dropout draws in the same order
    h = x
    for block in blocks:
        h = run_block(block, h)
    if KINDS[kind] == "causal_lm":
        real = x[:, 1].bool()
        h, want = h[real], want[real]  # padding positions' logits are not used
    # Two code paths: the split blocks rebuild the additive attention mask, the original
    # model builds its own, so they agree up to rounding only, and which rounding depends on
    # the CPU's kernels (5.6e-17 apart on an AVX2 AMD EPYC, bit-equal on AVX-512): float64
    # with a tolerance far below any real difference (a wrong mask or a skipped layer moves
    # the logits by more than 1e-3).
    torch.testing.assert_close(h, want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kind", ["roberta", "gpt2"])
def test_block_model_cut_in_layers_and_weights_load_back(tmp_path, kind):
    """``cut: 3`` = embeddings + 3 layers on the device; the hidden states and the mask cross
    the cut; ``user_state_dict`` holds the original model's names and tensors."""
    folder = save_tiny(tmp_path / kind, kind)
    model = hf_block_model(f"hf-config:{folder}", 2)
    assert model.cut_points == (1, 2, 3, 4) and model.input_dtype == torch.int64
    device, server = split(model, 3)
    x = token_batch()
    hidden, mask = device(x)
    assert hidden.shape == (4, 8, 16) and torch.equal(mask, x[:, 1])
    original = tiny_model(kind)
    state = user_state_dict(model, model.state_dict())
    missing, unexpected = original.load_state_dict(state, strict=False)
    assert unexpected == []
    assert set(missing) <= {"lm_head.weight"} - set(state)  # GPT-2's head is tied to wte
    own = original.state_dict()
    assert all(torch.equal(own[k], v) for k, v in state.items())


def test_hf_config_runs_end_to_end(tmp_path):
    res, _ = _roberta_run(tmp_path)
    assert len(res.metrics) == 2 and all(r["train_loss"] > 0 for r in res.metrics)
    saved = torch.load(tmp_path / "run" / "model.pt", weights_only=True)
    assert "roberta.embeddings.word_embeddings.weight" in saved


def test_missing_folder_is_one_line_naming_the_field(tmp_path):
    with pytest.raises(ConfigError, match=r"^model: hf-config:.*no Hugging Face config"):
        splitfl.validate({"model": f"hf-config:{tmp_path / 'nothing'}"})


LORA = {"r": 2, "alpha": 4, "target_modules": ["query", "value"]}


TOKEN_DATA = {
    "dataset": "hf_fixtures:token_classification_data",
    "num_clients": 4,
    "partition": "iid",
}


def _roberta_config(folder: Path, data: dict, lora: dict | None = None) -> dict:
    """Two rounds of SplitFed V1 on the tiny RoBERTa in ``folder``, split at layer 2."""
    return {
        "model": f"hf-config:{folder}",
        "algorithm": "splitfed_v1",
        "rounds": 2,
        "seed": 0,
        "data": data,
        "train": {"clients_per_round": 2, "batch_size": 4, "lr": 0.05, "lora": lora},
        "options": {"splitfed_v1": {"cut": 2}},
        "output": {"progress": False},
        "import_dirs": [str(Path(__file__).parents[1])],
    }


def _roberta_run(tmp_path, lora: dict | None = None):
    """:func:`_roberta_config` on token data, run; and the model folder."""
    folder = save_tiny(tmp_path / "roberta", "roberta")
    cfg = _roberta_config(folder, TOKEN_DATA, lora)
    return splitfl.run(cfg, run_dir=tmp_path / "run", progress=False), folder


def test_lora_trains_only_the_adapters_and_the_head(tmp_path):
    """Issue 33 item 3: with ``train.lora`` the base weights do not move; the adapters and the
    new classification head do."""
    res, folder = _roberta_run(tmp_path, LORA)
    assert len(res.metrics) == 2
    merged = torch.load(tmp_path / "run" / "model.pt", weights_only=True)  # issue 48 item 3
    torch.manual_seed(0)  # the run's seed: hf-config's random weights
    initial = tiny_model("roberta").state_dict()
    assert set(merged) == set(initial)  # the model's own keys
    moved = {k for k in merged if not torch.equal(merged[k], initial[k])}
    wrapped = {k for k in merged if ".query.weight" in k or ".value.weight" in k}
    assert moved & wrapped  # B starts at 0 and learns: merged into query and value
    assert moved <= wrapped | {k for k in merged if k.startswith("classifier.")}


def test_lora_model_traffic_is_the_trainable_tensors(tmp_path):
    """The cost model's device bytes at a cut are the adapters' (and buffers'), not the base
    weights: a device holds those itself."""
    folder = save_tiny(tmp_path / "roberta", "roberta")
    lora = LoraConfig(2, 4.0, 0.0, ["query", "value"])
    model = hf_block_model(f"hf-config:{folder}", 2, lora)
    full = profile_model(f"hf-config:{folder}", (2, 8), 2)
    adapted = profile_model(f"hf-config:{folder}", (2, 8), 2, lora=lora)
    device, _ = split(model, 2)
    state = device.state_dict(keep_vars=True)
    frozen = sum(t.numel() for t in state.values() if getattr(t, "requires_grad", True) is False)
    trainable = sum(p.numel() for p in device.parameters() if p.requires_grad)
    assert trainable == 2 * 2 * (2 * 16 + 16 * 2)  # 2 layers × (query, value) × (A, B)
    assert adapted.device_bytes(2) == 4 * (sum(t.numel() for t in state.values()) - frozen)
    # without LoRA: every tensor of the same layers (the LoRA model's, less its adapters)
    assert full.device_bytes(2) == 4 * (sum(t.numel() for t in state.values()) - trainable)
    assert adapted.device_bytes(2) < full.device_bytes(2) / 20
    assert adapted.activation_bytes(2) == full.activation_bytes(2)


def test_lora_needs_a_hugging_face_model_and_valid_fields():
    with pytest.raises(ConfigError, match=r"^train.lora: needs a Hugging Face model"):
        splitfl.validate({"train": {"lora": {"r": 2}}})
    with pytest.raises(ConfigError, match=r"^train.lora.r: must be in \[1, 4096\]"):
        splitfl.validate({"train": {"lora": {"r": 0}}})


def test_qnli_tsv_through_a_tokenizer_and_hf_model_end_to_end(tmp_path):
    """Issue 33 item 2: GLUE's QNLI TSV layout (train.tsv, dev.tsv) read with
    ``data.format: text``, the pair tokenised by the model folder's own tokenizer (the
    default ``data.tokenizer``), a RoBERTa trained split at layer 2."""
    folder = save_tiny(tmp_path / "roberta", "roberta")
    save_tokenizer(folder)
    data = write_qnli(tmp_path / "QNLI")
    text = {
        "dataset": "my_qnli",
        "format": "text",
        "root": str(data),
        "text_columns": ["question", "sentence"],
        "max_length": 8,
    }
    cfg = _roberta_config(folder, {**TOKEN_DATA, **text, "min_samples": 2})
    res = splitfl.run(cfg, run_dir=tmp_path / "run", progress=False)
    assert len(res.metrics) == 2 and res.metrics[-1]["test_acc"] is not None
    resolved = (tmp_path / "run" / "config.yaml").read_text()
    assert f"tokenizer: {folder}" in resolved  # the model's own tokenizer, written down
    bundle = prepare(as_config(cfg)).ctx.bundle
    x = bundle.train.x
    assert x.shape == (24, 2, 8) and x.dtype == torch.int64
    assert bundle.num_classes == 2  # entailment, not_entailment
    # "<s> what is the capital of france </s> paris ..." truncated to 8 tokens, no padding
    assert x[0, 0, 0].item() == 1 and x[0, 1].tolist() == [1] * 8


def test_text_format_needs_one_or_two_columns_and_a_tokenizer(tmp_path):
    data = write_qnli(tmp_path / "QNLI")
    base = {"dataset": "my_qnli", "format": "text", "root": str(data)}
    with pytest.raises(ConfigError, match=r"^data.text_columns: format text needs one or two"):
        splitfl.validate({"data": base})
    with pytest.raises(ConfigError, match=r"^data.tokenizer: format text needs a tokenizer"):
        splitfl.validate({"data": {**base, "text_columns": ["question"]}})


def test_hf_prefix_loads_the_saved_weights(tmp_path):
    """``hf:`` = ``from_pretrained`` (local files only): the blocks hold the saved tensors."""
    folder = save_tiny(tmp_path / "bert", "bert", classes=3, seed=5)
    model = hf_block_model(f"hf:{folder}", 3)
    torch.manual_seed(5)
    saved = tiny_model("bert", 3).state_dict()
    state = user_state_dict(model, model.state_dict())
    assert set(state) == set(saved)
    assert all(torch.equal(state[k], saved[k]) for k in state)


def _token_changes(model: str, rounds: int, **more) -> dict:
    """Dotted ``config_for`` changes: ``model`` on the token fixture, IID."""
    return {
        "rounds": rounds,
        "model": model,
        "data.dataset": "hf_fixtures:token_classification_data",
        "data.partition": "iid",
        "import_dirs": [str(Path(__file__).parents[1])],
        **more,
    }


def _networked_run(tmp_path, algorithm: str, changes: dict):
    """``algorithm`` on three in-process devices; the result and the device threads."""
    bed = Testbed.create(tmp_path / "bed", list(DEVICES))
    threads = [bed.device(name, clients, retry_s=20.0) for name, clients in DEVICES.items()]
    net_changes = bed.server_overrides(min_devices=len(DEVICES))
    net = splitfl.run(config_for(algorithm, **changes, **net_changes), run_dir=tmp_path / "net")
    for t in threads:
        t.join(30)
    return net, threads


@pytest.mark.parametrize("algorithm", ["splitfed_v1", "mergesfl"])
def test_networked_split_roberta_equals_sequential(tmp_path, algorithm, sequential_run):
    """Sequential ≡ networked on a split RoBERTa: the hidden states and the int64 mask cross
    as fx.0/fx.1 (checked one by one), gradients only for the hidden states; the payload is
    the cost model's, byte for byte. Dropout 0: engines draw dropout masks from different
    streams (README, "Dropout masks differ between engines"); with RoBERTa's 0.1 the models
    differ by about 1e-3 after 2 rounds."""
    folder = save_tiny(tmp_path / "roberta", "roberta", dropout=0.0)
    changes = _token_changes(f"hf-config:{folder}", 2, **{f"options.{algorithm}.cut": 2})
    net, threads = _networked_run(tmp_path, algorithm, changes)
    seq = sequential_run(config_for(algorithm, **changes))
    a = torch.load(net.run_dir / "model.pt", weights_only=True)
    b = torch.load(seq.run_dir / "model.pt", weights_only=True)
    assert set(a) == set(b) and "roberta.embeddings.word_embeddings.weight" in a
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-5
    assert [t.code for t in threads] == [0, 0, 0]
    rows = [json.loads(x) for x in (net.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2
    for row in rows:
        assert row["dropped_clients"] == []
        assert row["payload_activations_up"] == row["bytes_activations_up"] > 0
        assert row["payload_gradients_down"] == row["bytes_gradients_down"] > 0


def _paper_config(name: str, folder: Path, data: Path, *overrides: str):
    """A config of ``benchmarks/papers/`` as shipped, its model and data folders pointed at
    tiny stand-ins, one round of 8-token samples."""
    paper = Path(__file__).resolve().parents[2] / "benchmarks" / "papers" / name
    base = [f"model=hf:{folder}", f"data.root={data}", "data.max_length=8", "rounds=1"]
    return as_config(paper, [*base, *overrides])


def test_the_roberta_qnli_paper_config_runs_on_tiny_stand_ins(tmp_path):
    """``benchmarks/papers/parallelsfl/roberta_qnli.yaml`` as shipped, with its model and
    data folders pointed at a tiny RoBERTa and a QNLI-format fixture (one round)."""
    folder = save_tiny(tmp_path / "roberta", "roberta")
    save_tokenizer(folder)
    data = write_qnli(tmp_path / "QNLI", copies=30)
    config = _paper_config(
        "parallelsfl/roberta_qnli.yaml",
        folder,
        data,
        "data.num_clients=10",
        "data.min_samples=4",
        "train.local_steps=2",
        "options.parallelsfl.tau=2",
        "output.progress=false",
    )
    assert (config.train.batch_size, config.train.lr, config.rounds) == (16, 0.001, 1)
    assert config.options["parallelsfl"]["cut"] == 3
    res = splitfl.run(config, run_dir=tmp_path / "run", progress=False)
    assert len(res.metrics) == 1


def test_causal_lm_loss_per_sample_is_hugging_faces_loss():
    """``train.loss: causal_lm``: a sample's loss is Hugging Face's causal-LM loss of that
    sample alone (next tokens, padding ignored)."""
    torch.manual_seed(0)
    model = tiny_model("gpt2").double().eval()
    x = token_batch()
    logits = model(input_ids=x[:, 0], attention_mask=x[:, 1]).logits
    per_sample = loss_fn("causal_lm")(logits, next_tokens(x), reduction="none")
    for i in range(len(x)):
        labels = next_tokens(x[i : i + 1])
        own = model(input_ids=x[i : i + 1, 0], attention_mask=x[i : i + 1, 1], labels=labels)
        assert per_sample[i].item() == pytest.approx(own.loss.item(), rel=1e-6)  # HF: fp32 loss
    assert next_tokens(x)[1, 5:].tolist() == [IGNORE] * 3  # sample 1's padding


def test_gpt2_language_model_trains_split_with_perplexity(tmp_path):
    """Issue 33 item 2: one text column of a .jsonl, next-token targets, a split GPT-2, the
    test perplexity = exp(test loss), falling as it trains."""
    folder = save_tiny(tmp_path / "gpt2", "gpt2")
    save_tokenizer(folder)
    data = write_lines(tmp_path / "lines")
    cfg = _roberta_config(
        folder,
        {
            "dataset": "my_lines",
            "format": "text",
            "root": str(data),
            "text_columns": ["text"],
            "text_target": "next_token",
            "max_length": 8,
            "num_clients": 4,
            "min_samples": 2,
            "partition": "iid",
        },
    )
    cfg["rounds"] = 3
    cfg["train"] = {**cfg["train"], "lr": 0.1, "loss": "causal_lm"}
    cfg["eval"] = {"metrics": ["perplexity"]}
    rows = splitfl.run(cfg, run_dir=tmp_path / "run", progress=False).metrics
    assert len(rows) == 3
    for row in rows:
        assert row["test_perplexity"] == pytest.approx(math.exp(row["test_loss"]), rel=1e-6)
    assert rows[-1]["test_perplexity"] < rows[0]["test_perplexity"]
    with pytest.raises(ConfigError, match=r"^eval.metrics: perplexity needs train.loss"):
        splitfl.validate({"eval": {"metrics": ["perplexity"]}})


def test_the_splitlora_gpt2_config_runs_on_tiny_stand_ins(tmp_path):
    """``benchmarks/papers/splitlora/gpt2_medium_e2e.yaml`` as shipped, pointed at a tiny GPT-2
    and two-field .jsonl files (one round)."""
    folder = save_tiny(tmp_path / "gpt2", "gpt2")
    save_tokenizer(folder)
    data = tmp_path / "e2e"
    data.mkdir()
    rows = [{"context": "what is the capital", "completion": "paris lies on the seine"}] * 12
    for split_name in ("train", "test"):
        (data / f"{split_name}.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    config = _paper_config(
        "splitlora/gpt2_medium_e2e.yaml", folder, data, "options.splitlora.aggregate_step=6"
    )
    assert (config.train.batch_size, config.train.lr, config.train.lora.r) == (4, 0.0002, 2)
    rows = splitfl.run(config, run_dir=tmp_path / "run", progress=False).metrics
    assert len(rows) == 1 and rows[0]["test_perplexity"] > 1


def test_parallel_executor_equals_sequential_on_a_split_roberta_with_lora(tmp_path):
    """``executor: parallel``: the workers build the same RoBERTa (with its LoRA adapters)
    from the config and train the same steps: identical model and metrics. Dropout 0 (the
    engines' masks differ)."""
    folder = save_tiny(tmp_path / "roberta", "roberta", dropout=0.0)
    cfg = _roberta_config(folder, TOKEN_DATA, LORA)
    runs = {}
    for executor in ("sequential", "parallel"):
        cfg = {**cfg, "executor": executor}
        runs[executor] = splitfl.run(cfg, run_dir=tmp_path / executor, progress=False)
    from safetensors.torch import load_file

    a, b = (torch.load(r.run_dir / "model.pt", weights_only=True) for r in runs.values())
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)  # the merged models
    a, b = (load_file(r.run_dir / "adapter" / "adapter_model.safetensors") for r in runs.values())
    assert set(a) == set(b) and any("lora_A" in k for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [r["train_loss"] for r in runs["sequential"].metrics] == [
        r["train_loss"] for r in runs["parallel"].metrics
    ]


def test_networked_lora_sends_only_the_adapters(tmp_path, sequential_run):
    """Issue 33 item 3: with ``train.lora`` a device downloads and uploads its part's
    adapters only (the frozen base stays on the device, built from its own files); the bytes
    on the wire are the cost model's, and the run equals the sequential one."""
    folder = save_tiny(tmp_path / "roberta", "roberta", dropout=0.0)
    changes = _token_changes(  # the saved weights: every device loads the same base
        f"hf:{folder}", 2, **{"options.splitfed_v1.cut": 2, "train.lora": LORA}
    )
    net, threads = _networked_run(tmp_path, "splitfed_v1", changes)
    seq = sequential_run(config_for("splitfed_v1", **changes))
    a = torch.load(net.run_dir / "model.pt", weights_only=True)
    b = torch.load(seq.run_dir / "model.pt", weights_only=True)
    assert max((a[k].double() - b[k].double()).abs().max().item() for k in a) <= 1e-5
    assert [t.code for t in threads] == [0, 0, 0]
    model = hf_block_model(f"hf:{folder}", 2, LoraConfig(**LORA))
    adapters = 4 * sum(p.numel() for p in split(model, 2)[0].parameters() if p.requires_grad)
    rows = [json.loads(x) for x in (net.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2  # the loop below runs
    for row in rows:
        clients = len(row["clients"])
        assert row["payload_model_down"] == row["bytes_model_down"] == clients * adapters
        assert row["payload_model_up"] == clients * adapters


@pytest.mark.parametrize("algorithm", algorithm_names())
def test_every_algorithm_runs_on_a_split_roberta(tmp_path, algorithm):
    """Issue 33 item 4: no algorithm's control assumes images: each trains a round of a split
    RoBERTa on token data (the mask crossing the cut beside the hidden states)."""
    folder = save_tiny(tmp_path / "roberta", "roberta")
    changes = _token_changes(f"hf-config:{folder}", 1)
    if algorithm.startswith("ringsfl"):  # a ring of at most as many clients as blocks
        changes.update({"data.num_clients": 4, "train.clients_per_round": 4})
    rows = splitfl.run(config_for(algorithm, **changes), run_dir=tmp_path / "run").metrics
    assert len(rows) == 1 and math.isfinite(rows[0]["train_loss"]) and rows[0]["samples"] > 0


def test_lora_checkpoint_holds_the_adapters_and_resumes_exactly(tmp_path):
    """Issue 33 item 3: a LoRA run's checkpoint holds the moving tensors (adapters, head,
    buffers), not the frozen base, which a resume rebuilds from the model's own files; the
    resumed run equals the uninterrupted one."""
    folder = save_tiny(tmp_path / "roberta", "roberta")

    def cfg(rounds: int) -> dict:
        c = _roberta_config(folder, TOKEN_DATA, LORA)
        return {
            **c,
            "model": f"hf:{folder}",
            "rounds": rounds,
            "output": {"progress": False, "checkpoint_every": 2},
        }

    full = splitfl.run(cfg(3), run_dir=tmp_path / "full", progress=False)
    part = splitfl.run(cfg(2), run_dir=tmp_path / "part", progress=False)
    saved = torch.load(part.run_dir / "checkpoints" / "last.pt", weights_only=True)
    keys = set(saved["global_state"])
    assert keys and all("lora_" in k or "classifier" in k for k in keys)
    (part.run_dir / "config.yaml").write_text((full.run_dir / "config.yaml").read_text())
    (part.run_dir / "model.pt").unlink()
    resumed = splitfl.resume(part.run_dir)
    a = torch.load(full.run_dir / "model.pt", weights_only=True)
    b = torch.load(resumed.run_dir / "model.pt", weights_only=True)
    assert set(a) == set(b) and all(torch.equal(a[k], b[k]) for k in a)
    drop = ("wall_time",)
    rows = [
        [{k: v for k, v in r.items() if k not in drop} for r in x.metrics] for x in (full, resumed)
    ]
    assert rows[0] == rows[1]


@pytest.mark.parametrize("fmt", ["hf", "parquet"])
def test_text_columns_of_hugging_face_and_parquet_data(tmp_path, fmt):
    """Issue 33 item 2: the same pairs saved as a ``DatasetDict`` (``format: hf``) or as
    parquet files read through the tokenizer like the TSV (same ids and masks)."""
    datasets = pytest.importorskip("datasets")
    folder = save_tokenizer(tmp_path / "tok")
    data = write_qnli(tmp_path / "QNLI")
    splits = {}
    for split_name, file in (("train", "train.tsv"), ("test", "dev.tsv")):
        lines = (data / file).read_text().splitlines()[1:]
        cols = list(zip(*(line.split("\t")[1:] for line in lines), strict=True))
        splits[split_name] = datasets.Dataset.from_dict(
            {"question": list(cols[0]), "sentence": list(cols[1]), "label": list(cols[2])}
        )
    root = tmp_path / fmt
    if fmt == "hf":
        datasets.DatasetDict(splits).save_to_disk(str(root))
    else:
        root.mkdir()
        for split_name, ds in splits.items():
            ds.to_parquet(str(root / f"{split_name}.parquet"))
    text = {"text_columns": ["question", "sentence"], "max_length": 8, "tokenizer": str(folder)}
    read = {}
    for name, (f, r) in {"tsv": ("text", data), fmt: (fmt, root)}.items():
        d = as_config({"data": {"dataset": "mine", "format": f, "root": str(r), **text}}).data
        read[name] = splitfl.data.source.read_dataset(d)
    a, b = read["tsv"], read[fmt]
    assert torch.equal(a.train.x, b.train.x) and torch.equal(a.train.y, b.train.y)
    assert a.num_classes == b.num_classes == 2


def test_builtin_qnli_loader_yields_pairs_for_the_models_tokenizer(tmp_path):
    """Issue 33 item 2: ``data.dataset: qnli`` with a Hugging Face model reads the GLUE files
    through the model's tokenizer (the same as ``format: text``); without one, the hashed ids
    for ``transformer`` stay."""
    folder = save_tiny(tmp_path / "roberta", "roberta")
    save_tokenizer(folder)
    data = write_qnli(tmp_path / "glue" / "QNLI")
    builtin = as_config(
        {
            "model": f"hf-config:{folder}",
            "data": {"dataset": "qnli", "root": str(data), "max_length": 8},
        }
    )
    assert builtin.data.tokenizer is None
    resolved = splitfl.experiment.validation.resolve_config(builtin)
    assert resolved.data.tokenizer == str(folder)
    a = splitfl.data.source.read_dataset(resolved.data)
    text = {
        "dataset": "mine",
        "format": "text",
        "root": str(data),
        "max_length": 8,
        "text_columns": ["question", "sentence"],
        "tokenizer": str(folder),
    }
    b = splitfl.data.source.read_dataset(as_config({"data": text}).data)
    assert a.input_shape == (2, 8) and torch.equal(a.train.x, b.train.x)
    assert a.train.y.tolist() == [0, 1, 1, 0] * 6  # entailment 0, not_entailment 1
    hashed = splitfl.data.source.read_dataset(
        as_config({"data": {"dataset": "qnli", "root": str(data)}}).data
    )
    assert hashed.input_shape == (64,) and hashed.train.x.dtype == torch.float32

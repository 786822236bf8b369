"""The ``transformer`` block model (split, mask, profile, training) and the ``qnli`` loader."""

from __future__ import annotations

import copy
import zlib
from collections import Counter

import numpy as np
import pytest
import torch
from torch import nn

from conftest import tiny_config
from fixtures_data import write_qnli
from splitfl.data.base import DatasetNotFoundError, dataset_names, load_dataset
from splitfl.data.loaders.qnli import LABELS, encode_pair, read_tsv, tokenize
from splitfl.experiment.runner import as_config, prepare
from splitfl.models.base import block_index, split
from splitfl.models.profile import measure_profile, profile_model
from splitfl.models.registry import build_model, model_names
from splitfl.models.zoo.transformer import (
    PAD_ID,
    PARALLELSFL_CUT,
    SEP_ID,
    VOCAB_SIZE,
    EncoderBlock,
    MeanPoolHead,
    TokenEmbedding,
    build_transformer,
    default_cut_points,
)

L = 64


def token_batch(n: int = 4, seq_len: int = L, seed: int = 0) -> torch.Tensor:
    """Realistic float token ids: words, one [SEP], trailing PAD of varying length."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(2, VOCAB_SIZE, (n, seq_len), generator=g).float()
    for i in range(n):
        x[i, 3 + i] = SEP_ID
        x[i, seq_len - 7 * i :] = PAD_ID  # row 0 has no padding
    return x


def small(n_layers: int = 2, seq_len: int = 16, **kw) -> nn.Module:
    torch.manual_seed(0)
    return build_transformer(seq_len, 2, d_model=32, n_heads=2, ff=64, n_layers=n_layers, **kw)


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_model("transformer", (L,), 2).eval()


# --- model -----------------------------------------------------------------------------------


def test_registered():
    assert "transformer" in model_names() and "qnli" in dataset_names()


@pytest.mark.parametrize("n_layers", [1, 2, 3, 6, 12])
def test_block_structure(n_layers):
    m = build_transformer(8, 3, d_model=16, n_heads=2, ff=32, n_layers=n_layers)
    assert m.num_blocks == n_layers + 2
    assert isinstance(m.blocks[0], TokenEmbedding) and isinstance(m.blocks[-1], MeanPoolHead)
    assert all(isinstance(b, EncoderBlock) for b in m.blocks[1:-1])
    assert m.cut_points == default_cut_points(n_layers)


def test_cut_points_and_parallelsfl_cut(model):
    assert model.num_blocks == 8 and model.cut_points == (2, 4, 6)
    assert default_cut_points(12) == (2, 4, 12) and default_cut_points(1) == (2,)
    # cut c = the embedding + (c - 1) encoder layers on the device; ParallelSFL: 3 layers
    assert PARALLELSFL_CUT == 4 and PARALLELSFL_CUT in model.cut_points
    for cut in model.cut_points:
        device, _ = split(model, cut)
        layers = [b for b in device.blocks.values() if isinstance(b, EncoderBlock)]
        assert len(layers) == cut - 1
    device, server = split(model, PARALLELSFL_CUT)
    assert sum(isinstance(b, EncoderBlock) for b in server.blocks.values()) == 3
    assert build_transformer(8, 2, cut_points=(1, 7)).cut_points == (1, 7)


@pytest.mark.parametrize("n_layers", [1, 2, 3, 6, 12])
def test_default_cut_is_parallelsfl_split(n_layers):
    """ParallelSFL §5.1: RoBERTa split at the 3rd layer — 3 encoder layers on the device (all
    of them in shallower models) with ``cut: null``."""
    m = build_transformer(8, 2, d_model=16, n_heads=2, ff=32, n_layers=n_layers)
    device, _ = split(m, m.default_cut)
    assert sum(isinstance(b, EncoderBlock) for b in device.blocks.values()) == min(3, n_layers)
    assert build_transformer(8, 2, cut_points=(1, 7)).default_cut == 7  # not a candidate


def test_registered_transformer_defaults_to_parallelsfl_cut(tmp_path):
    write_qnli(tmp_path)
    cfg = tiny_config(
        algorithm="splitfed_v1",
        model="transformer",
        **{"data.dataset": "qnli", "data.root": str(tmp_path), "data.num_clients": 2},
        **{"data.partition": "iid", "data.min_samples": 1, "train.clients_per_round": 2},
    )
    prep = prepare(as_config(cfg))
    plan = prep.algorithm.plan_round(0, [0, 1], np.random.default_rng(0))
    assert [t.cut for t in plan.tasks] == [PARALLELSFL_CUT] * 2


def test_bad_arguments():
    with pytest.raises(ValueError):
        build_model("transformer", (1, 64), 2)
    with pytest.raises(ValueError):
        build_transformer(8, 2, d_model=30, n_heads=4)
    with pytest.raises(ValueError):
        build_transformer(8, 2, n_layers=0)
    with pytest.raises(ValueError, match="token ids"):
        small(seq_len=8)(torch.zeros(2, 9))


def test_split_composes_exactly_at_every_cut(model):
    x = token_batch()
    with torch.no_grad():
        full = model(x)
        assert full.shape == (4, 2) and torch.isfinite(full).all()
        for cut in range(1, model.num_blocks + 1):
            device, server = split(model, cut)
            assert torch.equal(server(device(x)), full), f"cut {cut}"
            assert torch.equal(model(device(x), start=cut), full)
    # with autograd on (the training path of nn.TransformerEncoderLayer) too
    train = copy.deepcopy(model).train()
    full = train(x)
    for cut in train.cut_points:
        device, server = split(train, cut)
        assert torch.equal(server(device(x)), full)


def test_parameter_partition(model):
    whole = Counter(name for name, _ in model.named_parameters())
    for cut in model.cut_points:
        device, server = split(model, cut)
        dev = Counter(name for name, _ in device.named_parameters())
        srv = Counter(name for name, _ in server.named_parameters())
        assert dev + srv == whole and not set(dev) & set(srv)
        assert all(block_index(k) < cut for k in dev) and all(block_index(k) >= cut for k in srv)
        assert set(device.state_dict()) | set(server.state_dict()) == set(model.state_dict())


def test_activation_carries_pad_flag(model):
    x = token_batch()
    with torch.no_grad():
        for cut in model.cut_points:
            act = split(model, cut)[0](x)
            assert act.shape == (4, L, 128 + 1)
            assert torch.equal(act[..., -1], (x == PAD_ID).float())


def test_padding_does_not_change_logits(model):
    x = token_batch()[:1, : L - 20]  # no PAD inside
    padded = torch.cat([x, torch.zeros(1, 20)], dim=1)
    with torch.no_grad():
        assert torch.allclose(model(x), model(padded), atol=1e-5)
        # token positions' hidden states ignore the PAD positions after every layer
        for cut in range(2, model.num_blocks):
            h, h_pad = model(x, stop=cut), model(padded, stop=cut)
            assert torch.allclose(h, h_pad[:, : L - 20], atol=1e-5), f"cut {cut}"


def test_all_pad_input_is_finite_and_mean_of_all_positions(model):
    x = torch.zeros(2, L)
    with torch.no_grad():
        h = model(x, stop=model.num_blocks - 1)
        assert torch.equal(h[..., -1], torch.zeros(2, L))  # all-PAD sample: nothing masked
        logits = model(x)
        assert torch.isfinite(logits).all()
        assert torch.allclose(logits, model.blocks[-1].fc(h[..., :-1].mean(dim=1)), atol=1e-6)


def test_float_ids_are_rounded_and_clamped():
    m = small().eval()
    ids = torch.tensor([[5.0, 7.0, 1.0, 9.0, 8191.0, 0.0]])
    noisy = torch.tensor([[4.6, 7.2, 1.0, 9.4, 9000.0, -3.0]])
    with torch.no_grad():
        assert torch.equal(m(ids), m(noisy))
        assert m(torch.randn(3, 16)).shape == (3, 2)


def test_profile_counts_and_grows_with_depth():
    prof = profile_model("transformer", (L,), 2)
    assert prof.num_blocks == 8
    assert prof.activation_bytes(PARALLELSFL_CUT) == L * 129 * 4
    layer_flops = [b.flops_per_sample for b in prof.blocks[1:-1]]
    assert len(set(layer_flops)) == 1 and layer_flops[0] > 0
    flops = [prof.device_flops(c) for c in (2, 4, 6)]
    assert flops == sorted(flops) and flops[0] < flops[-1]
    totals = [measure_profile(small(n), (16,)).total_flops for n in (1, 2, 4)]
    assert totals[0] < totals[1] < totals[2]
    assert totals[2] - totals[1] == pytest.approx(2 * (totals[1] - totals[0]))


def test_split_training_step_matches_whole_and_lowers_loss():
    x, y = token_batch(8, 16, seed=1), torch.tensor([0, 1] * 4)
    whole, model = small(), small()
    loss_fn = nn.CrossEntropyLoss()
    # one split step: the activation's gradient goes back to the device part
    device, server = split(model, 2)
    act = device(x)
    sent = act.detach().requires_grad_()
    loss_fn(server(sent), y).backward()
    act.backward(sent.grad)
    loss_fn(whole(x), y).backward()
    for (name, p), q in zip(model.named_parameters(), whole.parameters(), strict=True):
        assert torch.allclose(p.grad, q.grad, atol=1e-6), name
    # a few SGD steps on the split model fit the tiny batch
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(8):
        opt.zero_grad()
        act = device(x)
        sent = act.detach().requires_grad_()
        loss = loss_fn(server(sent), y)
        loss.backward()
        act.backward(sent.grad)
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.6 * losses[0]


# --- tokenizer -------------------------------------------------------------------------------


def _word(w: str) -> int:
    return 2 + zlib.crc32(w.encode("utf-8")) % (VOCAB_SIZE - 2)


def test_tokenize_hashes_lowercased_alphanumeric_runs():
    assert tokenize("Hello, WORLD! hello") == [_word("hello"), _word("world"), _word("hello")]
    assert tokenize("Bob's x_y 1889 Ünïcode") == [
        _word(w) for w in ("bob", "s", "x", "y", "1889", "ünïcode")
    ]
    assert tokenize(" ... ") == []
    ids = tokenize("the quick brown fox jumps over the lazy dog 42 times")
    assert all(2 <= i < VOCAB_SIZE for i in ids)


def test_encode_pair_pads_and_truncates_longest_first():
    assert encode_pair([5, 6], [7], 6) == [5, 6, SEP_ID, 7, PAD_ID, PAD_ID]
    assert encode_pair([5, 6], [7, 8, 9], 6) == [5, 6, SEP_ID, 7, 8, 9]
    assert encode_pair([5, 6], list(range(10, 30)), 6) == [5, 6, SEP_ID, 10, 11, 12]
    assert encode_pair(list(range(10, 30)), [5], 6) == [10, 11, 12, 13, SEP_ID, 5]
    assert encode_pair(list(range(10, 30)), list(range(40, 60)), 7) == [
        10, 11, 12, SEP_ID, 40, 41, 42,
    ]  # fmt: skip
    assert encode_pair([], [], 3) == [SEP_ID, PAD_ID, PAD_ID]


# --- loader ----------------------------------------------------------------------------------


def _expected(raw, split, seq_len=64):
    rows = [
        encode_pair(tokenize(q), tokenize(s), seq_len)
        for q, s in zip(raw[f"{split}_q"], raw[f"{split}_s"], strict=True)
    ]
    return torch.tensor(rows, dtype=torch.float32)


def test_loader_shapes_labels_and_tokens(tmp_path):
    raw = write_qnli(tmp_path)
    b = load_dataset("qnli", tmp_path)
    assert b.name == "qnli" and b.num_classes == 2 and b.input_shape == (64,)
    assert b.train.x.shape == (20, 64) and b.test.x.shape == (8, 64)  # test = dev.tsv
    assert b.train.x.dtype == torch.float32 and b.train.y.dtype == torch.int64
    assert LABELS == {"entailment": 0, "not_entailment": 1}
    assert b.train.y.tolist() == [LABELS[v] for v in raw["train_y"]]
    assert b.test.y.tolist() == [LABELS[v] for v in raw["dev_y"]]
    assert torch.equal(b.train.x, _expected(raw, "train"))
    assert torch.equal(b.test.x, _expected(raw, "dev"))
    assert ((b.train.x == SEP_ID).sum(dim=1) == 1).all()
    assert b.train.writers is None
    # row 1's unbalanced quote is plain text (QUOTE_NONE): nothing swallowed
    assert b.train.x[1, 0].item() == _word("what") and (b.train.x[1] == PAD_ID).any()
    # row 2's 100-word sentence is truncated: no PAD, question whole before [SEP]
    n_q = len(tokenize(raw["train_q"][2]))
    assert not (b.train.x[2] == PAD_ID).any() and b.train.x[2, n_q].item() == SEP_ID
    # short rows end in PAD
    assert (b.test.x[:, -1] == PAD_ID).all()
    # same text, same ids: deterministic tokenization across loads
    again = load_dataset("qnli", tmp_path / "QNLI")  # root may be the QNLI folder itself
    assert torch.equal(again.train.x, b.train.x) and torch.equal(again.test.y, b.test.y)


def test_loader_options(tmp_path):
    raw = write_qnli(tmp_path)
    b = load_dataset("qnli", tmp_path, seq_len=12, max_train=5, max_test=3)
    assert b.input_shape == (12,) and b.train.x.shape == (5, 12) and b.test.x.shape == (3, 12)
    assert torch.equal(b.train.x, _expected(raw, "train", 12)[:5])
    assert b.test.y.tolist() == [LABELS[v] for v in raw["dev_y"][:3]]
    assert ((b.train.x == SEP_ID).sum(dim=1) == 1).all()
    with pytest.raises(ValueError, match="seq_len"):
        load_dataset("qnli", tmp_path, seq_len=2)


def test_loader_skips_malformed_rows(tmp_path):
    raw = write_qnli(tmp_path, n_train=6, n_test=4)
    path = tmp_path / "QNLI" / "train.tsv"
    bad = [
        "90\tquestion without sentence\tentailment",  # 3 fields
        "91\ta\tb\tentailment\textra",  # 5 fields
        "92\tWhat?\tThat.\tmaybe",  # unknown label
    ]
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join(lines[:3] + bad + lines[3:]) + "\n", encoding="utf-8")
    rows = read_tsv(path)
    assert rows.skipped == 3 and len(rows.labels) == 6
    assert rows.questions == raw["train_q"] and rows.sentences == raw["train_s"]
    with pytest.warns(UserWarning, match="skipped 3 malformed rows"):
        b = load_dataset("qnli", tmp_path)
    assert torch.equal(b.train.x, _expected(raw, "train"))
    assert read_tsv(path, limit=4).labels == [LABELS[v] for v in raw["train_y"][:4]]


def test_loader_bad_header(tmp_path):
    write_qnli(tmp_path)
    (tmp_path / "QNLI" / "dev.tsv").write_text("index\tquestion\tsentence\n0\ta\tb\n")
    with pytest.raises(ValueError, match="label"):
        load_dataset("qnli", tmp_path)


def test_loader_missing_files(tmp_path):
    write_qnli(tmp_path)
    (tmp_path / "QNLI" / "dev.tsv").unlink()
    for root in (tmp_path, tmp_path / "empty", None):
        with pytest.raises(DatasetNotFoundError) as info:
            load_dataset("qnli", root)
        message = str(info.value)
        assert "\n" not in message and "dev.tsv" in message and "train.tsv" in message
        if root is not None:
            assert str(root / "QNLI") in message


def test_loader_feeds_the_model(tmp_path):
    write_qnli(tmp_path)
    b = load_dataset("qnli", tmp_path, seq_len=32)
    torch.manual_seed(0)
    m = build_model("transformer", b.input_shape, b.num_classes).eval()
    with torch.no_grad():
        device, server = split(m, PARALLELSFL_CUT)
        assert torch.equal(server(device(b.test.x)), m(b.test.x))
    assert m(b.test.x).shape == (8, 2)

"""``transformer``: a small encoder-only text classifier, as blocks, for QNLI-like tasks.

ParallelSFL (paper §5.1) trains RoBERTa (12 transformer layers + a 768×2 FC) on QNLI and splits
it "at the 3rd layer". RoBERTa does not fit the CPU budget, so this is a small BERT/RoBERTa-style
encoder with the same block structure, built from scratch (no pretrained weights, no download):

* block 0 — embedding: token ids → token embedding + learned positional embedding, LayerNorm,
  dropout (post-LN as BERT/RoBERTa);
* blocks 1..n_layers — one ``nn.TransformerEncoderLayer`` (post-LN, ReLU, ``batch_first``) each;
* block n_layers + 1 — head: mean-pool over the non-PAD positions, ``Linear(d, classes)``.

**Inputs.** The data pipeline stores every input as float32, so a sample is ``[L]`` token ids
held as floats (exact below 2^24); ``input_shape = (L,)``. Block 0 rounds the ids and clamps
them into ``[0, vocab_size)`` so any float tensor is a valid input (the FLOPs profile feeds
zeros, generic model tests feed Gaussian noise); id :data:`PAD_ID` (0) is padding and
:data:`SEP_ID` (1) the separator the QNLI tokenizer puts between question and sentence.

**Padding mask.** Blocks pass one tensor, so the mask travels *inside* the activation: every
block after the embedding takes and returns ``[B, L, d + 1]``, where channel ``d`` is a PAD flag
(1.0 = padding, 0.0 = token). Encoder blocks use it as ``src_key_padding_mask`` (PAD keys get no
attention) and pass it on unchanged; the head averages only non-PAD positions. This is what a
real split transformer sends too (hidden states plus the attention mask); it costs one extra
float per position in the smashed data (``L·(d+1)`` elements per sample). A sample made only of
PAD (the profile's zero input) is treated as all tokens — nothing masked, mean over every
position — so no softmax row is fully masked and no mean divides by zero. Outputs at non-PAD
positions do not depend on the PAD positions' content, so a sample's logits are the same however
much trailing padding it has (up to float rounding).

**Cut points.** Cut ``c`` puts blocks ``[0, c)`` on the device: the embedding and ``c - 1``
encoder layers. ParallelSFL's "split at the 3rd layer" follows the convention of its other
splits (AlexNet "at the 5th layer" = the 5 convs on the device; VGG-16 "at the 13th" = the 13
convs): the device holds the first 3 transformer layers (the embedding is not counted as a
layer, as the paper's "12 transformer layers, a 768×2 FC" description of RoBERTa), i.e. cut
:data:`PARALLELSFL_CUT` ``= 4``. The default 6-layer model has cut points ``(2, 4, 6)``:
1, 3 and 5 encoder layers on the device; its default cut (what a fixed-split algorithm uses
with ``cut: null``) is ParallelSFL's, 4.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from splitfl.models.base import BlockModel
from splitfl.models.registry import register_model

VOCAB_SIZE = 8192  # hashed word vocabulary of the QNLI tokenizer (ids 0..8191)
PAD_ID = 0
SEP_ID = 1
D_MODEL = 128
N_HEADS = 4
FF_DIM = 256
N_LAYERS = 6
PARALLELSFL_LAYERS = 3  # encoder layers on the device in ParallelSFL's RoBERTa split
PARALLELSFL_CUT = 1 + PARALLELSFL_LAYERS  # block index: the embedding + 3 encoder layers


def pad_flag(x: torch.Tensor) -> torch.Tensor:
    """Boolean ``[B, L]`` PAD mask carried in the last channel of an activation ``[B, L, d+1]``."""
    return x[..., -1] > 0.5


class TokenEmbedding(nn.Module):
    """Block 0: float token ids ``[B, L]`` → ``[B, L, d + 1]`` (embeddings + PAD flag channel).

    Token embedding (PAD row zero) plus a learned positional embedding for positions
    ``0..max_len-1``, LayerNorm and dropout. Inputs shorter than ``max_len`` are accepted.
    """

    def __init__(self, vocab_size: int, d_model: int, max_len: int, dropout: float = 0.0):
        super().__init__()
        self.vocab_size, self.max_len = vocab_size, max_len
        self.token = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        self.position = nn.Embedding(max_len, d_model)
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        nn.init.normal_(self.token.weight, 0.0, 0.02)  # BERT/RoBERTa initialisation
        nn.init.normal_(self.position.weight, 0.0, 0.02)
        with torch.no_grad():
            self.token.weight[PAD_ID].zero_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 2 or x.shape[1] > self.max_len:
            raise ValueError(f"expected token ids [B, L<={self.max_len}], got {tuple(x.shape)}")
        ids = x.detach().round().long().clamp_(0, self.vocab_size - 1)
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.dropout(self.norm(self.token(ids) + self.position(positions)))
        pad = ids == PAD_ID
        pad &= ~pad.all(dim=1, keepdim=True)  # an all-PAD sample counts as all tokens
        return torch.cat([h, pad.unsqueeze(-1).to(h.dtype)], dim=-1)


class EncoderBlock(nn.Module):
    """Blocks 1..n: one ``nn.TransformerEncoderLayer`` on ``[B, L, d + 1]``, PAD keys masked."""

    def __init__(self, d_model: int, n_heads: int, ff: int, dropout: float = 0.0):
        super().__init__()
        self.layer = nn.TransformerEncoderLayer(
            d_model, n_heads, ff, dropout=dropout, batch_first=True
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flag = x[..., -1:]
        h = self.layer(x[..., :-1], src_key_padding_mask=pad_flag(x))
        return torch.cat([h, flag], dim=-1)


class MeanPoolHead(nn.Module):
    """Last block: mean over non-PAD positions (count clamped to >= 1), then ``Linear(d, C)``."""

    def __init__(self, d_model: int, num_classes: int):
        super().__init__()
        self.fc = nn.Linear(d_model, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keep = (~pad_flag(x)).unsqueeze(-1).to(x.dtype)
        pooled = (x[..., :-1] * keep).sum(dim=1) / keep.sum(dim=1).clamp_min(1.0)
        return self.fc(pooled)


def default_cut_points(n_layers: int) -> tuple[int, ...]:
    """Cuts with 1, ``min(3, n_layers)`` and ``n_layers - 1`` encoder layers on the device.

    ``(2, 4, 6)`` for 6 layers, ``(2, 4, 12)`` for 12 (RoBERTa-base depth); fewer distinct cuts
    for very shallow models.
    """
    on_device = {1, min(PARALLELSFL_LAYERS, n_layers), max(n_layers - 1, 1)}
    return tuple(sorted(1 + k for k in on_device))


def build_transformer(
    seq_len: int,
    num_classes: int,
    vocab_size: int = VOCAB_SIZE,
    d_model: int = D_MODEL,
    n_heads: int = N_HEADS,
    ff: int = FF_DIM,
    n_layers: int = N_LAYERS,
    dropout: float = 0.0,
    cut_points: Sequence[int] | None = None,
) -> BlockModel:
    """Encoder classifier for ``seq_len`` token ids: ``n_layers + 2`` blocks (see module doc).

    Args:
        seq_len: Maximum sequence length (size of the positional embedding).
        num_classes: Output classes.
        vocab_size: Token ids are clamped into ``[0, vocab_size)``; 0 is PAD.
        d_model: Hidden size (must be divisible by ``n_heads``).
        n_heads: Attention heads.
        ff: Feed-forward inner size.
        n_layers: Encoder layers (>= 1).
        dropout: Dropout of the embedding and of every encoder layer.
        cut_points: Candidate cuts; default :func:`default_cut_points`. The model's default
            cut is ParallelSFL's (``1 + min(3, n_layers)``) where it is a candidate, else the
            last candidate.
    """
    if n_layers < 1 or seq_len < 1 or d_model % n_heads:
        raise ValueError(
            f"transformer: need n_layers >= 1, seq_len >= 1 and d_model divisible by n_heads "
            f"(got {n_layers}, {seq_len}, {d_model}/{n_heads})"
        )
    blocks: list[nn.Module] = [TokenEmbedding(vocab_size, d_model, seq_len, dropout)]
    blocks += [EncoderBlock(d_model, n_heads, ff, dropout) for _ in range(n_layers)]
    blocks.append(MeanPoolHead(d_model, num_classes))
    cuts = tuple(default_cut_points(n_layers) if cut_points is None else cut_points)
    paper = 1 + min(PARALLELSFL_LAYERS, n_layers)
    default = paper if paper in cuts else None
    return BlockModel(blocks, cut_points=cuts, name="transformer", default_cut=default)


@register_model(
    "transformer",
    "small post-LN encoder for token ids (L,) e.g. QNLI: embedding + 6 layers (d 128, 4 heads, "
    "ff 256) + mean-pool FC; 8 blocks; cut 4 = ParallelSFL's RoBERTa split (3 layers on device)",
)
def transformer(input_shape: tuple[int, ...], num_classes: int) -> BlockModel:
    """Default-size :func:`build_transformer` for ``input_shape = (seq_len,)``."""
    if len(input_shape) != 1:
        raise ValueError(f"transformer: input shape must be (seq_len,), got {input_shape}")
    return build_transformer(input_shape[0], num_classes)

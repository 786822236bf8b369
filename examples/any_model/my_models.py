"""Models written the usual way — an ``nn.Module`` with its own ``forward`` — for splitfl.

Nothing here imports splitfl. splitfl traces each model's ``forward`` with ``torch.fx`` and
cuts it where the config's ``split:`` section names a module (``layer2`` = after module
``layer2``: the device runs everything up to and including it). Whatever crosses the cut —
one activation, or several tensors (a skip connection, a padding mask) — travels between the
device and the server; ``model.pt`` holds this file's own parameter names.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import TensorDataset


class Residual(nn.Module):
    """A ResNet basic block: conv-bn-relu-conv-bn, plus the input (or its projection)."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    """A small ResNet with torchvision's layout: stem, layer1..3, pooling, flatten, fc."""

    def __init__(self, channels: int = 1, num_classes: int = 10, width: int = 16):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, width, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.layer1 = Residual(width, width)
        self.layer2 = Residual(width, 2 * width, stride=2)
        self.layer3 = Residual(2 * width, 2 * width)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * width, num_classes)

    def forward(self, x):
        x = self.relu(self.bn1(self.conv1(x)))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet(input_shape, num_classes) -> ResNet:
    """The model callable (``model: my_models:resnet``): an ordinary ``nn.Module``."""
    return ResNet(input_shape[0], num_classes)


class TextClassifier(nn.Module):
    """Token ids (int64) → embedding + positions → one transformer layer → mean → classes.
    Cut after ``embed``, two tensors cross: the embeddings and the bool padding mask."""

    def __init__(self, length: int, num_classes: int, vocab: int = 64, dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.positions = nn.Parameter(torch.zeros(length, dim))
        self.encoder = nn.TransformerEncoderLayer(dim, 4, 64, dropout=0.1, batch_first=True)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, ids):
        padding = ids == 0
        h = self.encoder(self.embed(ids) + self.positions, src_key_padding_mask=padding)
        return self.head(h.mean(1))


def text_classifier(input_shape, num_classes) -> TextClassifier:
    return TextClassifier(input_shape[0], num_classes)


def token_data(root=None) -> tuple[TensorDataset, TensorDataset]:
    """A toy text task as token ids (no download): is token 7 in the sentence? int64 ids
    stay integers all the way to the ``nn.Embedding`` on the device."""
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 64, (1200, 16), generator=gen)
    lengths = torch.randint(6, 17, (1200,), generator=gen)
    ids[torch.arange(16) >= lengths[:, None]] = 0  # padding after each sentence
    labels = (ids == 7).any(1).long()
    return TensorDataset(ids[:1000], labels[:1000]), TensorDataset(ids[1000:], labels[1000:])

"""Models written the usual way (an ``nn.Module`` with its own ``forward``), as users bring
them: split by their graph (``splitfl.models.graph``). Builders take ``(input_shape,
num_classes)`` so configs can name them (``model: graph_models:unet``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    """torchvision's ResNet ``BasicBlock`` layout (conv1/bn1/relu/conv2/bn2/downsample)."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += identity  # in place, as torchvision writes it
        return self.relu(out)


class ResNet18(nn.Module):
    """torchvision's ResNet-18 module names and forward (stem, maxpool, layer1-4 of two
    blocks, avgpool, ``torch.flatten`` in forward, fc), at a small width for tests."""

    def __init__(self, num_classes: int = 10, channels: int = 3, width: int = 4):
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(channels, w, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = nn.Sequential(BasicBlock(w, w), BasicBlock(w, w))
        self.layer2 = nn.Sequential(BasicBlock(w, 2 * w, 2), BasicBlock(2 * w, 2 * w))
        self.layer3 = nn.Sequential(BasicBlock(2 * w, 4 * w, 2), BasicBlock(4 * w, 4 * w))
        self.layer4 = nn.Sequential(BasicBlock(4 * w, 8 * w, 2), BasicBlock(8 * w, 8 * w))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * w, num_classes)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


class SmallResNet(nn.Module):
    """A ResNet as users write one: residual blocks, inplace ReLUs, flatten and dropout in
    ``forward``."""

    def __init__(self, num_classes: int = 10, channels: int = 1):
        super().__init__()
        self.stem = nn.Conv2d(channels, 6, 3, padding=1)
        self.layer1 = BasicBlock(6, 6)
        self.layer2 = BasicBlock(6, 8, 2)
        self.layer3 = BasicBlock(8, 8)
        self.drop = nn.Dropout(0.3)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        x = F.relu(self.stem(x), inplace=True)
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.drop(x.mean((2, 3))))


class InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int = 2):
        super().__init__()
        hidden = cin * expand
        self.use_res = stride == 1 and cin == cout
        self.conv = nn.Sequential(
            nn.Conv2d(cin, hidden, 1, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden),
            nn.ReLU6(inplace=True),
            nn.Conv2d(hidden, cout, 1, bias=False),
            nn.BatchNorm2d(cout),
        )

    def forward(self, x):
        return x + self.conv(x) if self.use_res else self.conv(x)


class MobileNetV2Like(nn.Module):
    """MobileNetV2's layout (``features`` of inverted residuals, ``classifier``), cut inside
    ``features`` by path (``features.2``)."""

    def __init__(self, num_classes: int = 10, channels: int = 1):
        super().__init__()
        self.features = nn.Sequential(
            nn.Sequential(nn.Conv2d(channels, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8)),
            InvertedResidual(8, 8, 1),
            InvertedResidual(8, 12, 2),
            InvertedResidual(12, 12, 1),
        )
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(12, num_classes))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class UNet(nn.Module):
    """U-shaped: the skip from ``down`` crosses a cut after ``mid`` (two tensors cross)."""

    def __init__(self, num_classes: int = 10, channels: int = 1):
        super().__init__()
        self.down = nn.Sequential(nn.Conv2d(channels, 4, 3, padding=1), nn.BatchNorm2d(4))
        self.mid = nn.Sequential(nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1), nn.ReLU())
        self.up = nn.Conv2d(8, 6, 3, padding=1)
        self.head = nn.Linear(6, num_classes)

    def forward(self, x):
        d = self.down(x)
        m = self.mid(d)
        u = F.relu(self.up(torch.cat([m, d], 1)))
        return self.head(u.mean((2, 3)))


class TextClassifier(nn.Module):
    """Token ids (int64) → embedding + position embedding → a transformer layer → mean pool →
    classes; the padding mask (token 0) crosses a cut after ``embed``."""

    def __init__(self, num_classes: int = 2, vocab: int = 50, length: int = 12, dim: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(length, dim) * 0.02)
        self.encoder = nn.TransformerEncoderLayer(dim, 2, 32, dropout=0.1, batch_first=True)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, ids):
        pad = ids == 0
        h = self.embed(ids) + self.pos
        h = self.encoder(h, src_key_padding_mask=pad)
        return self.head(h.mean(1))


class Tied(nn.Module):
    """A weight used on both sides of any cut between ``first`` and ``last``."""

    def __init__(self, num_classes: int = 10, channels: int = 1):
        super().__init__()
        self.first = nn.Linear(64 * channels, 64 * channels)
        self.middle = nn.ReLU()
        self.last = nn.Linear(64 * channels, num_classes)

    def forward(self, x):
        x = self.middle(self.first(x.flatten(1)))
        return self.last(F.linear(x, self.first.weight))


class DataDependent(nn.Module):
    """Control flow on a tensor value: torch.fx cannot trace it."""

    def __init__(self, num_classes: int = 10, channels: int = 1):
        super().__init__()
        self.fc = nn.Linear(64 * channels, num_classes)

    def forward(self, x):
        if x.sum() > 0:
            x = x * 2
        return self.fc(x.flatten(1))


class ModeFlag(nn.Module):
    """Dropout through ``F.dropout(training=self.training)``: its graph depends on the mode."""

    def __init__(self, num_classes: int = 10, channels: int = 1):
        super().__init__()
        self.a = nn.Linear(64 * channels, 16)
        self.b = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.b(F.dropout(self.a(x.flatten(1)), 0.5, training=self.training))


def _build(cls):
    def builder(input_shape, num_classes):
        return cls(num_classes, input_shape[0])

    builder.__name__ = cls.__name__.lower()
    return builder


resnet18 = _build(ResNet18)
small_resnet = _build(SmallResNet)
mobilenet = _build(MobileNetV2Like)
unet = _build(UNet)
tied = _build(Tied)
data_dependent = _build(DataDependent)
mode_flag = _build(ModeFlag)


def text_classifier(input_shape, num_classes):
    return TextClassifier(num_classes, length=input_shape[0])

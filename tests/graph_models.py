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


# -- published CIFAR architectures whose forward torch.fx cannot trace as a whole --------------
# (the patterns of kuangliu/pytorch-cifar's ShuffleNetV2 and EfficientNet-B0, at small widths)


class ShuffleBlock(nn.Module):
    """Channel shuffle as ShuffleNetV2 code writes it: ``int()`` on a size read in forward."""

    def __init__(self, groups: int = 2):
        super().__init__()
        self.groups = groups

    def forward(self, x):
        N, C, H, W = x.size()
        g = self.groups
        return x.view(N, g, int(C / g), H, W).permute(0, 2, 1, 3, 4).reshape(N, C, H, W)


class SplitBlock(nn.Module):
    """Split channels at ``int(C * ratio)``: a tuple of two tensors."""

    def __init__(self, ratio: float):
        super().__init__()
        self.ratio = ratio

    def forward(self, x):
        c = int(x.size(1) * self.ratio)
        return x[:, :c, :, :], x[:, c:, :, :]


class ShuffleUnit(nn.Module):
    """ShuffleNetV2's basic unit: split, a 1x1 / depthwise 3x3 / 1x1 branch, concat, shuffle."""

    def __init__(self, channels: int, split_ratio: float = 0.5):
        super().__init__()
        self.split = SplitBlock(split_ratio)
        c = int(channels * split_ratio)
        self.conv1 = nn.Conv2d(c, c, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, 1, 1, groups=c, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.conv3 = nn.Conv2d(c, c, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(c)
        self.shuffle = ShuffleBlock()

    def forward(self, x):
        x1, x2 = self.split(x)
        out = F.relu(self.bn1(self.conv1(x2)))
        out = self.bn2(self.conv2(out))
        out = F.relu(self.bn3(self.conv3(out)))
        return self.shuffle(torch.cat([x1, out], 1))


class ShuffleDown(nn.Module):
    """ShuffleNetV2's down-sampling unit: two stride-2 branches, concat, shuffle."""

    def __init__(self, cin: int, cout: int):
        super().__init__()
        mid = cout // 2
        self.conv1 = nn.Conv2d(cin, cin, 3, 2, 1, groups=cin, bias=False)
        self.bn1 = nn.BatchNorm2d(cin)
        self.conv2 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(mid)
        self.conv3 = nn.Conv2d(cin, mid, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(mid)
        self.conv4 = nn.Conv2d(mid, mid, 3, 2, 1, groups=mid, bias=False)
        self.bn4 = nn.BatchNorm2d(mid)
        self.conv5 = nn.Conv2d(mid, mid, 1, bias=False)
        self.bn5 = nn.BatchNorm2d(mid)
        self.shuffle = ShuffleBlock()

    def forward(self, x):
        out1 = F.relu(self.bn2(self.conv2(self.bn1(self.conv1(x)))))
        out2 = F.relu(self.bn3(self.conv3(x)))
        out2 = F.relu(self.bn5(self.conv5(self.bn4(self.conv4(out2)))))
        return self.shuffle(torch.cat([out1, out2], 1))


class ShuffleNetV2(nn.Module):
    """The CIFAR ShuffleNetV2 layout (conv1/bn1, layer1-3 of a down unit then basic units,
    conv2/bn2, ``F.avg_pool2d(out, 4)``, ``out.view(out.size(0), -1)``, linear)."""

    def __init__(self, num_classes: int = 10, channels: int = 3, widths=(8, 16, 16, 24)):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        cin, layers = 8, []
        for cout in widths[:3]:
            layers.append(nn.Sequential(ShuffleDown(cin, cout), ShuffleUnit(cout)))
            cin = cout
        self.layer1, self.layer2, self.layer3 = layers
        self.conv2 = nn.Conv2d(cin, widths[3], 1, bias=False)
        self.bn2 = nn.BatchNorm2d(widths[3])
        self.linear = nn.Linear(widths[3], num_classes)

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.layer3(self.layer2(self.layer1(out)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = F.avg_pool2d(out, 4)
        out = out.view(out.size(0), -1)
        return self.linear(out)


def swish(x):
    return x * x.sigmoid()


def drop_connect(x, drop_ratio):
    """EfficientNet's drop-connect as research code writes it: a per-sample Bernoulli mask,
    in place."""
    keep_ratio = 1.0 - drop_ratio
    mask = torch.empty([x.shape[0], 1, 1, 1], dtype=x.dtype, device=x.device)
    mask.bernoulli_(keep_ratio)
    x.div_(keep_ratio)
    x.mul_(mask)
    return x


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int):
        super().__init__()
        self.se1 = nn.Conv2d(channels, squeezed, 1)
        self.se2 = nn.Conv2d(squeezed, channels, 1)

    def forward(self, x):
        out = F.adaptive_avg_pool2d(x, (1, 1))
        out = swish(self.se1(out))
        return x * self.se2(out).sigmoid()


class MBConv(nn.Module):
    """EfficientNet's block: expansion, depthwise, squeeze-excite, projection; drop-connect
    under ``if self.training`` on the skip path."""

    def __init__(self, cin, cout, kernel, stride, expand=1, se_ratio=0.25, drop_rate=0.0):
        super().__init__()
        self.expand, self.drop_rate = expand, drop_rate
        hidden = expand * cin
        self.conv1 = nn.Conv2d(cin, hidden, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(hidden)
        self.conv2 = nn.Conv2d(
            hidden, hidden, kernel, stride, (kernel - 1) // 2, groups=hidden, bias=False
        )
        self.bn2 = nn.BatchNorm2d(hidden)
        self.se = SqueezeExcite(hidden, max(1, int(cin * se_ratio)))
        self.conv3 = nn.Conv2d(hidden, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.has_skip = stride == 1 and cin == cout

    def forward(self, x):
        out = x if self.expand == 1 else swish(self.bn1(self.conv1(x)))
        out = swish(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(self.se(out)))
        if self.has_skip:
            if self.training and self.drop_rate > 0:
                out = drop_connect(out, self.drop_rate)
            out = out + x
        return out


class EfficientNet(nn.Module):
    """The CIFAR EfficientNet-B0 layout (conv1/bn1, ``layers`` of MBConv blocks whose
    drop-connect rate grows with depth, pooling, ``F.dropout`` under ``if self.training``,
    linear), at a small width: (expansion, out channels, blocks, kernel, stride) per stage."""

    CFG = ((1, 8, 1, 3, 1), (2, 12, 2, 3, 2), (2, 16, 2, 5, 2))

    def __init__(self, num_classes: int = 10, channels: int = 3, dropout_rate: float = 0.2):
        super().__init__()
        self.dropout_rate = dropout_rate
        self.conv1 = nn.Conv2d(channels, 8, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(8)
        blocks, cin, total = [], 8, sum(c[2] for c in self.CFG)
        for expand, cout, n, kernel, stride in self.CFG:
            for s in [stride] + [1] * (n - 1):
                rate = 0.5 * len(blocks) / total  # drop-connect grows with depth
                blocks.append(MBConv(cin, cout, kernel, s, expand, drop_rate=rate))
                cin = cout
        self.layers = nn.Sequential(*blocks)
        self.linear = nn.Linear(cin, num_classes)

    def forward(self, x):
        out = swish(self.bn1(self.conv1(x)))
        out = self.layers(out)
        out = F.adaptive_avg_pool2d(out, 1)
        out = out.view(out.size(0), -1)
        if self.training and self.dropout_rate > 0:
            out = F.dropout(out, p=self.dropout_rate)
        return self.linear(out)


class ModeSkip(nn.Module):
    """In train mode only, the input is added after ``b``: what crosses a cut after ``a``
    differs between the modes."""

    def __init__(self, num_classes: int = 10, channels: int = 1):
        super().__init__()
        self.a = nn.Linear(64 * channels, 16)
        self.b = nn.Linear(16, 16)
        self.c = nn.Linear(16, num_classes)

    def forward(self, x):
        flat = x.flatten(1)
        h = self.b(torch.relu(self.a(flat)))
        if self.training:
            h = h + flat[:, :16]
        return self.c(h)


class Gated(nn.Module):
    """Control flow on a tensor value inside a submodule (``inner``): it runs whole."""

    def __init__(self, num_classes: int = 10, channels: int = 1):
        super().__init__()
        self.stem = nn.Conv2d(channels, channels, 3, padding=1)
        self.inner = DataDependent(16, channels)
        self.head = nn.Linear(16, num_classes)

    def forward(self, x):
        return self.head(torch.relu(self.inner(self.stem(x))))


class Counted(nn.Module):
    """Shape arithmetic in its own forward (``int()`` on a size): nothing to run whole."""

    def __init__(self, num_classes: int = 10, channels: int = 1):
        super().__init__()
        self.a = nn.Linear(64 * channels, 16)
        self.b = nn.Linear(16, num_classes)

    def forward(self, x):
        h = self.a(x.view(x.size(0), int(x.numel() / x.size(0))))
        return self.b(h)


class CornerAfter(nn.Module):
    """Reads a slice of its raw input after ``conv``: the corner ``x[:, 0, :2, :2]`` is
    sliced before the cut and used by ``fc`` after it, so the slice crosses to the server."""

    def __init__(self, num_classes: int = 10, channels: int = 1):
        super().__init__()
        self.conv = nn.Conv2d(channels, 4, 3, padding=1)
        self.pool = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(16 + 4, num_classes)

    def forward(self, x):
        corner = x[:, 0, :2, :2].flatten(1)
        h = torch.flatten(self.pool(torch.relu(self.conv(x))), 1)
        return self.fc(torch.cat([h, corner], 1))


class InputAfter(CornerAfter):
    """As :class:`CornerAfter`, but sliced after the cut: the whole input ``x`` crosses."""

    def forward(self, x):
        h = torch.flatten(self.pool(torch.relu(self.conv(x))), 1)
        return self.fc(torch.cat([h, x[:, 0, :2, :2].flatten(1)], 1))


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
shufflenet = _build(ShuffleNetV2)
efficientnet = _build(EfficientNet)
mode_skip = _build(ModeSkip)
counted = _build(Counted)
gated = _build(Gated)
corner_after = _build(CornerAfter)
input_after = _build(InputAfter)


def text_classifier(input_shape, num_classes):
    return TextClassifier(num_classes, length=input_shape[0])

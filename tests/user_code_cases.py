"""A researcher's broken code (issue 35.12/13), imported by
``tests/config/test_user_code_errors.py``
under the name ``badcode35``: dataset builders, models and Datasets that fail in every way
the issue lists. Each must be refused in one line naming it."""

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset


class Pairs(Dataset):
    """``n`` items ``(x [1, 8, 8], y)``; ``item`` overrides them, ``length`` what ``len()``
    says, ``targets``/``shape`` set the attributes of those names."""

    def __init__(self, n=64, item=None, length=None, targets=None, shape=None):
        self.n, self._item, self.length = n, item, length
        if targets is not None:
            self.targets = targets
        if shape is not None:
            self.input_shape = shape

    def __len__(self):
        return self.length or self.n

    def __getitem__(self, i):
        if i >= self.n:
            raise IndexError(i)
        if self._item:
            return self._item(i)
        return torch.full((1, 8, 8), float(i % 7) / 7), i % 4


def pair(**kw):
    return Pairs(**kw), Pairs(n=16, **kw)


def _odd_shape(i):
    return torch.zeros(1, 8, 9 if i % 5 == 0 else 8), i % 4


def ds_ok(root=None):
    return pair()


def ds_keyerror(root=None):
    return {}["missing"]


def ds_attr(root=None):
    return None.shape


def ds_index(root=None):
    return [][3]


def ds_zero(root=None):
    return 1 / 0


def ds_assert(root=None):
    raise AssertionError("bad data")


def ds_value(root=None):
    raise ValueError("cannot parse")


def ds_none(root=None):
    return None


def ds_shapes(root=None):
    return pair(item=_odd_shape)


def ds_shapes_lazy(root=None):
    return Pairs(item=_odd_shape, targets=list(range(4)) * 16), Pairs(n=16)


def ds_shapes_declared(root=None):
    """Declares its input shape: items are read only when a batch needs them."""

    def item(i):  # one odd item, past the few the model is checked on
        return torch.zeros(1, 8, 9 if i == 37 else 8), i % 4

    train = Pairs(item=item, shape=(1, 8, 8), targets=list(range(4)) * 16)
    return train, Pairs(n=16, shape=(1, 8, 8), targets=list(range(4)) * 4)


def ds_names(root=None):
    return pair(item=lambda i: (torch.zeros(1, 8, 8), ["cat", "dog"][i % 2]))


def ds_onehot(root=None):
    return pair(item=lambda i: (torch.zeros(1, 8, 8), torch.eye(4)[i % 4]))


def ds_none_label(root=None):
    return pair(item=lambda i: (torch.zeros(1, 8, 8), None))


def ds_huge_label(root=None):
    return pair(item=lambda i: (torch.zeros(1, 8, 8), 2**40 if i == 3 else i % 4))


def ds_long(root=None):
    return pair(length=80)


def ds_long_lazy(root=None):
    return Pairs(length=80, targets=[i % 4 for i in range(80)]), Pairs(n=16)


def ds_float_label(root=None):
    return pair(item=lambda i: (torch.zeros(1, 8, 8), 1.7))


def ds_string_label(root=None):
    return pair(item=lambda i: (torch.zeros(1, 8, 8), str(i % 4)))


def ds_targets_disagree(root=None):
    return Pairs(targets=[0] * 64), Pairs(n=16, targets=[0] * 16)


def ds_exit(root=None):
    raise SystemExit(0)


class Cast(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, x):
        return x.to(self.dtype)


class NaNs(nn.Module):
    def forward(self, x):
        return x * float("nan")


class FixedBatch(nn.Module):
    def forward(self, x):
        return x.reshape(2, -1)


class Broken(nn.Module):
    def forward(self, x):
        return {}["oops"]


class Pick(nn.Module):
    def forward(self, x):
        return x.flatten(1)[:, :4]


def _mlp(tail=None, input_shape=(1, 8, 8), num_classes=4):
    d = int(np.prod(input_shape))
    head = [nn.Linear(16, num_classes)] + ([tail] if tail is not None else [])
    return nn.Sequential(nn.Sequential(nn.Flatten(), nn.Linear(d, 16)), nn.Sequential(*head))


def m_ok(input_shape, num_classes):
    return _mlp(None, input_shape, num_classes)


def m_int64(input_shape, num_classes):
    return _mlp(Cast(torch.int64), input_shape, num_classes)


def m_float64(input_shape, num_classes):
    return _mlp(Cast(torch.float64), input_shape, num_classes)


def m_float16(input_shape, num_classes):
    return _mlp(Cast(torch.float16), input_shape, num_classes)


def m_nan(input_shape, num_classes):
    return _mlp(NaNs(), input_shape, num_classes)


def m_fixed_batch(input_shape, num_classes):
    return _mlp(FixedBatch(), input_shape, num_classes)


def m_forward_error(input_shape, num_classes):
    return _mlp(Broken(), input_shape, num_classes)


def m_builder_error(input_shape, num_classes):
    return {}["x"]


def m_no_parameters(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), Pick())


def m_flatten_first(input_shape, num_classes):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(input_shape)), num_classes))


def m_relu_first(input_shape, num_classes):
    d = int(np.prod(input_shape))
    return nn.Sequential(nn.ReLU(), nn.Flatten(), nn.Linear(d, num_classes))


def _declared(cuts, input_shape, num_classes):
    model = _mlp(None, input_shape, num_classes)
    model.cut_points = cuts
    return model


def m_cuts_empty(input_shape, num_classes):
    return _declared([], input_shape, num_classes)


def m_cuts_string(input_shape, num_classes):
    return _declared("1", input_shape, num_classes)


def m_cuts_floats(input_shape, num_classes):
    return _declared([1.0], input_shape, num_classes)


class Net(nn.Module):
    """A model with its own forward (split by its graph): a bare Flatten first."""

    def __init__(self, d, k):
        super().__init__()
        self.flat = nn.Flatten()
        self.fc1 = nn.Linear(d, 16)
        self.fc2 = nn.Linear(16, k)

    def forward(self, x):
        return self.fc2(self.fc1(self.flat(x)).relu())


def m_net(input_shape, num_classes):
    return Net(int(np.prod(input_shape)), num_classes)

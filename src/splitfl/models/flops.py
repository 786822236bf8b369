"""Count FLOPs of a piece of PyTorch code with torch's own per-operator formulas
(:data:`torch.utils.flop_counter.flop_registry`), without importing torch's compiler stack.

:class:`torch.utils.flop_counter.FlopCounterMode` wraps its dispatch handler in
``torch._dynamo.disable``, which imports ``torch._dynamo`` (and with it the inductor) on first
use: about a second of start-up for a command that only needs a model's profile. The mode here
runs the same algorithm — skip metadata queries, decompose an operator that has no formula
where it can, otherwise run it and add its formula's count — so its totals are identical
(``tests/models/test_models.py`` compares both on every model of the zoo). It does not track modules
(only the total is needed) and does not count higher-order operators (compiled regions,
``cond``), which the profiled models do not use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

_aten = torch.ops.aten
#: Operators torch's counter passes on untouched (size/stride queries of unusual tensors).
_METADATA_OPS = frozenset(
    getattr(_aten, name).default
    for name in (
        "is_contiguous",
        "is_strides_like_format",
        "is_non_overlapping_and_dense",
        "size",
        "sym_size",
        "stride",
        "sym_stride",
        "storage_offset",
        "sym_storage_offset",
        "numel",
        "sym_numel",
        "dim",
        "sym_is_contiguous",
    )
    if hasattr(_aten, name)
) | {_aten.is_contiguous.memory_format, torch.ops.prim.layout.default}


def _register_cpu_attention_flops() -> None:
    """torch's flop registry has formulas for the CUDA attention kernels but not for the CPU
    flash-attention kernel (and its backward); register the same formulas for them so
    transformer blocks are not under-counted on CPU."""

    def forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return flop_counter.sdpa_flop_count(query_shape, key_shape, value_shape)

    def backward(grad_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kw):
        return flop_counter.sdpa_backward_flop_count(
            grad_shape, query_shape, key_shape, value_shape
        )

    pairs = [
        ("_scaled_dot_product_flash_attention_for_cpu", forward),
        ("_scaled_dot_product_flash_attention_for_cpu_backward", backward),
    ]
    for op_name, formula in pairs:
        op = getattr(_aten, op_name, None)
        if (
            op is None
            or op in flop_counter.flop_registry
            or op.default in flop_counter.flop_registry
        ):
            continue
        flop_counter.register_flop_formula(op)(formula)


_register_cpu_attention_flops()


class _FlopMode(TorchDispatchMode):
    """Adds each operator's FLOPs (torch's formula for it) to :attr:`total`."""

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # True (torch's default) wraps __torch_dispatch__ in torch._dynamo.disable, which
        # imports the compiler stack; nothing is compiled while counting.
        return False

    def __init__(self) -> None:
        super().__init__()
        self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        kwargs = kwargs or {}
        if func in _METADATA_OPS:
            return NotImplemented
        registry = flop_counter.flop_registry
        if func not in registry and func is not torch.ops.prim.device.default:
            with self:
                out = func.decompose(*args, **kwargs)
                if out is not NotImplemented:
                    return out
        out = func(*args, **kwargs)
        formula = registry.get(func._overloadpacket)
        if formula is not None:
            self.total += formula(*args, **kwargs, out_val=out)
        return out


def count_flops(fn: Callable[[], Any]) -> int:
    """FLOPs of the operators ``fn()`` runs (its forward and any backward it calls), as
    :class:`torch.utils.flop_counter.FlopCounterMode` counts them."""
    mode = _FlopMode()
    with mode:
        fn()
    return mode.total

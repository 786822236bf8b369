"""splitfl's message format: a JSON header and raw tensor bytes, nothing ever unpickled.

The one format of every message between splitfl processes: the network wire
(:mod:`splitfl.net.transport.wire`, on gRPC streams) and the channel between
``executor: parallel``'s driver and its workers (:mod:`splitfl.executors.channel`). A leaf module
(torch only).

A message is encoded as::

    b"SFL1" | header length (u32, little-endian) | header (UTF-8 JSON object) | tensor bytes

The header holds ``type`` (a string), ``fields`` (JSON values) and ``tensors``: a list of
``[name, dtype, shape]``; the tensor bytes follow in that order, each C-contiguous and
little-endian, ``prod(shape) × itemsize`` bytes, each starting at an offset that is a
multiple of 8 (the header is padded with spaces, each tensor with zero bytes), so tensors can
be read in place from the received buffer. A tensor is read in place only where it starts at a
multiple of :data:`ALIGNMENT` (64 bytes, as torch's own CPU tensors do), else it is copied: the
BLAS kernels round differently on less aligned operands, and a received tensor must compute
exactly as the sender's would. Nothing is ever unpickled: a tensor is
rebuilt with :func:`torch.frombuffer` from its declared dtype (one of :data:`DTYPES`) and shape,
and the decoder refuses any message whose sizes do not add up exactly (:class:`WireError`).
Headers are strict JSON both ways: NaN and infinities are neither sent nor accepted, and a
header nesting deeper than :data:`MAX_HEADER_DEPTH` is refused (:func:`parse_header`).
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from dataclasses import dataclass, field
from typing import Any

import torch

MAGIC = b"SFL1"
#: Largest header accepted (JSON text).
MAX_HEADER_BYTES = 1 << 20
#: Deepest nesting of JSON objects/arrays accepted in a header (splitfl's own need 4).
MAX_HEADER_DEPTH = 16
#: Dtypes allowed on the wire, by name.
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_DIMS = 8
#: Address alignment of every decoded tensor: that of torch's CPU allocator. MKL's matrix
#: products round differently on an 8-byte aligned operand than on a 64-byte aligned one (a
#: networked server's activation gradient, computed on smashed data read in place at an
#: 8-byte aligned offset of the message, differed from the in-process one by one float32
#: ulp; split training amplified it), so a tensor that would be read in place at another
#: address is copied into a tensor of its own.
ALIGNMENT = 64

# A network message of one chunk is decoded in place from the received (immutable) ``bytes``;
# nothing else holds that object, so torch's warning about non-writable buffers does not apply.
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


class WireError(ValueError):
    """A message that is not well-formed splitfl wire data (or breaks a limit)."""


@dataclass
class Message:
    """A decoded message: its type, JSON fields and named tensors (CPU)."""

    type: str
    fields: dict[str, Any] = field(default_factory=dict)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def _aligned(n: int) -> int:
    return -(-n // 8) * 8


class Frame:
    """An encoded message as its parts (header, then each tensor's bytes and padding), not
    yet copied: :func:`chunks` copies each part once, into the stream's chunks. The tensors
    must not change until the frame is sent (every caller sends fresh or frozen tensors)."""

    def __init__(self, parts: list[memoryview]):
        self.parts = parts
        self.nbytes = sum(p.nbytes for p in parts)

    def __len__(self) -> int:
        return self.nbytes

    def tobytes(self) -> bytearray:
        return bytearray().join(self.parts)


_PAD = memoryview(bytes(8))


def encode(message: Message) -> Frame:
    """The message (see the module docstring) as a :class:`Frame`. Tensors are sent as they
    are (no dtype conversion); a dtype outside :data:`DTYPES` raises :class:`WireError`."""
    specs, flats = [], []
    for name, tensor in message.tensors.items():
        if tensor.dtype not in _NAMES:
            raise WireError(f"tensor {name!r}: dtype {tensor.dtype} cannot be sent")
        specs.append([name, _NAMES[tensor.dtype], list(tensor.shape)])
        flats.append(_raw_bytes(tensor))
    try:
        header = _HEADER.encode(
            {"type": message.type, "fields": message.fields, "tensors": specs}
        ).encode()
    except (TypeError, ValueError) as err:  # NaN/inf (strict JSON) or a non-JSON value
        raise WireError(f"{message.type!r} cannot be sent: {err}") from None
    header += b" " * (_aligned(8 + len(header)) - 8 - len(header))
    parts = [memoryview(MAGIC + struct.pack("<I", len(header)) + header)]
    for flat in flats:
        parts.append(flat)
        if flat.nbytes % 8:
            parts.append(_PAD[: _aligned(flat.nbytes) - flat.nbytes])
    return Frame(parts)


#: One JSON encoder for every header (``json.dumps`` with options builds a new one per call).
_HEADER = json.JSONEncoder(separators=(",", ":"), allow_nan=False)


def _raw_bytes(tensor: torch.Tensor) -> memoryview:
    """A CPU tensor's bytes in C order, without a copy where it already is one: the numpy
    view's bytes (one torch call for the common case: a contiguous, non-empty CPU tensor of a
    dtype numpy has, outside autograd); otherwise detached, moved to the CPU, made contiguous
    (bfloat16, which numpy lacks, through a uint8 view)."""
    try:
        return memoryview(tensor.numpy()).cast("B")
    except (TypeError, RuntimeError):  # grad, not CPU, bfloat16, empty or strided: below
        pass
    t = tensor.detach()
    if not t.numel():
        return memoryview(b"")
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    if t.dtype == torch.bfloat16:
        t = t.reshape(-1).view(torch.uint8)
    return memoryview(t.numpy()).cast("B")


def decode(data: bytes | bytearray | memoryview | Frame) -> Message:
    """Parse and check a message: magic, header JSON, dtypes, shapes and exact sizes. A
    tensor is a view of ``data`` (a buffer or a view: a network ``Reassembler``'s output, its
    own buffer or the received chunk itself) where it starts at a multiple of
    :data:`ALIGNMENT`, else a copy of its own (see there)."""
    if isinstance(data, Frame):
        data = data.tobytes()
    elif not isinstance(data, bytearray | memoryview):
        data = bytearray(data)
    end = len(data)
    if end < 8 or data[:4] != MAGIC:
        raise WireError("not a splitfl message (bad magic)")
    size = int.from_bytes(data[4:8], "little")
    if size > MAX_HEADER_BYTES or 8 + size > end:
        raise WireError(f"header length {size} out of bounds")
    header = parse_header(data[8 : 8 + size])
    if not isinstance(header, dict) or not isinstance(header.get("type"), str):
        raise WireError("header must be an object with a string 'type'")
    fields, specs = header.get("fields", {}), header.get("tensors", [])
    if not isinstance(fields, dict) or not isinstance(specs, list):
        raise WireError("header 'fields' must be an object and 'tensors' a list")
    tensors, offset = {}, _aligned(8 + size)
    for spec in specs:
        name, dtype, shape = _tensor_spec(spec)
        count = math.prod(shape)
        nbytes = count * dtype.itemsize
        if offset + nbytes > end:
            raise WireError(f"tensor {name!r}: {nbytes} bytes declared, message too short")
        tensors[name] = _tensor_at(data, dtype, shape, count, offset)
        offset += _aligned(nbytes)
    if offset != end:
        raise WireError(f"{end - offset} trailing bytes after the declared tensors")
    return Message(header["type"], fields, tensors)


def _tensor_at(data, dtype: torch.dtype, shape: list[int], count: int, offset: int):
    """The tensor at ``offset`` of ``data``: read in place where it starts at a multiple of
    :data:`ALIGNMENT`, else copied (it computes as the sender's tensor)."""
    if not count:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(data, dtype=dtype, count=count, offset=offset)
    if flat.data_ptr() % ALIGNMENT:
        flat = flat.clone()
    return flat if len(shape) == 1 else flat.view(shape)


def parse_header(text: bytes | bytearray | memoryview) -> Any:
    """Strict JSON (RFC 8259): no ``NaN``/``Infinity`` literals, no number that overflows a
    float, nesting at most :data:`MAX_HEADER_DEPTH`; anything else is a one-line
    :class:`WireError` (never Python's exception text to the peer)."""
    try:
        text = str(text, "utf-8")
        value = _STRICT.decode(text)
    except RecursionError:
        raise WireError(f"header nests deeper than {MAX_HEADER_DEPTH}") from None
    except WireError:
        raise
    except (UnicodeDecodeError, ValueError):  # JSONDecodeError, a 5000-digit integer
        raise WireError("header is not JSON (strict RFC 8259)") from None
    # a text with at most MAX_HEADER_DEPTH brackets cannot nest deeper (splitfl's own headers)
    opened = text.count("[") + text.count("{")
    if opened > MAX_HEADER_DEPTH and _depth(value) > MAX_HEADER_DEPTH:
        raise WireError(f"header nests deeper than {MAX_HEADER_DEPTH}")
    return value


def _non_finite(literal: str):
    raise WireError(f"non-finite number {literal} in header (strict JSON)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise WireError(f"number {text[:20]} overflows (strict JSON)")
    return value


#: One strict decoder for every header (``json.loads`` with hooks builds a new one per call).
_STRICT = json.JSONDecoder(parse_constant=_non_finite, parse_float=_finite_float)


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value (iterative: no recursion on hostile input)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth > MAX_HEADER_DEPTH:
                return depth
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return deepest


def _tensor_spec(spec: Any) -> tuple[str, torch.dtype, list[int]]:
    ok = isinstance(spec, list) and len(spec) == 3 and isinstance(spec[0], str)
    if not ok or spec[1] not in DTYPES or not isinstance(spec[2], list):
        raise WireError(f"bad tensor spec {str(spec)[:80]}")
    shape = spec[2]
    if len(shape) > _MAX_DIMS or not all(isinstance(d, int) and 0 <= d < 2**40 for d in shape):
        raise WireError(f"tensor {spec[0]!r}: bad shape {str(shape)[:80]}")
    return spec[0], DTYPES[spec[1]], shape


def state_tensors(prefix: str, state: dict[str, torch.Tensor] | None) -> dict[str, torch.Tensor]:
    """A state dict's tensors under ``prefix/`` names (several states in one message)."""
    return {f"{prefix}/{k}": v for k, v in (state or {}).items()}


def state_from(prefix: str, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict sent under ``prefix/`` (:func:`state_tensors`)."""
    cut = len(prefix) + 1
    return {k[cut:]: v for k, v in tensors.items() if k.startswith(prefix + "/")}

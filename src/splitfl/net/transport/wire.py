"""splitfl's wire format on the gRPC stream: messages of :mod:`splitfl.core.framing` in chunks.

A message is a JSON header and raw tensor bytes (:mod:`splitfl.core.framing`, re-exported here:
:class:`Message`, :func:`encode`, :func:`decode`, :class:`WireError`, ...); nothing is ever
unpickled, headers are strict JSON and the decoder refuses any message whose sizes do not add
up exactly.

On the gRPC stream a message travels as chunks of at most ``chunk_bytes``: each chunk is one
gRPC message, its *last* byte ``1`` on the last chunk of a message and ``0`` before it
(:func:`chunks`, :class:`Reassembler`), so messages larger than gRPC's size limit pass and a
receiver can refuse an oversized message before holding it whole. With the flag at the end a
message that fits one chunk starts where the received ``bytes`` object's data starts (16-byte
aligned in CPython), so its tensors are read in place there, without a copy, where they start
64-byte aligned (elsewhere copied: :data:`~splitfl.core.framing.ALIGNMENT`) (protocol 3; in
protocol 2 the flag came first and every message was copied into an aligned buffer).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch

from splitfl.core.framing import (
    DTYPES,
    MAGIC,
    MAX_HEADER_BYTES,
    MAX_HEADER_DEPTH,
    Frame,
    Message,
    WireError,
    decode,
    encode,
    parse_header,
    state_from,
    state_tensors,
)

__all__ = [
    "DTYPES",
    "MAGIC",
    "MAX_HEADER_BYTES",
    "MAX_HEADER_DEPTH",
    "PROTOCOL_VERSION",
    "Frame",
    "Message",
    "Reassembler",
    "WireError",
    "all_finite",
    "chunks",
    "extremes",
    "decode",
    "encode",
    "parse_header",
    "payload_bytes",
    "state_from",
    "state_tensors",
]

#: Protocol version: a peer announcing another one is refused at hello.
#: 2: keepalive ping/pong, no server network section; 3: chunk flag last; 4: the token is
#: proved by challenge–response (:mod:`splitfl.net.transport.handshake`), never sent; 5: a RingSFL
#: member acknowledges its ``ring`` command as it starts it (``ring_started``:
#: :mod:`splitfl.net.server.ring`); 6: a hosted cluster's ``host`` command carries the group's
#: whole plan (:mod:`splitfl.core.plan_codec`) instead of five of its fields; 7: the plan's
#: training pattern is a typed topology payload (:mod:`splitfl.core.topology`)
PROTOCOL_VERSION = 7


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite (:func:`extremes`: one pass, no temporary)."""
    if not t.is_floating_point():
        return True
    low, high = extremes(t)
    return math.isfinite(low) and math.isfinite(high)


def extremes(t: torch.Tensor) -> tuple[float, float]:
    """Smallest and largest value of a tensor in one pass (NaN if any is NaN; 0 if empty); a
    small integer tensor (class labels) through a Python list (fewer torch calls)."""
    n = t.numel()
    if not n:
        return 0.0, 0.0
    if n <= _SMALL and not t.is_floating_point():
        values = t.reshape(-1).tolist()
        return min(values), max(values)
    low, high = torch.aminmax(t)
    return low.item(), high.item()


_SMALL = 1024


def payload_bytes(message: Message) -> int:
    """Bytes of the message's tensors alone (what the cost model counts)."""
    return sum(t.numel() * t.element_size() for t in message.tensors.values())


def chunks(data: Frame | bytes | bytearray, chunk_bytes: int) -> Iterator[bytes]:
    """``data`` as stream chunks: ≤ chunk_bytes of it + a flag byte (1 = last chunk of the
    message), each built with one copy of the frame's parts."""
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be >= 1")
    parts = data.parts if isinstance(data, Frame) else [memoryview(data)]
    total, sent = sum(p.nbytes for p in parts), 0
    if total <= chunk_bytes:  # one chunk (most messages): one join, no slicing
        yield b"".join([*parts, _LAST])
        return
    pending: list[memoryview] = []
    room = chunk_bytes
    for part in parts:
        while part.nbytes:
            take = part[:room]
            pending.append(take)
            part, room, sent = part[take.nbytes :], room - take.nbytes, sent + take.nbytes
            if room == 0:
                pending.append(_LAST if sent == total else _MORE)
                yield b"".join(pending)
                pending, room = [], chunk_bytes
    if pending or total == 0:
        yield b"".join([*pending, _LAST])


_LAST, _MORE = b"\x01", b"\x00"


class Reassembler:
    """Joins stream chunks into messages; refuses one growing beyond ``max_bytes``."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._parts: list[memoryview] = []
        self._size = 0

    def feed(self, chunk: bytes) -> bytearray | memoryview | None:
        """Add a chunk; the whole message once its last chunk arrived, else None: a message
        of one chunk as a view of that chunk (no copy), a longer one joined into a buffer."""
        if not chunk or chunk[-1] not in (0, 1):
            if len(chunk) >= 5 and chunk[0] in (0, 1) and chunk[1:5] == MAGIC:
                raise WireError(
                    f"chunk framing of protocol 2 (flag byte first); this side speaks "
                    f"{PROTOCOL_VERSION}: install the same splitfl version on both ends"
                )
            raise WireError("bad chunk flag")
        self._size += len(chunk) - 1
        if self._size > self.max_bytes:
            raise WireError(f"message exceeds the {self.max_bytes}-byte limit")
        body = memoryview(chunk)[:-1]
        if chunk[-1] == 1 and not self._parts:
            self._size = 0
            return body
        self._parts.append(body)
        if chunk[-1] == 0:
            return None
        data, self._parts, self._size = bytearray().join(self._parts), [], 0
        return data

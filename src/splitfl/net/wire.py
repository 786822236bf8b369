"""splitfl's wire format on the gRPC stream: messages of :mod:`splitfl.framing` in chunks.

A message is a JSON header and raw tensor bytes (:mod:`splitfl.framing`, re-exported here:
:class:`Message`, :func:`encode`, :func:`decode`, :class:`WireError`, ...); nothing is ever
unpickled, headers are strict JSON and the decoder refuses any message whose sizes do not add
up exactly.

On the gRPC stream a message travels as chunks of at most ``chunk_bytes``: each chunk is one
gRPC message, its first byte ``1`` on the last chunk of a message and ``0`` before it
(:func:`chunks`, :class:`Reassembler`), so messages larger than gRPC's size limit pass and a
receiver can refuse an oversized message before holding it whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from splitfl.framing import (
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
    "decode",
    "encode",
    "parse_header",
    "payload_bytes",
    "state_from",
    "state_tensors",
]

#: Protocol version: a peer announcing another one is refused at hello.
PROTOCOL_VERSION = 2  # 2: keepalive ping/pong, welcome without the server's network section


def all_finite(t: torch.Tensor) -> bool:
    """Whether every value of ``t`` is finite: the sum first (one pass, no temporary; it is
    finite for finite values unless it overflows), the element-wise check only if it is not."""
    if not t.is_floating_point() or t.numel() == 0:
        return True
    return bool(torch.isfinite(t.sum())) or bool(torch.isfinite(t).all())


def payload_bytes(message: Message) -> int:
    """Bytes of the message's tensors alone (what the cost model counts)."""
    return sum(t.numel() * t.element_size() for t in message.tensors.values())


def chunks(data: Frame | bytes | bytearray, chunk_bytes: int) -> Iterator[bytes]:
    """``data`` as stream chunks: a flag byte (1 = last chunk of the message) + ≤ chunk_bytes,
    each built with one copy of the frame's parts."""
    if chunk_bytes < 1:
        raise ValueError("chunk_bytes must be >= 1")
    parts = data.parts if isinstance(data, Frame) else [memoryview(data)]
    total, sent = sum(p.nbytes for p in parts), 0
    pending: list[memoryview] = []
    room = chunk_bytes
    for part in parts:
        while part.nbytes:
            take = part[:room]
            pending.append(take)
            part, room, sent = part[take.nbytes :], room - take.nbytes, sent + take.nbytes
            if room == 0:
                yield b"".join([b"\x01" if sent == total else b"\x00", *pending])
                pending, room = [], chunk_bytes
    if pending or total == 0:
        yield b"".join([b"\x01", *pending])


class Reassembler:
    """Joins stream chunks into messages; refuses one growing beyond ``max_bytes``."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._parts: list[memoryview] = []
        self._size = 0

    def feed(self, chunk: bytes) -> bytearray | None:
        """Add a chunk; the whole message once its last chunk arrived, else None."""
        if not chunk or chunk[0] not in (0, 1):
            raise WireError("bad chunk flag")
        self._size += len(chunk) - 1
        if self._size > self.max_bytes:
            raise WireError(f"message exceeds the {self.max_bytes}-byte limit")
        self._parts.append(memoryview(chunk)[1:])
        if chunk[0] == 0:
            return None
        data, self._parts, self._size = bytearray().join(self._parts), [], 0
        return data

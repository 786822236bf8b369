"""A hand-driven stream to a splitfl listener (the server's hub, a device's peer listener) for
tests: a hello (or nothing), the listener's challenge answered with the token's proof
(protocol 4; before it, the token travelled in the hello), and the outcome of the call.
Written against the wire alone, so the same test drives older code."""

from __future__ import annotations

import queue
import threading

import grpc

from splitfl.net.transport import auth
from splitfl.net.transport.hub import METHOD
from splitfl.net.transport.wire import (
    PROTOCOL_VERSION,
    Message,
    Reassembler,
    chunks,
    decode,
    encode,
)

#: whether the code under test proves tokens by challenge–response
CHALLENGE = hasattr(auth, "token_proof")


class RawStream:
    """One stream: :meth:`hello` (answering the challenge unless ``answer=False``),
    :meth:`outcome` (``"welcome"``, the status code it ended with, ``"ended"`` or
    ``"open"``), :meth:`close`."""

    def __init__(self, port: int, host: str = "127.0.0.1"):
        self.channel = grpc.insecure_channel(f"{host}:{port}")
        self.out: queue.Queue = queue.Queue()
        self.call = self.channel.stream_stream(METHOD)(iter(self.out.get, None))
        self.got: queue.Queue = queue.Queue()
        self.nonces: list[str] = []
        self.reader: threading.Thread | None = None
        self.token, self.fields, self.answer = "", {}, True
        self.details = ""  # the status details of the end, set before its code is queued

    def send(self, message: Message) -> None:
        for chunk in chunks(encode(message), 1 << 16):
            self.out.put(chunk)

    def hello(self, name: str, token: str, clients=(), pad: int = 0, answer: bool = True):
        self.token, self.answer = token, answer
        self.fields = {"protocol": PROTOCOL_VERSION, "name": name, "clients": list(clients)}
        if pad:
            self.fields["pad"] = "x" * pad
        if not CHALLENGE:
            self.fields["token"] = token
        self.send(Message("hello", self.fields))
        self.read()
        return self

    def read(self) -> None:
        """Start reading the listener's answers (once)."""
        if self.reader is None:
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()

    def _read(self) -> None:
        assembler = Reassembler(1 << 24)
        try:
            for chunk in self.call:
                data = assembler.feed(chunk)
                if data is None:
                    continue
                msg = decode(data)
                if msg.type == "challenge":
                    self.nonces.append(msg.fields["nonce"])
                    if self.answer:
                        self.send(self.proof(msg.fields["nonce"]))
                    continue
                self.got.put(msg.type)
        except grpc.RpcError as err:
            self.details = err.details()  # before the code: a reader of the code reads it next
            self.got.put(err.code())
            return
        self.got.put("ended")

    def proof(self, nonce: str) -> Message:
        return Message("proof", {"proof": auth.token_proof(self.token, nonce, self.fields)})

    def outcome(self, wait_s: float):
        self.read()
        try:
            return self.got.get(timeout=wait_s)
        except queue.Empty:
            return "open"

    def close(self) -> None:
        self.out.put(None)
        self.call.cancel()
        self.channel.close()


def silent_streams(port: int, n: int) -> list[RawStream]:
    """``n`` streams that never say hello (a stream opens with its first chunk: a bare one)."""
    streams = [RawStream(port) for _ in range(n)]
    for s in streams:
        s.out.put(b"\x00")
    return streams

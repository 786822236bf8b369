"""The opening of every link (protocol 4), both ends: the device's ``hello`` (protocol, name,
clients, peer listener — no token), the listener's ``challenge`` (a fresh nonce), the
device's ``proof`` (:func:`~splitfl.net.transport.auth.token_proof` over the nonce and its hello),
then ``welcome`` or a refusal. The server's hub and a device's peer listener check a hello with
:func:`hello_problem`; the server's device session and a peer channel answer a challenge
with :func:`answer`.
"""

from __future__ import annotations

from collections.abc import Iterator

from splitfl.net.transport.auth import token_proof
from splitfl.net.transport.wire import PROTOCOL_VERSION, Message, Reassembler, WireError, decode

#: A refusal of the device's name because its current link still answers keepalives.
CONNECTED_ALREADY = "is connected already"
_INSTALL = "install the same splitfl version on both ends"


def version_problem(protocol) -> str | None:
    """One line when ``protocol`` is not this side's version (names both), else None."""
    if type(protocol) is int and protocol == PROTOCOL_VERSION:
        return None
    if type(protocol) is int:
        said = f"protocol version {protocol}"
    else:
        said = f"protocol {str(protocol)[:20]!r} (a {type(protocol).__name__}, not a version)"
    return f"{said} not supported; this server speaks {PROTOCOL_VERSION} ({_INSTALL})"


def hello_problem(hello: Message) -> str | None:
    """Why a stream's first message is not a usable hello (one line), else None."""
    if hello.type != "hello":
        return f"expected hello, got {hello.type[:40]!r}"
    f = hello.fields
    problem = version_problem(f.get("protocol"))
    if problem is not None:
        return problem
    name = f.get("name")
    if not isinstance(name, str) or not 0 < len(name) <= 200:
        return f"bad device name {str(name)[:60]!r}"
    peer = f.get("peer") or {}
    if not isinstance(peer, dict):
        return "bad peer listener"
    listen, cert = peer.get("address", ""), peer.get("cert", "")
    if not isinstance(listen, str) or not isinstance(cert, str) or len(listen) > 300:
        return "bad peer listener"
    return None


def read_message(requests: Iterator[bytes], assembler: Reassembler) -> Message | None:
    """The next whole message of a stream (None: the stream ended first)."""
    for chunk in requests:
        data = assembler.feed(chunk)
        if data is not None:
            return decode(data)
    return None


def challenge(nonce: str) -> Message:
    return Message("challenge", {"protocol": PROTOCOL_VERSION, "nonce": nonce})


def answer(token: str, hello: dict, msg: Message) -> Message:
    """The device's ``proof`` for a listener's ``challenge`` (WireError if malformed)."""
    nonce = msg.fields.get("nonce")
    if not isinstance(nonce, str) or not 32 <= len(nonce) <= 256:
        raise WireError("challenge without a nonce")
    return Message("proof", {"proof": token_proof(token, nonce, hello)})

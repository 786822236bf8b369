"""Device tokens, the challenge–response that proves one, and TLS credentials.

The server keeps only SHA-256 hashes of device tokens: a tokens file has one ``name:hash``
line per device (``#`` comments allowed), optionally binding the client ids that token may
host: ``name:hash:clients=0-4,7``; ``name:hash:clients=auto`` (what ``splitfl token`` writes
by default) binds the clients the device is first given, for the rest of the run; a line
without ``clients=`` (``splitfl token --any-client``, and every line written before) may host
any client no other token is bound to. A device keeps its token (32 random bytes, hex) in a
file of its own. :func:`new_token` makes one (``splitfl token``).

**The token never crosses the wire** (protocol 4): the device says hello (name, protocol,
clients, peer listener), the listener answers with a fresh random nonce, and the device
sends :func:`proof` — HMAC-SHA256 keyed by SHA-256(token) over the nonce and its whole hello
(:func:`transcript`). A captured hello and proof are worth nothing on another stream (another
nonce). The key is the hash the server stores, so **the tokens file is a credential**:
whoever reads it can act as any device in it (keep it mode 600, like a TLS key). Proofs are
compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import grpc

from splitfl.config.checks import is_loopback  # noqa: F401 (the net modules' import)
from splitfl.net.transport.connections import ConnectionTally, counted_tls_credentials


class AuthSetupError(ValueError):
    """A tokens, token or certificate file that cannot be used (one line, names the file)."""


def token_hash(token: str) -> str:
    return hashlib.sha256(token.strip().encode()).hexdigest()


def new_token() -> str:
    return secrets.token_hex(32)


def new_nonce() -> str:
    """A listener's challenge: 32 fresh random bytes, hex."""
    return secrets.token_hex(32)


def transcript(nonce: str, hello: dict) -> bytes:
    """What a proof signs: a label, the listener's nonce and the device's whole hello as
    canonical JSON (sorted keys, no spaces, ASCII) — its name, protocol, clients and peer
    listener cannot be changed without the token."""
    body = json.dumps(hello, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return b"splitfl-hello\x00" + nonce.encode() + b"\x00" + body.encode()


def proof(key_hash: str, nonce: str, hello: dict) -> str:
    """HMAC-SHA256 of :func:`transcript`, keyed by a token's SHA-256 (hex, as stored)."""
    key = bytes.fromhex(key_hash)
    return hmac.new(key, transcript(nonce, hello), hashlib.sha256).hexdigest()


def token_proof(token: str, nonce: str, hello: dict) -> str:
    """The device's answer to ``nonce`` (:func:`proof` keyed by its token's hash)."""
    return proof(token_hash(token), nonce, hello)


def parse_ids(text: str) -> frozenset[int]:
    """``0-4,7`` → {0, 1, 2, 3, 4, 7} (ValueError on anything else)."""
    ids: set[int] = set()
    for item in text.split(","):
        lo, dash, hi = item.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise ValueError(f"bad client ids {text!r} (expected e.g. 0-4,7)")
        if int(hi or lo) - int(lo) > 1_000_000:
            raise ValueError(f"client id range {item!r} too large")
        ids.update(range(int(lo), int(hi or lo) + 1))
    if not ids:
        raise ValueError(f"bad client ids {text!r} (expected e.g. 0-4,7)")
    return frozenset(ids)


def format_ids(ids) -> str:
    """{0, 1, 2, 7} → ``0-2,7`` (:func:`parse_ids`'s inverse)."""
    out, run = [], []
    for c in sorted(ids):
        if run and c != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(c)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


@dataclass
class TokenBook:
    """Device name → token hash, and the client ids a name is bound to (absent: unbound)."""

    hashes: dict[str, str] = field(default_factory=dict)
    bound: dict[str, frozenset[int]] = field(default_factory=dict)
    #: names whose clients are bound at their first assignment (``clients=auto``)
    auto: set[str] = field(default_factory=set)

    def may_host(self, name: str, client: int) -> bool:
        """Whether ``name`` may host ``client``: its own bound ids, or (unbound) any client
        not bound to another name."""
        if name in self.bound:
            return client in self.bound[name]
        return not any(client in ids for other, ids in self.bound.items() if other != name)

    def check(self, name: str, nonce: str, hello: dict, answer) -> bool:
        """Whether ``answer`` is ``name``'s :func:`proof` for ``nonce`` and ``hello``."""
        expected = self.hashes.get(name)
        if expected is None or not isinstance(answer, str):
            return False
        return hmac.compare_digest(proof(expected, nonce, hello), answer)

    def assigned(self, name: str, clients) -> None:
        """Bind ``clients`` to ``name`` if its token binds at first assignment (``auto``)."""
        if name in self.auto and name not in self.bound and clients:
            self.bound[name] = frozenset(clients)

    def add(self, name: str, token: str) -> None:
        self.hashes[name] = token_hash(token)

    @classmethod
    def read(cls, path: str | Path) -> TokenBook:
        """Parse a tokens file (``name:sha256-hex[:clients=IDS|auto]`` per line)."""
        path = Path(path)
        try:
            lines = path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as err:
            raise AuthSetupError(f"{path}: cannot read tokens file ({err})") from None
        book = cls()
        for number, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            name, _, rest = line.partition(":")
            digest, _, bind = rest.partition(":")
            ok = name and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
            if not ok or (bind and not bind.startswith("clients=")):
                raise AuthSetupError(
                    f"{path}:{number}: expected 'name:<sha256 hex>' or "
                    "'name:<sha256 hex>:clients=0-4,7' (or clients=auto)"
                )
            book.hashes[name] = digest
            if bind == "clients=auto":
                book.auto.add(name)
            elif bind:
                try:
                    book.bound[name] = parse_ids(bind.removeprefix("clients="))
                except ValueError as err:
                    raise AuthSetupError(f"{path}:{number}: {err}") from None
        if not book.hashes:
            raise AuthSetupError(f"{path}: no device tokens")
        return book


def read_token(path: str | Path) -> str:
    """A device's token file (the token on its first line)."""
    try:
        token = Path(path).read_text().strip().splitlines()[0].strip()
    except (OSError, UnicodeDecodeError, IndexError) as err:
        raise AuthSetupError(f"{path}: cannot read a token ({err})") from None
    if len(token) < 16:
        raise AuthSetupError(f"{path}: token too short (at least 16 characters)")
    return token


def _read_bytes(path: str | Path, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise AuthSetupError(f"{path}: cannot read {what} ({err.strerror})") from None


def server_credentials(
    cert: str | Path, key: str | Path, tally: ConnectionTally | None = None
) -> grpc.ServerCredentials:
    """TLS credentials of the server from PEM certificate (chain) and private key files,
    checked before gRPC sees them (it would only say ``Failed to bind``): the certificate
    file holds a CERTIFICATE, the key file a PRIVATE KEY, and the two belong together.
    ``tally``: told of every connection before its handshake
    (:func:`~splitfl.net.transport.connections.counted_tls_credentials`)."""
    cert_pem, key_pem = _read_bytes(cert, "TLS certificate"), _read_bytes(key, "TLS key")
    has_cert, has_key = b"CERTIFICATE-----" in cert_pem, b"PRIVATE KEY-----" in key_pem
    if not has_cert and not has_key and b"PRIVATE KEY-----" in cert_pem:
        raise AuthSetupError(
            f"--tls-cert {cert} holds a private key and --tls-key {key} does not: swapped?"
        )
    if not has_cert:
        raise AuthSetupError(f"--tls-cert {cert}: no PEM CERTIFICATE in it")
    if not has_key:
        raise AuthSetupError(f"--tls-key {key}: no PEM PRIVATE KEY in it")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as err:
        raise AuthSetupError(
            f"--tls-cert {cert} and --tls-key {key} do not make a TLS identity "
            f"({err.reason or err}): the key must be the certificate's, unencrypted"
        ) from None
    if tally is not None:
        return counted_tls_credentials(key_pem, cert_pem, tally)
    return grpc.ssl_server_credentials([(key_pem, cert_pem)])


def channel_credentials(ca_cert: str | Path | None) -> grpc.ChannelCredentials:
    """TLS credentials of a device: trust ``ca_cert`` (PEM) or the system's roots."""
    roots = None if ca_cert is None else _read_bytes(ca_cert, "CA certificate")
    if roots is not None and b"CERTIFICATE-----" not in roots:  # before gRPC dials with it
        held = "a private key" if b"PRIVATE KEY-----" in roots else "no PEM certificate"
        raise AuthSetupError(
            f"--ca-cert {ca_cert} holds {held}: give the server's certificate (the .pem "
            "`splitfl certs` wrote, or your CA's), never its key"
        )
    return grpc.ssl_channel_credentials(root_certificates=roots)

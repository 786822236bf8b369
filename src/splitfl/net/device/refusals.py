"""Why a device cannot talk to its server, in one line, where retrying cannot help: a server
certificate that fails verification, a name another live process holds (after a wait), one end
speaking TLS and the other plain text (:func:`~splitfl.net.device.session.run_device` exits 2
with the line instead of redialling until ``--retry-s``)."""

from __future__ import annotations

import socket
import ssl
import time

import grpc

from splitfl.net.device.agent import DeviceOptions
from splitfl.net.transport.handshake import CONNECTED_ALREADY


def certificate_refused(err: grpc.RpcError) -> str | None:
    """One line when the server's TLS certificate failed verification (expired, not yet
    valid, not signed by ``--ca-cert``, another host): retrying cannot help, so the device
    stops (exit 2) instead of redialling until ``--retry-s``."""
    details = str(err.details())
    if "CERTIFICATE_VERIFY_FAILED" not in details:
        return None
    why = details.partition("CERTIFICATE_VERIFY_FAILED")[2].strip(": ").split(":")[0]
    return (
        f"the server's TLS certificate was refused ({why or 'verify failed'}): renew it "
        "(splitfl certs) or give the device the right --ca-cert"
    )


class Duplicate:
    """How long the server has been refusing this device's name because another link of
    that name answers keepalives: retried for ``wait_s`` (the server replaces a link silent
    for two keepalive periods: this device's own half-open one), then given up (exit 2)."""

    def __init__(self, wait_s: float):
        self.wait_s, self.since = wait_s, None

    def gave_up(self, err: grpc.RpcError) -> bool:
        if err.code() != grpc.StatusCode.ALREADY_EXISTS or CONNECTED_ALREADY not in str(
            err.details()
        ):
            self.since = None
            return False
        self.since = self.since or time.monotonic()
        return time.monotonic() - self.since > self.wait_s


def tls_mismatch(opts: DeviceOptions, err: grpc.RpcError) -> str | None:
    """Why the device and the server cannot talk when one uses TLS and the other does not
    (the fix in one line), else None. A plain-text hello to a TLS server only sees "Socket
    closed": the server is asked whether it speaks TLS (:func:`speaks_tls`)."""
    if err.code() != grpc.StatusCode.UNAVAILABLE:
        return None
    if opts.credentials is None and speaks_tls(opts.server):
        return f"{opts.server} requires TLS: pass --ca-cert (the server's certificate)"
    if opts.credentials is not None and "WRONG_VERSION_NUMBER" in (err.details() or ""):
        return (
            f"{opts.server} speaks plain text, not TLS: drop --ca-cert, or start the server "
            "with --tls-cert and --tls-key"
        )
    return None


def speaks_tls(address: str, timeout_s: float = 3.0) -> bool:
    """Whether the server at ``address`` (HOST:PORT) completes a TLS handshake (its
    certificate unchecked: this only asks which protocol it speaks); False when it does not
    answer, or answers in plain text, within ``timeout_s``."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with (
            socket.create_connection((host, int(port)), timeout=timeout_s) as sock,
            context.wrap_socket(sock, server_hostname=host),
        ):
            return True
    except (OSError, ValueError):  # ssl.SSLError is an OSError
        return False

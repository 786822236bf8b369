"""A self-signed TLS certificate for a splitfl server (``splitfl certs``), for test beds and
labs; use your organisation's CA where there is one. Needs the ``cryptography`` package
(the ``net`` extra, :func:`~splitfl.core.extras.install_extra`)."""

from __future__ import annotations

import datetime
import importlib
import ipaddress
import os
from pathlib import Path

from splitfl.config import ConfigError
from splitfl.core.extras import install_extra


def _crypto():
    try:
        return (
            importlib.import_module("cryptography.x509"),
            importlib.import_module("cryptography.hazmat.primitives.hashes"),
            importlib.import_module("cryptography.hazmat.primitives.serialization"),
            importlib.import_module("cryptography.hazmat.primitives.asymmetric.ec"),
        )
    except ImportError:
        raise ConfigError(
            "certs",
            f"needs the cryptography package: {install_extra('net', 'cryptography>=41')}",
        ) from None


def self_signed_pem(hosts: list[str], days: int = 365) -> tuple[str, str]:
    """A P-256 certificate (PEM) valid for ``hosts`` plus ``localhost`` and ``127.0.0.1``, and
    its private key (PEM, unencrypted)."""
    x509, hashes, serialization, ec = _crypto()
    names = list(dict.fromkeys([*hosts, "localhost", "127.0.0.1"]))
    sans = []
    for host in names:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            sans.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, names[0])])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode(), pem.decode()


def write_self_signed(out: Path, hosts: list[str], days: int = 365) -> tuple[Path, Path]:
    """``out/server.pem`` and ``out/server.key`` (:func:`self_signed_pem`); the key file is
    private (mode 600)."""
    cert, key = self_signed_pem(hosts, days)
    out.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = out / "server.pem", out / "server.key"
    cert_path.write_text(cert)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(key)
    return cert_path, key_path

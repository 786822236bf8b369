"""``splitfl device``: run this machine as an edge device of a networked splitfl run.

Example (on the device; the server runs ``splitfl server CONFIG --listen 0.0.0.0:7070 ...``)::

    splitfl device --server 10.0.0.1:7070 --name jetson-3 --token-file jetson-3.token \\
        --ca-cert ca.pem --data ./my-data \\
        --peer-listen 0.0.0.0:7071 --peer-address 10.0.0.13:7071

The device also listens for its peers (RingSFL's ring neighbours, ParallelSFL's top worker or
bottom workers): with TLS to the server it presents a fresh self-signed certificate, which the
server relays to the peers that dial it; each link uses a one-round token from the server.

Only this module, the config, data and model code and the executor roles are imported: the
device needs torch, numpy, PyYAML and grpcio, not matplotlib, scipy, scikit-learn or Ray.
Exit codes: 0 after the server said bye, 1 when the server stayed unreachable (or kept refusing for
a transient reason: clients still held, server full, throttled) for ``--retry-s`` seconds before the
device joined a run, or ``--resume-wait-s`` seconds (default 6 h) after it did (its run may resume),
2 when refused for good (token, protocol version, clients not bound to the token, its name held by
another live process, its link replaced by another connection, a server certificate that fails
verification — expired, or not signed by ``--ca-cert``), when only one of it and the server speaks
TLS, given bad flags (``--server`` without a port), lacking the package its data format needs
(Pillow for image folders, ``datasets`` for hf/parquet: the line names the extra), or lacking a
module the run imports (the welcome's config names them in ``imports`` and in
``model:``/``data.dataset:`` import paths; install them, or put them on ``PYTHONPATH``, in the
current directory, or name them with ``--import``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from splitfl.data.local import FORMATS
from splitfl.extensions import add_import_flag, import_user_modules
from splitfl.net.device.agent import DeviceOptions
from splitfl.net.device.session import run_device
from splitfl.net.transport.auth import AuthSetupError, channel_credentials, read_token


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="splitfl device", description=__doc__.split("\n")[0])
    p.add_argument("--server", required=True, help="HOST:PORT of the splitfl server")
    p.add_argument("--name", required=True, help="this device's name (as in the tokens file)")
    p.add_argument("--token-file", required=True, help="file holding this device's token")
    p.add_argument("--ca-cert", help="PEM certificate to trust (TLS); without it: plain text")
    p.add_argument(
        "--data-root",
        help="dataset folder when the server partitions one dataset (default: its data.root)",
    )
    p.add_argument(
        "--data",
        metavar="PATH",
        help="this device's own training data (servers with data.source: devices): one "
        "client's data, or PATH/clients/<id>... for several (see --format)",
    )
    p.add_argument(
        "--format",
        default="npz",
        choices=FORMATS,
        help="the container of --data (as data.format; npz also: a folder of <client id>.npz "
        "or one .npz with x, y and optionally client)",
    )
    p.add_argument(
        "--histogram-epsilon",
        type=float,
        metavar="EPS",
        help="add Laplace noise (scale 1/EPS: EPS-DP) to the announced label histograms",
    )
    p.add_argument("--noise-seed", type=int, help="seed of that noise (default: fresh OS entropy)")
    p.add_argument(
        "--client-id",
        default="",
        help="client ids to host, comma-separated (default: the server assigns)",
    )
    p.add_argument(
        "--retry-s",
        type=float,
        default=300.0,
        help="before joining a run: give up after this long without the server",
    )
    p.add_argument(
        "--resume-wait-s",
        type=float,
        default=6 * 3600.0,
        help="after joining a run: keep redialling a lost server this long, so a run that "
        "resumes (splitfl server --resume) finds its devices (default 6 h)",
    )
    p.add_argument("--max-message-mb", type=float, default=256.0, help="largest message accepted")
    p.add_argument("--compression", choices=("none", "gzip"), default="none")
    p.add_argument(
        "--keepalive-s",
        type=float,
        default=10.0,
        help="keepalive ping interval: a silent link is dropped (and redialled) after about "
        "twice this (0 = off)",
    )
    p.add_argument(
        "--peer-listen",
        default="127.0.0.1:0",
        help="HOST:PORT where peers reach this device (RingSFL, ParallelSFL; port 0 = any); "
        "'none' = no device-to-device links",
    )
    p.add_argument(
        "--peer-address", help="HOST:PORT peers dial (needed when --peer-listen is 0.0.0.0)"
    )
    add_import_flag(p)
    return p


def options_from(args: argparse.Namespace) -> DeviceOptions:
    """Flags → :class:`DeviceOptions` (AuthSetupError/ValueError name the bad flag or file)."""
    try:
        clients = tuple(int(c) for c in args.client_id.split(",") if c.strip())
    except ValueError:
        raise ValueError(
            f"--client-id: expected comma-separated integers, got {args.client_id!r}"
        ) from None
    for flag in ("retry_s", "resume_wait_s"):
        if not getattr(args, flag) >= 0:
            name = "--" + flag.replace("_", "-")
            raise ValueError(f"{name}: must be >= 0 (got {getattr(args, flag)})")
    if not args.keepalive_s >= 0:
        raise ValueError(f"--keepalive-s: must be >= 0 (got {args.keepalive_s})")
    return DeviceOptions(
        server=server_address(args.server),
        name=args.name,
        token=read_token(args.token_file),
        clients=clients,
        data_root=args.data_root,
        credentials=channel_credentials(args.ca_cert) if args.ca_cert else None,
        max_message_bytes=int(args.max_message_mb * 2**20),
        retry_s=args.retry_s,
        resume_wait_s=args.resume_wait_s,
        compression=args.compression,
        peer_listen=None if args.peer_listen == "none" else args.peer_listen,
        peer_address=args.peer_address,
        data=args.data,
        data_format=args.format,
        histogram_epsilon=_epsilon(args.histogram_epsilon),
        noise_seed=args.noise_seed,
        keepalive_s=args.keepalive_s,
    )


def server_address(value: str) -> str:
    """``--server``: HOST:PORT (``[v6]:PORT``); without a port gRPC would dial 443 silently,
    so a missing or bad port is a ValueError showing the fix."""
    host, sep, port = value.rpartition(":")
    if not sep or (":" in host and not host.endswith("]")):  # no port (a bare IPv6 address)
        host, port = value, ""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ValueError(
            f"--server: expected HOST:PORT, the port of the server's --listen (e.g. "
            f"{host or 'HOST'}:7070), got {value!r}"
        )
    return value


def _epsilon(value: float | None) -> float | None:
    if value is not None and not 1e-6 <= value <= 1e6:
        raise ValueError(f"--histogram-epsilon: must be in [1e-6, 1e6] (got {value})")
    return value


def run_from_args(args: argparse.Namespace) -> int:
    try:
        opts = options_from(args)
        import_user_modules(args.imports, [Path.cwd()], field="--import")
    except (AuthSetupError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return run_device(opts, log=lambda line: print(line, file=sys.stderr, flush=True))


def main(argv: list[str] | None = None) -> int:
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""``splitfl server``, ``launch``, ``device``, ``token`` and ``certs``: networked runs.

``server`` and ``launch`` are ``splitfl run`` with ``executor: networked``: ``server`` waits
for device processes started elsewhere (``network.devices = 0``), ``launch`` starts
``--devices`` device processes on this machine over loopback. ``device`` is the edge-device
process (:mod:`splitfl.net.device.cli`). ``token`` makes a device token and adds its hash to
the server's tokens file; ``certs`` makes a self-signed TLS certificate (needs the
``cryptography`` package).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from splitfl.config import ConfigError
from splitfl.config.parse import apply_overrides, read_yaml_mapping
from splitfl.data.clients import write_partition
from splitfl.experiment import resume, run
from splitfl.experiment.runner import as_config
from splitfl.extensions import add_import_flag
from splitfl.metrics.summary import comparison_table
from splitfl.net.device import cli as device_cli
from splitfl.net.transport.auth import format_ids, new_token, parse_ids, token_hash
from splitfl.net.transport.certs import write_self_signed


def _split(values: list[str]) -> tuple[str | None, list[str]]:
    config = next((v for v in values if "=" not in v), None)
    return config, [v for v in values if v != config]


#: ``splitfl server``'s address when neither ``--listen`` nor the config (file or overrides)
#: names one: the config's own default, port 0, is a port no device could be told.
SERVER_LISTEN = "127.0.0.1:7070"


def _network_overrides(args: argparse.Namespace) -> list[str]:
    """The server flags as config overrides. ``--listen`` only when given: a config's
    ``network.listen`` (and a resumed run's recorded address) stands otherwise."""
    out = ["network.devices=0"]
    if args.listen is not None:
        out.append(f"network.listen={args.listen}")
    for flag, key in (
        ("tls_cert", "tls_cert"),
        ("tls_key", "tls_key"),
        ("tokens", "tokens"),
        ("min_devices", "min_devices"),
        ("wait_devices_s", "connect_timeout_s"),
        ("ca_cert", "ca_cert"),
    ):
        value = getattr(args, flag, None)
        if value is not None:
            out.append(f"network.{key}={value}")
    if args.insecure:
        out.append("network.insecure=true")
    return out


def _named_listen(config: str, overrides: list[str]) -> str | None:
    """The ``network.listen`` the config file and its overrides name, or None."""
    data = apply_overrides(read_yaml_mapping(config), overrides)
    network = data.get("network")
    return network.get("listen") if isinstance(network, dict) else None


def _report(result) -> int:
    print(comparison_table({result.config.algorithm: result.summary}))
    print(f"run directory: {result.run_dir}")
    return 0


def cmd_server(args: argparse.Namespace) -> int:
    net = _network_overrides(args)
    progress = False if args.no_progress else None
    if args.resume:
        if args.args:
            raise ConfigError("--resume", "takes only the run directory and network flags")
        return _report(resume(args.resume, progress=progress, overrides=net, imports=args.imports))
    config, overrides = _split(args.args)
    if config is None:
        raise ConfigError("CONFIG", "give a config file (e.g. configs/quickstart.yaml)")
    run_dir = Path(args.out) if args.out else None
    overrides = [*overrides, "executor=networked", *net]
    if args.listen is None and _named_listen(config, overrides) is None:
        overrides.append(f"network.listen={SERVER_LISTEN}")
    return _report(run(config, overrides, run_dir=run_dir, progress=progress, imports=args.imports))


def cmd_launch(args: argparse.Namespace) -> int:
    config, overrides = _split(args.args)
    if config is None:
        raise ConfigError("CONFIG", "give a config file (e.g. configs/quickstart.yaml)")
    if args.devices < 1:
        raise ConfigError("--devices", f"must be >= 1 (got {args.devices})")
    overrides = [*overrides, "executor=networked", f"network.devices={args.devices}"]
    if args.data_dir:  # each device process trains on its own files
        overrides += ["data.source=devices", f"network.data_dir={args.data_dir}"]
        if args.write_partition:
            cfg = as_config(config, overrides)
            written = write_partition(cfg, Path(args.data_dir), args.devices)
            print(f"wrote the seeded partition to {args.data_dir}: {written}")
    elif args.write_partition:
        raise ConfigError("--write-partition", "needs --data-dir")
    run_dir = Path(args.out) if args.out else None
    progress = False if args.no_progress else None
    return _report(run(config, overrides, run_dir=run_dir, progress=progress, imports=args.imports))


def cmd_token(args: argparse.Namespace) -> int:
    """A new token for device ``name``: the token into ``--out`` (mode 600), its hash
    appended to the server's ``--tokens`` file, binding clients: ``--clients 0-4,7`` those
    ids (``name:hash:clients=0-4,7``: only this token may host them), by default the clients
    the device is first given (``clients=auto``: no other device takes them while it is
    away), with ``--any-client`` none (any client no other token is bound to)."""
    if not args.name or any(c in args.name for c in ":\n#") or args.name != args.name.strip():
        raise ConfigError("NAME", "a device name without ':', '#', newlines or edge spaces")
    bind = "" if args.any_client else ":clients=auto"
    if args.clients is not None:
        if args.any_client:
            raise ConfigError("--any-client", "give either --clients or --any-client")
        try:
            bind = f":clients={format_ids(parse_ids(args.clients))}"
        except ValueError as err:
            raise ConfigError("--clients", str(err)) from None
    token = new_token()
    out = Path(args.out or f"{args.name}.token")
    if out.exists():
        raise ConfigError("--out", f"{out} exists; not overwriting a device's token")
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    # a credential (README: whoever reads it connects as any device): created mode 600
    fd = os.open(args.tokens, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    with os.fdopen(fd, "a") as f:
        f.write(f"{args.name}:{token_hash(token)}{bind}\n")
    print(f"token for {args.name}: {out} (copy it to the device); hash added to {args.tokens}")
    return 0


def cmd_certs(args: argparse.Namespace) -> int:
    cert, key = write_self_signed(Path(args.out), args.host, args.days)
    print(f"certificate: {cert} (give it to the devices as --ca-cert)\nprivate key: {key}")
    return 0


def add_network_parsers(sub) -> None:
    p = sub.add_parser("server", help="run as the server of a networked run (devices connect)")
    p.add_argument("args", nargs="*", metavar="CONFIG [key=value ...]")
    p.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"default: the config's network.listen, else {SERVER_LISTEN}; "
        "on --resume the run's own address",
    )
    p.add_argument("--tls-cert", metavar="PEM")
    p.add_argument("--tls-key", metavar="PEM")
    p.add_argument("--tokens", metavar="FILE", help="device tokens file (splitfl token)")
    p.add_argument("--min-devices", type=int, metavar="N", help="start once N devices are ready")
    p.add_argument(
        "--wait-devices-s",
        type=float,
        metavar="S",
        help="stop if fewer than --min-devices devices are ready (or clients' data announced) "
        "after S seconds (network.connect_timeout_s, default 120; 0 = wait for ever)",
    )
    p.add_argument("--insecure", action="store_true", help="allow plain text off loopback")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped networked run")
    p.add_argument("--out", metavar="RUN_DIR")
    p.add_argument("--no-progress", action="store_true")
    add_import_flag(p)
    p.set_defaults(fn=cmd_server)
    p = sub.add_parser("launch", help="one server and N device processes on this machine")
    p.add_argument("args", nargs="+", metavar="CONFIG [key=value ...]")
    p.add_argument("--devices", type=int, default=2, metavar="N")
    p.add_argument(
        "--data-dir",
        metavar="DIR",
        help="devices train on their own files: device local-<i> reads DIR/local-<i>/",
    )
    p.add_argument(
        "--write-partition",
        action="store_true",
        help="first write the config's seeded partition into --data-dir (one folder per device)",
    )
    p.add_argument("--out", metavar="RUN_DIR")
    p.add_argument("--no-progress", action="store_true")
    add_import_flag(p)
    p.set_defaults(fn=cmd_launch)
    p = sub.add_parser("device", help="run this machine as an edge device of a server")
    device_cli.build_parser(p)
    p.set_defaults(fn=device_cli.run_from_args)
    p = sub.add_parser("token", help="make a device token; add its hash to the tokens file")
    p.add_argument("name", metavar="NAME")
    p.add_argument("--tokens", required=True, metavar="FILE", help="the server's tokens file")
    p.add_argument("--out", metavar="FILE", help="the device's token file (default NAME.token)")
    p.add_argument(
        "--clients",
        metavar="IDS",
        help="bind these client ids to the token (e.g. 0-4,7); default: the clients the "
        "device is first given",
    )
    p.add_argument(
        "--any-client",
        action="store_true",
        help="bind no clients: the device may host any client no other token holds (a "
        "stand-by device; it may also take a departed device's unbound clients)",
    )
    p.set_defaults(fn=cmd_token)
    p = sub.add_parser("certs", help="make a self-signed TLS certificate for the server")
    p.add_argument("--out", required=True, metavar="DIR")
    p.add_argument("--host", action="append", default=[], help="DNS name or IP (repeatable)")
    p.add_argument("--days", type=int, default=365)
    p.set_defaults(fn=cmd_certs)

"""Clock validation with real Linux traffic shaping instead of in-process link emulation.

Every device process runs in its own network namespace, joined to the server's namespace by
a veth pair on a bridge (10.77.0.0/16, addresses this script creates and removes). A token
bucket (``tc qdisc … tbf``) on each end shapes the device's links to its client's
``devices.preset`` profile: device egress = uplink (to the server and to its peers), bridge
egress towards the device = downlink, so a device-to-device transfer runs at the slower of the
two radios — the cost model's ``d2d_rate``. Compute is still stretched in the processes
(``network.emulate: true``, ``network.emulate_links: false``). The server listens with TLS
(the addresses are not loopback) and the devices' peer listeners use the relayed
self-signed certificates.

Needs root, ``ip`` and ``tc`` with the ``tbf`` qdisc (``netem`` delay is not used: it is not
available on every kernel). One client per device process (shaping is per namespace).

    sudo python benchmarks/tc_shaping.py --algorithm ringsfl --rounds 3 \\
        --out benchmarks/results/tc-shaping-ringsfl.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from splitfl.experiment.runner import as_config, prepare
from splitfl.net.transport.auth import new_token, token_hash
from splitfl.net.transport.certs import write_self_signed
from splitfl.testing import config_for

sys.path.insert(0, str(Path(__file__).parent))
from clock_validation import round_summary  # noqa: E402 (the sibling script)

BRIDGE, SERVER_IP, PREFIX = "sflbr0", "10.77.0.1", 16


def sh(*args: str, ns: str | None = None) -> None:
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    subprocess.run(cmd, check=True, capture_output=True)


def tbf(dev: str, rate_bytes: float, ns: str | None = None) -> None:
    """Shape ``dev``'s egress to ``rate_bytes`` B/s (segments kept at MTU size so the bucket
    sees packets, not 64 KB offload bursts)."""
    sh("ip", "link", "set", "dev", dev, "gso_max_size", "1500", ns=ns)
    bits = int(rate_bytes * 8)
    burst = max(int(rate_bytes / 100), 3000)  # 10 ms of the rate, at least two packets
    sh(
        "tc",
        "qdisc",
        "add",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        f"{bits}bit",
        "burst",
        str(burst),
        "limit",
        str(64 << 20),
        ns=ns,
    )


def setup(n: int, rates: list[tuple[float, float]]) -> None:
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{SERVER_IP}/{PREFIX}", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for k in range(n):
        ns, host, dev = f"sfl-d{k}", f"sflh{k}", f"sfld{k}"
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", host, "type", "veth", "peer", "name", dev)
        sh("ip", "link", "set", dev, "netns", ns)
        sh("ip", "link", "set", host, "master", BRIDGE)
        sh("ip", "link", "set", host, "up")
        sh("ip", "addr", "add", f"{device_ip(k)}/{PREFIX}", "dev", dev, ns=ns)
        sh("ip", "link", "set", dev, "up", ns=ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)
        up, down = rates[k]
        tbf(dev, up, ns=ns)  # device → anyone: its uplink radio
        tbf(host, down)  # anyone → device: its downlink


def teardown(n: int) -> None:
    for k in range(n):
        subprocess.run(["ip", "netns", "del", f"sfl-d{k}"], capture_output=True)
        subprocess.run(["ip", "link", "del", f"sflh{k}"], capture_output=True)
    subprocess.run(["ip", "link", "del", BRIDGE], capture_output=True)


def device_ip(k: int) -> str:
    return f"10.77.0.{10 + k}"


def run(args: argparse.Namespace, folder: Path) -> dict:
    changes = {
        "rounds": args.rounds,
        "data.num_clients": args.clients,
        "train.clients_per_round": args.clients,
        "devices.preset": args.preset,
        "devices.contention": False,
        "devices.jitter": 0.0,
        "network.emulate": True,
        "network.emulate_links": False,
        "network.timeout_s": 60.0,
        "output.progress": False,
    }
    cfg = config_for(args.algorithm, **changes)
    ctx = prepare(as_config(cfg)).ctx
    rates = [
        (ctx.population.at(k, 0).uplink, ctx.population.at(k, 0).downlink)
        for k in range(args.clients)
    ]
    cert, key = write_self_signed(folder / "certs", [SERVER_IP])
    tokens = {f"d{k}": new_token() for k in range(args.clients)}
    (folder / "tokens.txt").write_text(
        "".join(f"{name}:{token_hash(t)}\n" for name, t in tokens.items())
    )
    (folder / "config.yaml").write_text(yaml.safe_dump(cfg))
    setup(args.clients, rates)
    procs = []
    try:
        listen = f"{SERVER_IP}:{args.port}"
        server = [
            sys.executable,
            "-m",
            "splitfl",
            "server",
            str(folder / "config.yaml"),
            "--listen",
            listen,
            "--tls-cert",
            str(cert),
            "--tls-key",
            str(key),
            "--tokens",
            str(folder / "tokens.txt"),
            "--min-devices",
            str(args.clients),
            "--out",
            str(folder / "run"),
            "--no-progress",
        ]
        procs.append(subprocess.Popen(server, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
        time.sleep(2.0)
        for k, (name, token) in enumerate(tokens.items()):
            token_file = folder / f"{name}.token"
            token_file.write_text(token)
            os.chmod(token_file, 0o600)
            device = [
                "ip",
                "netns",
                "exec",
                f"sfl-d{k}",
                sys.executable,
                "-m",
                "splitfl.net.device.cli",
                "--server",
                listen,
                "--name",
                name,
                "--token-file",
                str(token_file),
                "--ca-cert",
                str(cert),
                "--client-id",
                str(k),
                "--peer-listen",
                f"{device_ip(k)}:0",
                "--retry-s",
                "60",
            ]
            log = open(folder / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
            procs.append(subprocess.Popen(device, stdout=log, stderr=subprocess.STDOUT))
        out, _ = procs[0].communicate(timeout=args.timeout)
        if procs[0].returncode != 0:
            raise RuntimeError(out.decode()[-3000:])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(10)
        teardown(args.clients)
    return summarise(args, folder / "run")


def summarise(args: argparse.Namespace, run_dir: Path) -> dict:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x]
    per_round = [round_summary(row) for row in rows]
    return {
        "algorithm": args.algorithm,
        "preset": args.preset,
        "clients": args.clients,
        "shaping": "tc tbf per namespace",
        "rounds": per_round,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algorithm", default="ringsfl")
    p.add_argument("--preset", default="s2fl_table1")
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--port", type=int, default=7471)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (network namespaces and tc)")
    with tempfile.TemporaryDirectory() as tmp:
        result = run(args, Path(tmp))
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()

"""Valid logins admitted during a flood of hellos that never prove (issue 51 item 6c).

The issue's re-run: a token-less attacker on **one** HTTP/2 connection opening ≈136 streams/s,
each a hello that never answers its challenge, kept the hub's 16 pending slots full, and 6 of
8 valid logins made during the flood were cancelled before their proof. This bench makes
that flood against a real hub on loopback (``splitfl.net.transport.hub.Hub``, gRPC, no TLS:
the flood is streams on one connection, which TLS does not change once its one handshake is
done) and counts the logins, each from a connection of its own, that were welcomed.

    python benchmarks/bench_gate_flood.py                        # this tree
    python benchmarks/bench_gate_flood.py --src /tmp/old/src     # another tree (interleaved)

The flood's streams claim a name in the token book (``victim``, a device that never logs in):
a hello from a name not in the book is refused at once and holds no slot. Raw streams come
from ``tests/net_raw.py`` (written against the wire alone, so it drives older trees too).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = HERE.parent / "tests"


def _flood(port: int, rate: float, stop: threading.Event, counts: dict) -> None:
    """Open ``rate`` streams a second on one channel (one HTTP/2 connection), each a hello
    for ``victim`` that never proves; keep them open until the hub ends them."""

    # a connection of its own: grpc shares one among a process's channels with equal
    # arguments, and the logins' channels would otherwise ride the flood's connection
    channel = _own_connection(port)
    streams: list = []
    start = time.monotonic()
    while not stop.is_set():
        s = _stream_on(channel)
        s.hello("victim", "0" * 64, [99], answer=False)
        streams.append(s)
        counts["opened"] += 1
        time.sleep(max(0.0, start + counts["opened"] / rate - time.monotonic()))
    for s in streams:
        s.out.put(None)
        s.call.cancel()
    channel.close()


def _own_connection(port: int):
    """A channel on a connection of its own: grpc shares one among a process's channels with
    equal arguments, and every stream of this bench would otherwise ride one connection (the
    gate tells callers apart by connection)."""
    import grpc

    return grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)]
    )


def _stream_on(channel):
    """A :class:`net_raw.RawStream` on ``channel`` (its constructor opens a channel of its own,
    on the process's shared connection)."""
    from net_raw import RawStream
    from splitfl.net.transport.hub import METHOD

    s = RawStream.__new__(RawStream)
    s.channel, s.out, s.got, s.nonces = channel, queue.Queue(), queue.Queue(), []
    s.call = channel.stream_stream(METHOD)(iter(s.out.get, None))
    s.reader, s.token, s.fields, s.answer, s.details = None, "", {}, True, ""
    return s


def measure(rate: float, logins: int, every_s: float, max_pending: int) -> dict:
    """One sitting: a hub, the flood, then ``logins`` valid logins ``every_s`` apart."""
    from splitfl.experiment.runner import as_config
    from splitfl.net.server.testbed import Testbed
    from splitfl.net.transport.auth import TokenBook
    from splitfl.net.transport.guard import Audit
    from splitfl.net.transport.hub import Hub, HubSettings
    from splitfl.testing import config_for

    names = [f"d{i}" for i in range(logins)]
    with tempfile.TemporaryDirectory() as tmp:
        bed = Testbed.create(Path(tmp) / "bed", [*names, "victim"])
        config = as_config(
            config_for(
                "splitfed_v1",
                **{"data.num_clients": logins, "train.clients_per_round": logins},
            )
        )
        settings = HubSettings(4 << 20, 1 << 16, max_pending=max_pending)
        audit_lines: list[str] = []
        hub = Hub(
            settings,
            TokenBook.read(bed.tokens_file),
            logins + 100,
            {"config": config.to_dict(), "block": 1},
            Audit(sink=audit_lines.append),
        )
        hub.start(f"127.0.0.1:{bed.port}", None)
        stop, counts = threading.Event(), {"opened": 0}
        flooder = threading.Thread(target=_flood, args=(bed.port, rate, stop, counts))
        flooder.start()
        outcomes = []
        try:
            time.sleep(1.0)  # the slots full before the first login
            began = time.monotonic()
            tries = []
            for i, name in enumerate(names):
                login = _stream_on(_own_connection(bed.port))  # a device of its own
                tries.append(login.hello(name, bed.tokens[name], [i]))
                time.sleep(every_s)
            outcomes = [str(t.outcome(10.0)) for t in tries]
            flood_s = time.monotonic() - began + 1.0
            for t in tries:
                t.close()
        finally:
            stop.set()
            flooder.join(30)
            hub.stop()
    return {
        "rate_asked": rate,
        "rate_opened": round(counts["opened"] / flood_s, 1),
        "streams_opened": counts["opened"],
        "logins": logins,
        "welcomed": outcomes.count("welcome"),
        "outcomes": outcomes,
        "throttle_lines": sum("throttl" in line for line in audit_lines),
        "audit_lines": len(audit_lines),
    }


def _one(args: argparse.Namespace) -> int:
    sys.path[:0] = [str(TESTS)]
    row = measure(args.rate, args.logins, args.every_s, args.max_pending)
    print(json.dumps(row))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=136.0, help="flood streams a second")
    parser.add_argument("--logins", type=int, default=8)
    parser.add_argument("--every-s", type=float, default=0.5, help="between valid logins")
    parser.add_argument("--max-pending", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--src", nargs="+", default=[str(HERE.parent / "src")])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        return _one(args)
    rows = []
    for repeat in range(args.repeats):
        for src in args.src:  # interleaved: A B A B
            env = {**os.environ, "PYTHONPATH": f"{src}{os.pathsep}{TESTS}"}
            flags = ["--rate", str(args.rate), "--logins", str(args.logins)]
            flags += ["--every-s", str(args.every_s), "--max-pending", str(args.max_pending)]
            done = subprocess.run(
                [sys.executable, __file__, "--one", *flags],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            if done.returncode:
                print(done.stderr[-2000:], file=sys.stderr)
                return 1
            row = {"src": src, "repeat": repeat, **json.loads(done.stdout.splitlines()[-1])}
            print(json.dumps(row))
            rows.append(row)
    if args.out:
        report = {"date": str(datetime.date.today()), "rows": rows}
        args.out.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Networked execution on this machine (loopback): transport overhead, round time, memory.

1. **Per-batch overhead**: the time of one split-learning exchange (server asks → device
   sends smashed data + labels → server sends the gradient) over three transports, each with
   the device in a separate process: *bare* — a bare gRPC byte stream re-sending pre-built
   payloads of the same sizes; *framed* — the same stream carrying splitfl's message format
   (strict-JSON header, tensors encoded per message, decoded in place or to 64-byte
   alignment) and its checks of the smashed data and the gradient, but none of its runtime;
   *splitfl* — the hub, a device process (``run_device``) and ``RemoteFleet``. Compute is
   excluded (the devices answer with fixed tensors). framed ÷ bare is the cost of the format
   and checks; splitfl ÷ framed that of the runtime (routing, inboxes, bookkeeping).
2. **Round time and memory** with 10 and 50 device processes (``splitfl launch``): the
   measured round time of SplitFed V1 on digits and each device process's resident memory.

    python benchmarks/bench_network.py --devices 10 50 --out benchmarks/results/net.json
    python benchmarks/bench_network.py --per-batch-only --shapes 16x1024 64x4096 --repeats 5
"""

from __future__ import annotations

import argparse
import json
import math
import os
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path

import grpc
import torch
import yaml

from splitfl.config.schema import NetworkConfig
from splitfl.core.plan import ClientTask
from splitfl.experiment.runner import as_config
from splitfl.net.server.remote_fleet import Expect, Meter, RemoteFleet
from splitfl.net.server.testbed import Testbed
from splitfl.net.transport.auth import TokenBook
from splitfl.net.transport.hub import Hub, HubSettings
from splitfl.net.transport.wire import Message, decode, encode
from splitfl.net.trust.checks import smashed_problem
from splitfl.testing import config_for

BARE = "/bench.Bare/Echo"

# -- bare gRPC: the same exchange pattern as a raw byte stream ----------------------------

_BARE_DEVICE = """
import sys, grpc
try:  # the allocator settings splitfl's processes use, for every transport alike
    from splitfl.core.allocator import keep_freed_memory
    keep_freed_memory()
except ImportError:  # a splitfl from before splitfl.core.allocator
    pass
up = b"u" * int(sys.argv[2])
if len(sys.argv) > 3:  # a variant's handle() (_VARIANT_DEVICES)
    exec(sys.argv[3])
channel = grpc.insecure_channel(sys.argv[1], options=[
    ("grpc.max_receive_message_length", 1 << 26), ("grpc.max_send_message_length", 1 << 26)])
import queue
out = queue.SimpleQueue()
def gen():
    while True:
        item = out.get()
        if item is None:
            return
        yield item
out.put(b"hello")
for msg in channel.stream_stream("/bench.Bare/Echo")(gen()):
    if msg == b"stop":
        out.put(None)
        break
    if msg[:2] == b"go":
        out.put(up)     # smashed data + labels
    elif len(sys.argv) > 3:
        answer = handle(msg)  # a variant: decode (and check); the command's answer
        if answer is not None:
            out.put(answer)
    # gradient messages need no answer
"""

#: What the device does in each variant of the bare stream (run in the device process).
#: *tensors*: the least any framework does — the smashed data and labels turned into bytes
#: from tensors each time (one copy), the gradient read back with ``torch.frombuffer``
#: (copied where not 64-byte aligned, as splitfl does); no header, no checks.
#: *framed*: splitfl's message format — the command and the gradient decoded (strict-JSON
#: header, tensors read in place or copied to 64-byte alignment), the gradient checked finite,
#: the smashed data and labels encoded as a message from tensors each time — and none of the
#: runtime (no agent, routing, workers).
_VARIANT_DEVICES = {
    "tensors": """
import torch, warnings
warnings.filterwarnings("ignore", message="The given buffer is not writable")  # as splitfl's
torch.set_num_threads(1)  # as a splitfl device's (``threads: 1``)
rows, width = int(sys.argv[4]), int(sys.argv[5])
FX, Y = torch.ones(rows, width), torch.zeros(rows, dtype=torch.long)
def handle(data):
    if data[:1] == b"F":
        return b"".join([memoryview(FX.numpy()).cast("B"), memoryview(Y.numpy()).cast("B")])
    grad = torch.frombuffer(data, dtype=torch.float32)
    if grad.data_ptr() % 64:
        grad = grad.clone()
    return None
""",
    "framed": """
import torch
from splitfl.core.framing import Message, decode, encode
from splitfl.net.transport.wire import all_finite
torch.set_num_threads(1)  # as a splitfl device's (``threads: 1``)
rows, width = int(sys.argv[4]), int(sys.argv[5])
FX, Y = torch.ones(rows, width), torch.zeros(rows, dtype=torch.long)
def handle(data):
    msg = decode(memoryview(data))
    if msg.type == "forward":
        reply = Message("forwarded", {"step": msg.fields["step"], "client": 0}, {"fx": FX, "y": Y})
        return b"".join(encode(reply).parts)
    assert all_finite(msg.tensors["grad"])
    return None
""",
}


def bare_round_trip(iters: int, up: int, down: int, variant: str = "bare", shape=(0, 0)):
    """Per-exchange seconds: server sends "go", device answers ``up`` bytes, server sends
    ``down`` bytes (the gradient), over a raw gRPC bidirectional stream. ``variant``
    "tensors" or "framed" (``shape`` = smashed data rows, width): the same stream doing the
    work of :data:`_VARIANT_DEVICES` on both ends (the server's side: :func:`_exchange`)."""
    times: list[float] = []
    inbox: queue.SimpleQueue = queue.SimpleQueue()
    outbox: queue.SimpleQueue = queue.SimpleQueue()

    def handler(requests, context):
        def read():
            try:
                for msg in requests:
                    inbox.put(msg)
            except grpc.RpcError:
                pass  # the stream ends when the run is over

        threading.Thread(target=read, daemon=True).start()
        while True:
            item = outbox.get()
            if item is None:
                return
            yield item

    options = [
        ("grpc.max_receive_message_length", 1 << 26),
        ("grpc.max_send_message_length", 1 << 26),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(4), options=options)
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "bench.Bare", {"Echo": grpc.stream_stream_rpc_method_handler(handler)}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    args = [sys.executable, "-c", _BARE_DEVICE, f"127.0.0.1:{port}", str(up)]
    if variant != "bare":
        args += [_VARIANT_DEVICES[variant], *map(str, shape)]
    device = subprocess.Popen(args)
    exchange = _exchange(variant, inbox, outbox, down, *shape)
    try:
        inbox.get(timeout=60)  # hello
        for step in range(iters):
            t0 = time.perf_counter()
            exchange(step)
            times.append(time.perf_counter() - t0)
        outbox.put(b"stop")
        outbox.put(None)
        device.wait(30)
    finally:
        device.kill()
        server.stop(0)
    return times


def _exchange(variant: str, inbox, outbox, down: int, rows: int, width: int):
    """The server's side of one exchange of ``variant`` (see :data:`_VARIANT_DEVICES`)."""
    grad_bytes, grad = b"g" * down, torch.ones(rows, width)
    expect = (torch.float32, (width,), rows, 10, math.inf)

    def bare(step: int) -> None:
        outbox.put(b"go")
        inbox.get(timeout=60)
        outbox.put(grad_bytes)

    def tensors(step: int) -> None:
        outbox.put(b"F" + step.to_bytes(4, "little"))
        data = inbox.get(timeout=60)
        fx = torch.frombuffer(data, dtype=torch.float32, count=rows * width)
        fx = (fx.clone() if fx.data_ptr() % 64 else fx).view(rows, width)
        torch.frombuffer(data, dtype=torch.int64, count=rows, offset=rows * width * 4)
        outbox.put(b"".join([memoryview(grad.numpy()).cast("B")]))

    def framed(step: int) -> None:
        ask = Message("forward", {"step": step, "client": 0, "seq": step})
        outbox.put(b"".join(encode(ask).parts))
        msg = decode(memoryview(inbox.get(timeout=60)))
        assert smashed_problem(msg.tensors["fx"], msg.tensors["y"], *expect) is None
        answer = Message("backward", {"client": 0, "seq": step}, {"grad": grad})
        outbox.put(b"".join(encode(answer).parts))

    return {"bare": bare, "tensors": tensors, "framed": framed}[variant]


# -- splitfl: the same exchange through the hub and a device process ----------------------


#: The device process: a DeviceAgent answering forward with fixed tensors (no compute).
_SPLITFL_DEVICE = """
import sys, torch
from splitfl.net.device.agent import DeviceAgent, DeviceOptions
from splitfl.net.device.session import run_device
from splitfl.net.transport.wire import Message
rows, width = int(sys.argv[4]), int(sys.argv[5])
FX, Y = torch.ones(rows, width), torch.zeros(rows, dtype=torch.long)  # built once, as bare's
class Fixed(DeviceAgent):
    def _on_begin(self, c, msg):
        self.roles[c] = None  # begun (later commands check this), no model part to train
        return Message("ack")
    def _on_forward(self, c, msg):
        return Message("forwarded", {"step": msg.fields["step"]},
                       {"fx": FX, "y": Y})
    def _on_backward(self, c, msg):
        return None
opts = DeviceOptions(server=sys.argv[1], name="bench", token=sys.argv[2], clients=(0,),
                     retry_s=30)
sys.exit(run_device(opts, lambda *a: None, Fixed))
"""


def splitfl_round_trip(iters: int, rows: int, width: int, folder: Path) -> list[float]:
    """Per-exchange seconds of RemoteFleet.forward + backward with a device process that
    answers with fixed tensors (rows × width float32 smashed data, rows int64 labels)."""
    bed = Testbed.create(folder, ["bench"])
    small = {"data.num_clients": 2, "train.clients_per_round": 2}
    cfg = as_config(config_for("splitfed_v1", **small))
    # the config's default chunk size (a 1 MB message is one chunk, as in a run)
    chunk = NetworkConfig().chunk_kb * 1024
    settings = HubSettings(max_message_bytes=1 << 28, chunk_bytes=chunk)
    hub = Hub(settings, TokenBook.read(bed.tokens_file), 2, {"config": cfg.to_dict()})
    hub.start(f"127.0.0.1:{bed.port}", None)
    device = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _SPLITFL_DEVICE,
            f"127.0.0.1:{bed.port}",
            bed.tokens["bench"],
            "0",
            str(rows),
            str(width),
        ]
    )
    times: list[float] = []
    try:
        hub.wait_for(1, 120)
        expect = Expect(torch.float32, {1: (width,)}, 10, {1: {}})
        fleet = RemoteFleet(hub, 0, 60.0, expect, {0: Meter()}, {})
        fleet.begin([ClientTask(0, 1, batch_size=rows)], {0: {}}, {})
        grad = torch.ones(rows, width)
        for step in range(iters):
            t0 = time.perf_counter()
            out = fleet.forward({0: step})
            fleet.backward({0: grad})
            times.append(time.perf_counter() - t0)
            assert 0 in out, fleet.lost
    finally:
        hub.stop()
        device.wait(30)
        device.kill()
    return times


def overhead(iters: int, rows: int, width: int, folder: Path, repeats: int = 1) -> dict:
    """Median per-exchange times of the four transports (:data:`KINDS`); with ``repeats`` > 1
    they are run in rotating order (bare, tensors, framed, splitfl, then tensors, framed,
    splitfl, bare, …) and each ratio is the median of the per-repeat ratios (robust to load
    from other processes drifting during the run)."""
    up = rows * width * 4 + rows * 8
    down = rows * width * 4
    skip = iters // 10  # warm-up
    got: dict[str, list[float]] = {k: [] for k in KINDS}
    for r in range(repeats):
        shift = r % len(KINDS)
        for kind in KINDS[shift:] + KINDS[:shift]:
            if kind == "splitfl":
                times = splitfl_round_trip(iters, rows, width, folder / f"r{r}")
            else:
                times = bare_round_trip(iters, up, down, kind, (rows, width))
            got[kind].append(statistics.median(times[skip:]))
    row = {"rows": rows, "width": width, "bytes_up": up, "bytes_down": down}
    row |= {f"{k}_ms": statistics.median(v) * 1e3 for k, v in got.items()}
    for num, den in RATIOS:
        pairs = zip(got[num], got[den], strict=True)
        row[f"{num}/{den}"] = statistics.median(a / b for a, b in pairs)
    row["ratio"] = row["splitfl/bare"]
    if repeats > 1:
        row |= {f"{k}_ms_each": [x * 1e3 for x in v] for k, v in got.items()}
    return row


#: The transports: bare gRPC, + tensors per message, + splitfl's format and checks, splitfl.
KINDS = ("bare", "tensors", "framed", "splitfl")
RATIOS = (
    ("splitfl", "bare"),
    ("tensors", "bare"),
    ("framed", "bare"),
    ("framed", "tensors"),
    ("splitfl", "framed"),
)


# -- round time and memory with N device processes ------------------------------------------


def _rss_mb(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def launch_round(devices: int, folder: Path, steps: int) -> dict:
    """SplitFed V1 on digits, 50 clients all selected, ``devices`` device processes."""
    changes = {
        "rounds": 3,
        "data.num_clients": 50,
        "train.clients_per_round": 50,
        "data.min_samples": 8,
        "train.local_steps": steps,
        "network.connect_timeout_s": 900.0,
    }
    cfg = folder / f"c{devices}.yaml"
    cfg.write_text(yaml.safe_dump(config_for("splitfed_v1", **changes)))
    run_dir = folder / f"run{devices}"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "splitfl",
            "launch",
            str(cfg),
            "--devices",
            str(devices),
            "--out",
            str(run_dir),
            "--no-progress",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    rss: list[float] = []
    while proc.poll() is None:
        info = run_dir / "network.json"
        metrics = run_dir / "metrics.jsonl"
        if info.exists() and metrics.exists() and not rss:
            pids = [d["pid"] for d in json.loads(info.read_text())["local_devices"]]
            rss = [r for r in (_rss_mb(p) for p in pids) if r is not None]
        time.sleep(0.2)
    total = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {
        "devices": devices,
        "clients": 50,
        "local_steps": steps,
        "round_time_s": [r["measured_round_time"] for r in rows],
        "mean_busy_s": [statistics.mean(r["measured_busy_s"]) for r in rows],
        "mean_wait_s": [statistics.mean(r["measured_wait_s"]) for r in rows],
        "device_rss_mb_median": statistics.median(rss) if rss else None,
        "device_rss_mb_max": max(rss) if rss else None,
        "wall_s_including_start": total,
        "exit_code": proc.returncode,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--shapes", nargs="*", default=["16x1024", "64x4096", "128x16384"])
    p.add_argument("--devices", type=int, nargs="*", default=[10, 50])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--repeats", type=int, default=1, help="alternating runs per shape")
    p.add_argument("--per-batch-only", action="store_true", help="only the per-batch overhead part")
    p.add_argument("--out", type=Path)
    args = p.parse_args()
    torch.set_num_threads(1)
    try:  # the server process of all three transports: the settings a splitfl server uses
        from splitfl.core.allocator import keep_freed_memory

        keep_freed_memory()
    except ImportError:  # measuring a splitfl from before splitfl.core.allocator
        pass
    results: dict = {"machine": f"{os.cpu_count()} cores", "torch": torch.__version__}
    with tempfile.TemporaryDirectory() as tmp:
        results["overhead"] = []
        for i, shape in enumerate(args.shapes):
            rows, width = map(int, shape.split("x"))
            row = overhead(args.iters, rows, width, Path(tmp) / f"o{i}", args.repeats)
            print(json.dumps(row), flush=True)
            results["overhead"].append(row)
        results["launch"] = []
        for n in [] if args.per_batch_only else args.devices:
            row = launch_round(n, Path(tmp), args.steps)
            print(json.dumps(row), flush=True)
            results["launch"].append(row)
    if args.out:
        args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

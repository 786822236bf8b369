"""splitfl.core.allocator: a long-running process keeps freed blocks for the next batch."""

import os
import subprocess
import sys

import pytest

from splitfl.net.device import session as device_session
from splitfl.net.device.agent import DeviceOptions

# three 1 MiB buffers alive at once, dropped, 100 times: a batch's message, its received copy
# and a tensor, as a server or device builds them for every message
_CYCLES = """
import resource, sys
if sys.argv[1] == "keep":
    from splitfl.core.allocator import keep_freed_memory
    assert keep_freed_memory()
def cycle():
    bufs = [bytearray(1 << 20) for _ in range(3)]
    for buf in bufs:
        buf[::4096] = b"x" * 256  # touch every page (a zeroing calloc may not have)
    del bufs
for _ in range(5):
    cycle()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(100):
    cycle()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, **env: str) -> int:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")} | env
    cmd = [sys.executable, "-c", _CYCLES, mode]
    out = subprocess.run(cmd, capture_output=True, text=True, env=environ)
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator")
def test_freed_message_buffers_are_reused_without_page_faults():
    kept, default = _faults("keep"), _faults("default")
    assert kept < 100  # each cycle's pages are the last cycle's
    assert default > 100 * 256  # without: at least a MiB of fresh pages per cycle
    # a threshold the user's environment sets is left as given (here: 1 MiB blocks mmapped)
    assert _faults("keep", MALLOC_MMAP_THRESHOLD_=str(128 << 10)) > 100 * 256


def test_a_device_process_applies_the_settings_before_anything_else(monkeypatch):
    calls = []
    monkeypatch.setattr(device_session, "keep_freed_memory", lambda: calls.append(1))
    opts = DeviceOptions(server="127.0.0.1:1", name="d", token="t", peer_listen="not-an-address")
    lines: list[str] = []
    assert device_session.run_device(opts, lines.append) == 2  # refused at once: bad listen
    assert calls == [1] and "cannot listen for peers" in lines[0]

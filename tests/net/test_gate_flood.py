"""The pre-authentication gate under a flood of hellos that never prove (issue 51 item 6: a
token-less attacker on one TLS connection opening ≈136 hello streams/s kept the 16 pending
slots full and 6 of 8 valid logins were cancelled before their proof; its hellos never
engaged the throttle). :class:`~splitfl.net.transport.guard.Gate` driven directly with
stand-in stream contexts: no network, no sleeps but the watchdog's."""

from __future__ import annotations

import time

from splitfl.net.transport.guard import Audit, Gate


class _Stream:
    """A stream's context as the gate sees it: its peer (address and port) and cancel()."""

    def __init__(self, peer: str):
        self._peer, self.cancelled = peer, False

    def peer(self) -> str:
        return self._peer

    def cancel(self) -> None:
        self.cancelled = True


def _gate(**kw) -> tuple[Gate, list[str]]:
    lines: list[str] = []
    gate = Gate(
        kw.get("max_pending", 4),
        kw.get("auth_timeout_s", 10.0),
        kw.get("fails", 3),
        Audit(sink=lines.append),
    )
    return gate, lines


def _open(gate: Gate, peer: str, name: str | None = "a") -> _Stream:
    s = _Stream(peer)
    address = peer.split(":")[1]
    assert gate.enter(s, address) is None
    if name is not None:
        gate.hello(s, address, name)
    return s


def _flood_keeps(peer_of_login: str) -> tuple[_Stream, list[_Stream]]:
    """Four slots full of the flooder's hellos (one connection), a valid login says hello,
    then ten more flood hellos: the login's stream and the flood's."""
    gate, _ = _gate(max_pending=4)
    try:
        flood = [_open(gate, "ipv4:10.0.0.9:5000", "x") for _ in range(4)]
        login = _open(gate, peer_of_login, "a")
        flood += [_open(gate, "ipv4:10.0.0.9:5000", "x") for _ in range(10)]
        assert login in gate.pending or login.cancelled
        return login, flood
    finally:
        gate.stop()


def test_a_hello_flood_from_another_address_does_not_cancel_a_login():
    """The old gate evicted the globally oldest stream: the login went at the flood's 4th
    stream after it. Now the address holding the most slots loses one."""
    login, flood = _flood_keeps("ipv4:10.0.0.1:6000")
    assert not login.cancelled
    assert sum(s.cancelled for s in flood) == 11  # 14 flood streams, 3 slots left to them


def test_a_hello_flood_on_one_connection_does_not_cancel_a_login_from_its_address():
    """The same address (one NAT, or loopback), another connection: the connection holding
    the most slots loses one."""
    login, flood = _flood_keeps("ipv4:10.0.0.9:6001")
    assert not login.cancelled
    assert sum(s.cancelled for s in flood) == 11


def test_hellos_that_never_prove_engage_the_throttle():
    """Three hellos for ``a`` that end without a proof (auth_failures 3) throttle (address,
    ``a``), with an audit line; a proved one does not count, nor a stream without a hello
    (old code: no failure counted, never throttled)."""
    gate, lines = _gate(max_pending=8, fails=3)
    try:
        silent = _open(gate, "ipv4:10.0.0.1:7001", None)
        gate.leave(silent)
        for port in range(3):
            gate.leave(_open(gate, f"ipv4:10.0.0.1:{7100 + port}", "a"))
        assert ("10.0.0.1", "a") in gate.throttled
        assert any("throttled peer=10.0.0.1 3 failed" in line for line in lines), lines
        for port in range(3):  # proved, then refused (e.g. a live link of the name): no count
            proved = _open(gate, f"ipv4:10.0.0.3:{7200 + port}", "c")
            gate.proved(proved)
            gate.leave(proved)
        assert ("10.0.0.3", "c") not in gate.throttled and not gate.failures.get(("10.0.0.3", "c"))
    finally:
        gate.stop()


def test_a_hello_timed_out_unproved_counts_as_a_failure():
    """A hello whose proof never comes is cancelled at ``auth_timeout_s`` by the watchdog
    and counted for its (address, name)."""
    gate, _ = _gate(max_pending=8, auth_timeout_s=0.1, fails=10)
    try:
        s = _open(gate, "ipv4:10.0.0.2:8000", "b")
        deadline = time.monotonic() + 5.0
        while not s.cancelled and time.monotonic() < deadline:
            time.sleep(0.05)
        assert s.cancelled
        assert len(gate.failures.get(("10.0.0.2", "b"), ())) == 1
    finally:
        gate.stop()

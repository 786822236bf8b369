"""The block of clients the server deals a device that names none (README, "The three
commands"): with tokens bound by ``splitfl token --clients``, ``min_devices`` devices still
host every client."""

from splitfl.net.auth import TokenBook
from splitfl.net.hub import Hub
from splitfl.net.session import deal_block


def test_block_without_bound_tokens_is_ceil_clients_over_devices():
    assert deal_block(50, 2, {}) == 25
    assert deal_block(10, 3, {}) == 4


def test_bound_token_counts_as_one_of_the_devices():
    # README: jetson-1 unbound, jetson-2 bound to 4-7, --min-devices 2, 50 clients: jetson-1
    # must get the other 46 (before: a block of 25, so clients 29..49 were never hosted)
    assert deal_block(50, 2, {"jetson-2": frozenset(range(4, 8))}) == 46
    # bound ids beyond the run's clients do not count; every device bound: still at least 1
    assert deal_block(10, 2, {"a": frozenset({3, 99})}) == 9
    assert deal_block(4, 1, {"a": frozenset(range(4))}) == 1


def test_hub_deals_the_remaining_clients_to_the_unbound_device():
    book = TokenBook()
    book.add("one", "t1")
    book.add("two", "t2")
    book.bound["two"] = frozenset(range(4, 8))
    block = deal_block(50, 2, book.bound)
    hub = Hub.__new__(Hub)  # only _assign's state: no listener
    hub.links, hub.tokens, hub.num_clients = {}, book, 50
    hub.welcome = {"block": block}
    hub.settings = type("S", (), {"max_links": 0})()
    got = hub._assign("one", None, None, "10.0.0.11")
    assert got == [c for c in range(50) if not 4 <= c < 8]

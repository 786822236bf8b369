"""The block of clients the server deals a device that names none
(docs/tutorials/first-networked-run.md, "The three commands"): with tokens bound by ``splitfl
token --clients``, the devices awaited still host every client when the tokens file names
exactly them."""

from splitfl.net.server.session import deal_block


def test_block_without_bound_tokens_is_ceil_clients_over_devices():
    assert deal_block(50, 2, {}, 2) == 25
    assert deal_block(10, 3, {}, 3) == 4


def test_bound_token_counts_as_one_of_the_devices():
    # the docs: jetson-1 unbound, jetson-2 bound to 4-7, --min-devices 2, 50 clients: jetson-1
    # must get the other 46 (before: a block of 25, so clients 29..49 were never hosted)
    assert deal_block(50, 2, {"jetson-2": frozenset(range(4, 8))}, 2) == 46
    # bound ids beyond the run's clients do not count; every client bound: still at least 1
    assert deal_block(10, 2, {"a": frozenset({3, 99})}, 2) == 9
    assert deal_block(4, 2, {"a": frozenset(range(4))}, 2) == 1


def test_more_tokens_than_awaited_devices_keeps_the_even_block():
    # who of the three comes is unknown: an unbound pair must both get clients
    assert deal_block(50, 2, {"jetson-2": frozenset(range(4, 8))}, 3) == 25
    # a token bound only to ids beyond the run's clients is no device of this run
    assert deal_block(4, 2, {"jetson-2": frozenset(range(4, 8))}, 2) == 2

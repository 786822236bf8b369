"""Which clients a joining device hosts: the ids it asked for (each allowed to its token and
not hosted by another live device), else the ids bound to its token (``name:hash:clients=``),
else the next free block. Pure: the hub calls it under its lock and turns a refusal into the
gRPC status it names."""

from __future__ import annotations


class AssignRefused(Exception):
    """A device's client request cannot be granted: ``code`` names the gRPC status
    (``INVALID_ARGUMENT``, ``PERMISSION_DENIED``, ``ALREADY_EXISTS``, ``RESOURCE_EXHAUSTED``)."""

    def __init__(self, code: str, why: str):
        super().__init__(why)
        self.code, self.why = code, why


def assign_clients(name: str, asked, hosted: set[int], tokens, num_clients: int, block: int):
    """The clients device ``name`` hosts (``asked``: the ids its hello named, if any;
    ``hosted``: ids other live devices hold; ``tokens``: the tokens book, whose ``may_host``
    and ``bound`` say what its token allows; ``block``: clients per unbound device)."""
    if asked:
        ok = isinstance(asked, list) and all(isinstance(c, int) for c in asked)
        if not ok or any(not 0 <= c < num_clients for c in asked):
            raise AssignRefused("INVALID_ARGUMENT", f"bad client ids {str(asked)[:80]}")
        foreign = sorted(c for c in set(asked) if not tokens.may_host(name, c))
        if foreign:
            why = f"clients {foreign} are not bound to {name!r}'s token"
            raise AssignRefused("PERMISSION_DENIED", why)
        taken = sorted(set(asked) & hosted)
        if taken:
            raise AssignRefused(
                "ALREADY_EXISTS", f"clients {taken} already hosted by another device"
            )
        return sorted(set(asked))
    if name in tokens.bound:
        free = [c for c in sorted(tokens.bound[name]) if c < num_clients]
        block = len(free)
    else:
        free = [c for c in range(num_clients) if tokens.may_host(name, c)]
    free = [c for c in free if c not in hosted]
    if not free:
        why = "every client this device may host is hosted already"
        raise AssignRefused("RESOURCE_EXHAUSTED", why)
    return free[:block]

"""Bounds on YAML input, checked before it is composed or expanded.

A config is a few kilobytes; anything far bigger is a mistake or an attack, and should be
refused in milliseconds, not parsed for a minute. :func:`yaml_limit_violation` streams the
parser's events once (the parser keeps an explicit stack, so deep nesting cannot overflow
Python's recursion limit) and measures the size the document would have with every alias
expanded, so a "billion laughs" document is refused before anything is built from it.
"""

from __future__ import annotations

import yaml

#: Largest YAML text accepted (bytes of a file, characters of a string): 1 MB.
MAX_YAML_BYTES = 1_000_000
#: Deepest nesting of mappings/sequences accepted (a config nests 3 levels).
MAX_YAML_DEPTH = 32
#: Most values (scalars, mappings, sequences) accepted once aliases are expanded.
MAX_YAML_VALUES = 100_000

_START = (yaml.SequenceStartEvent, yaml.MappingStartEvent)
_END = (yaml.SequenceEndEvent, yaml.MappingEndEvent)


def yaml_limit_violation(text: str, loader: type) -> str | None:
    """What makes ``text`` too big to load (one line), or None when it is within the bounds.

    Raises ``yaml.YAMLError`` for text that does not parse.
    """
    if len(text) > MAX_YAML_BYTES:
        return f"larger than {MAX_YAML_BYTES} bytes (MAX_YAML_BYTES)"
    open_sizes: list[int] = []  # expanded size so far of each open collection
    open_anchors: list[str | None] = []
    anchors: dict[str, int] = {}  # expanded size of each anchored node
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, _START):
            if len(open_sizes) >= MAX_YAML_DEPTH:
                return f"nests deeper than {MAX_YAML_DEPTH} levels (MAX_YAML_DEPTH)"
            open_sizes.append(1)
            open_anchors.append(event.anchor)
            continue
        if isinstance(event, _END):
            size, anchor = open_sizes.pop(), open_anchors.pop()
        elif isinstance(event, yaml.ScalarEvent):
            size, anchor = 1, event.anchor
        elif isinstance(event, yaml.AliasEvent):
            size, anchor = anchors.get(event.anchor, 1), None
        else:
            continue
        if anchor is not None:
            anchors[anchor] = size
        if open_sizes:
            open_sizes[-1] += size
            size = open_sizes[-1]
        if size > MAX_YAML_VALUES:
            return (
                f"expands to more than {MAX_YAML_VALUES} values (MAX_YAML_VALUES; "
                "aliases are counted expanded)"
            )
    return None

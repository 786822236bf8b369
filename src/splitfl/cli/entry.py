"""The ``splitfl`` console script. ``splitfl device`` goes straight to the light device
module, so an edge device needs neither the experiment layer nor matplotlib, scipy or Ray;
every other command loads the full command line (:mod:`splitfl.cli.main`)."""

from __future__ import annotations

import importlib
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["device"]:
        return importlib.import_module("splitfl.net.device.cli").main(argv[1:])
    return importlib.import_module("splitfl.cli.main").main(argv)


if __name__ == "__main__":
    sys.exit(main())

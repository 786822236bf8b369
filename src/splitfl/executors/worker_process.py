"""A local worker process of ``executor: parallel`` (``backend: local``).

``python -m splitfl.executors.worker_process FD`` serves a
:class:`~splitfl.executors.workers.UnitWorker` on the socket ``FD`` that the driver
(:class:`~splitfl.executors.pools.LocalPool`) passed it: each message
(:func:`~splitfl.executors.workers.send_message`) gets one answer; an empty message, the
driver closing the socket or a message whose framing is out of bounds ends it. Nothing
imports this module; it is only run.
"""

from __future__ import annotations

import socket
import sys

from splitfl.executors.channel import ChannelError
from splitfl.executors.workers import UnitWorker, recv_message, send_message


def serve(sock: socket.socket) -> None:
    worker = UnitWorker()
    while True:
        try:
            ops = recv_message(sock)
        except (EOFError, OSError, ChannelError):  # the driver is gone, or the stream broken
            return
        if not ops:
            return
        send_message(sock, [worker.handle(ops)])


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))

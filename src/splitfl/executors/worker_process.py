"""A local worker process of ``executor: parallel`` (``backend: local``).

``python -m splitfl.executors.worker_process FD`` serves a
:class:`~splitfl.executors.workers.UnitWorker` on the socket ``FD`` that the driver
(:class:`~splitfl.executors.pools.LocalPool`) passed it: a message is a count and that many
operations; each message gets one answer. Nothing imports this module; it is only run.
"""

from __future__ import annotations

import socket
import sys
from multiprocessing.connection import Connection

from splitfl.executors.workers import UnitWorker


def serve(conn: Connection) -> None:
    """A local worker's loop: a message is a count and that many operations; answer each
    message; end when the driver closes the pipe or sends a count of 0."""
    worker = UnitWorker()
    while True:
        try:
            count = int.from_bytes(conn.recv_bytes(), "little")
        except EOFError:
            return
        if count == 0:
            return
        conn.send_bytes(worker.handle([conn.recv_bytes() for _ in range(count)]))


if __name__ == "__main__":
    sock = socket.socket(fileno=int(sys.argv[1]))
    serve(Connection(sock.detach()))

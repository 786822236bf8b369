"""A local worker process of ``executor: parallel`` (``backend: local``).

``python -m splitfl.executors.worker_process FD`` serves a
:class:`~splitfl.executors.workers.UnitWorker` on the socket ``FD`` that the driver
(:class:`~splitfl.executors.pools.LocalPool`) passed it: each message
(:func:`~splitfl.executors.workers.send_message`) gets one answer; an empty message, the
driver closing the socket or a message whose framing is out of bounds ends it, and so does a
driver that died while the worker trained (its answer has nowhere to go): quietly, with no
traceback. SIGINT ends the process as SIGTERM does, without a ``KeyboardInterrupt`` traceback
(Ctrl-C reaches the whole process group; the driver records the interrupt, and replaces a
worker that alone was interrupted). Nothing imports this module; it is only run.
"""

from __future__ import annotations

import signal
import socket
import sys

from splitfl.executors.channel import ChannelError
from splitfl.executors.workers import UnitWorker, recv_message, send_message


def serve(sock: socket.socket) -> None:
    """Answer the driver's messages on ``sock`` until it says stop or is gone."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # ended by the signal, no traceback
    worker = UnitWorker()
    while True:
        try:
            ops = recv_message(sock)
        except (EOFError, OSError, ChannelError):  # the driver is gone, or the stream broken
            return
        if not ops:
            return
        try:
            send_message(sock, [worker.handle(ops)])
        except OSError:  # the driver is gone (BrokenPipeError, ConnectionResetError)
            return


if __name__ == "__main__":
    serve(socket.socket(fileno=int(sys.argv[1])))

"""Networked execution: a server process and device processes exchanging activations and
gradients over gRPC. The subpackages say which process runs a file:

* :mod:`~splitfl.net.transport` — both ends of every link: the wire format, the hub (the
  server's listener and each device's peer listener), the handshake, tokens and TLS;
* :mod:`~splitfl.net.trust` — the checks of what a device or a peer sends, run by whoever
  receives it (the server, a ParallelSFL top worker, a RingSFL ring member);
* :mod:`~splitfl.net.server` — the server process: the executor, its fleet and session;
* :mod:`~splitfl.net.device` — the device process (``splitfl device``): the agent and its links.

Importing this package imports nothing else: a device process loads only what it needs.
It keeps gRPC's C-core logging off the console (``GRPC_VERBOSITY=NONE`` before gRPC is
imported, unless the user set ``GRPC_VERBOSITY``): a device dialling with the wrong
certificate would print dozens of C-core lines a second, while splitfl says what is wrong
in one line; ``GRPC_VERBOSITY=ERROR`` (or ``DEBUG``) brings them back.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "NONE")

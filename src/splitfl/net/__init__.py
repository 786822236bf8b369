"""Networked execution: a server process and device processes exchanging activations and
gradients over gRPC (:mod:`~splitfl.net.wire` format, :mod:`~splitfl.net.hub` server end,
:mod:`~splitfl.net.device` device end, :mod:`~splitfl.net.executor` the executor).

Importing this package imports nothing else: a device process loads only what it needs.
"""

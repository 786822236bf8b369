"""Both ends of every link (server and devices): the wire format (:mod:`.wire`), the gRPC hub
that accepts links (:mod:`.hub`: the server's listener and, as :mod:`.peer`, each device's peer
listener), one link and its keepalive (:mod:`.link`, :mod:`.inbox`), the opening of a link
(:mod:`.handshake`, :mod:`.assign`, :mod:`.announce`), tokens, TLS and certificates
(:mod:`.auth`, :mod:`.certs`), and what a listener does before it knows the caller
(:mod:`.guard`, :mod:`.audit`). Imports nothing of the other ``net`` subpackages."""

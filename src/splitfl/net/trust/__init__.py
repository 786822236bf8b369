"""What a receiver checks of what crosses a trust boundary, run wherever a device's or a
peer's tensors arrive (the server, a ParallelSFL top worker, a RingSFL ring member): shapes and
magnitudes (:mod:`.checks`, :mod:`.expect`), ring hops (:mod:`.ring_bounds`), updates against
their peers' (:mod:`.spread`) and against the server's own step (:mod:`.reference`)."""

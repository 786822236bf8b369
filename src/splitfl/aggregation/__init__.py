"""Averaging client models: ``mean`` (weighted averages of state dicts), ``robust``
(``train.aggregation``'s robust rules) and ``layerwise`` (the per-layer aggregation every
algorithm applies). Imports no executor, network, experiment or algorithm module."""

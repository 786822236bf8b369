"""splitfl: split federated learning on heterogeneous edge devices."""

__version__ = "0.1.0"

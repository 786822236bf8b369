"""The ``splitfl`` command line."""

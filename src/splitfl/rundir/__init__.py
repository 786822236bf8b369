"""Run directories: ``lock`` (one owning process per run or sweep directory)."""

"""DCP checkpoints: save and publish, resume, the banded layout, readers and writers, the
memory tier and the schedule. Imports `telemetry`, `runtime` and `contract`.
"""

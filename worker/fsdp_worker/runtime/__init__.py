"""A rank's process: its process groups (distributed) and the injected faults of tests.
Imports `contract` only.
"""

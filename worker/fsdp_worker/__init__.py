"""fsdp-worker: the torchrun entrypoint.

Torch-free at package level (no imports here) so the operator can share catalog and config.
"""

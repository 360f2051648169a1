"""fsdp-worker: the torchrun entrypoint. Torch-free at package level so the operator can share catalog and config."""

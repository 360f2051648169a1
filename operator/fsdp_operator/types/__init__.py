"""The operator's data: the FSDPJob API (spec, status), what a pass observed, names, Kueue labels.

Pure types and their parsing, no I/O. Imports nothing of the operator's above it; the worker's
`fsdp_worker.contract` only.
"""

"""The programs torchrun runs: the built-in trainer (main, trainer, model, optim, parallelize,
data, ledger) and the torch-free stand-in. The top layer.
"""

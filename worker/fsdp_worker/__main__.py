"""`python -m fsdp_worker`: run the worker under torchrun and exit with its code.

A config the trainer would refuse is refused first, before torch is imported (preflight.py).
"""

import sys

from fsdp_worker.train import preflight


def _main() -> int:
    refused = preflight.refusal()
    if refused is not None:
        return refused
    from fsdp_worker.train import main  # torch and the trainer: only for a config that passed

    return main.main()


sys.exit(_main())

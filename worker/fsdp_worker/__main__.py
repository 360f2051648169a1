"""`python -m fsdp_worker`: run the worker under torchrun and exit with its code."""

import sys

from fsdp_worker.train import main

sys.exit(main.main())

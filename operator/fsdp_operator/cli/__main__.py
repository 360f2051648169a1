"""`python -m fsdp_operator.cli`: fsdpctl (the shell's completion runs it so)."""

import sys

from fsdp_operator.cli import main

sys.exit(main())

"""What the operator gave a rank, as the kit names it: `fsdp_worker.kit.environment`.

The loader lives in contract/environment.py, torch-free, so that `python -m fsdp_worker` can
refuse a bad config before it imports torch; this module only keeps the kit's name for it.
"""

from __future__ import annotations

from fsdp_worker.contract.environment import (
    Settings as Settings,
)
from fsdp_worker.contract.environment import (
    env_rank as env_rank,
)
from fsdp_worker.contract.environment import (
    env_world_size as env_world_size,
)
from fsdp_worker.contract.environment import (
    hang_step_times as hang_step_times,
)
from fsdp_worker.contract.environment import (
    int_env as int_env,
)
from fsdp_worker.contract.environment import (
    int_env_or as int_env_or,
)
from fsdp_worker.contract.environment import (
    load_settings as load_settings,
)

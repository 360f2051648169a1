"""How a rank walks a global batch (the plan), and the check that the global batch splits
exactly at a world size. Pure arithmetic on the training config: no torch, so that
`python -m fsdp_worker` can refuse an impossible split before it imports torch
(train/preflight.py); train/data.py walks the plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from fsdp_worker.contract import config, errors


@dataclass(frozen=True)
class Plan:
    """How one rank walks a global batch: micro x world x accumulation = global."""

    global_batch: int
    micro_batch: int
    world_size: int
    rank: int

    @property
    def accumulation(self) -> int:
        return self.global_batch // (self.micro_batch * self.world_size)

    def indices(self, *, cursor: int, accum_index: int) -> range:
        first = cursor + (accum_index * self.world_size + self.rank) * self.micro_batch
        return range(first, first + self.micro_batch)


def make_plan(cfg: config.TrainingConfig, *, world_size: int, rank: int) -> Plan:
    """ConfigError (naming the fields) when the global batch cannot be kept exact."""
    try:
        cfg.accumulation_steps(world_size)
    except ValueError as exc:
        raise errors.ConfigError(f"training.globalBatchSize: {exc}") from exc
    return Plan(
        global_batch=cfg.global_batch_size,
        micro_batch=cfg.micro_batch_size,
        world_size=world_size,
        rank=rank,
    )

"""The state ledger: bytes each rank holds for the configured model and world size.

Logged at start (parameter, gradient and optimizer bytes per rank as persistent shards, and
the largest group FSDP gathers at once) and after the first steps (measured peak memory), so
an operator of the job can see whether a world size fits. It must not change any state.
"""

from __future__ import annotations

import resource
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from fsdp_worker.train import parallelize

ADAMW_STATES = 2  # exp_avg and exp_avg_sq, each shaped and typed like the parameter shard


def _local_bytes(p: torch.Tensor) -> int:
    local = p.to_local() if isinstance(p, DTensor) else p
    return local.numel() * local.element_size()


def _own_params(unit: nn.Module, units: list[nn.Module]) -> list[nn.Parameter]:
    nested = {id(p) for u in units if u is not unit and _is_inside(u, unit) for p in u.parameters()}
    return [p for p in unit.parameters() if id(p) not in nested]


def _is_inside(child: nn.Module, parent: nn.Module) -> bool:
    return any(m is child for m in parent.modules())


def planned(model: nn.Module, *, param_dtype: torch.dtype, world_size: int) -> dict[str, Any]:
    """Persistent bytes per rank, and the largest all-gathered unit (in the compute dtype)."""
    params = sum(_local_bytes(p) for p in model.parameters())
    units: list[nn.Module] = list(parallelize.fsdp_units(model))
    elem = torch.empty((), dtype=param_dtype).element_size()
    largest = max((sum(p.numel() for p in _own_params(u, units)) * elem for u in units), default=0)
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "worldSize": world_size,
        "parameters": n_params,
        "paramBytesPerRank": params,
        "gradBytesPerRank": params,
        "optimizerBytesPerRank": ADAMW_STATES * params,
        "persistentBytesPerRank": (2 + ADAMW_STATES) * params,
        "largestGatheredBytes": largest,
    }


def peak_memory_bytes(device: torch.device) -> int:
    """Accelerator peak allocation, or the process's peak RSS on CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

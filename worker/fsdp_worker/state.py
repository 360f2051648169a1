"""What a checkpoint holds, as a DCP state dict: model, optimizer, scheduler, counters, RNG.

Model and optimizer go through DCP's state-dict helpers, so they reshard on load at any world
size. RNG states of all ranks are gathered into one replicated [world, n] tensor; on load rank
r takes row r when the saved world had one, otherwise it reseeds from (seed, step, rank). The
built-in training draws no random numbers after init, so losses do not depend on that choice.
This module must not write files or pick checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.optim.lr_scheduler import LRScheduler


@dataclass
class TrainState:
    """Everything that advances during training; `samples` is the global sample cursor."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    step: int = 0
    samples: int = 0


def _gather_rng(group: dist.ProcessGroup) -> torch.Tensor:
    mine = torch.get_rng_state()
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, mine, group=group)
    return torch.stack(rows)


def to_save(state: TrainState, *, group: dist.ProcessGroup) -> dict[str, Any]:
    """A state dict for dcp.save; collective (gathers the RNG states)."""
    model_sd, optim_sd = get_state_dict(state.model, state.optimizer)
    return {
        "model": model_sd,
        "optim": optim_sd,
        "scheduler": state.scheduler.state_dict(),
        "train": {
            "step": torch.tensor(state.step, dtype=torch.int64),
            "samples": torch.tensor(state.samples, dtype=torch.int64),
        },
        "rng": _gather_rng(group),
    }


def template(state: TrainState, *, saved_world_size: int) -> dict[str, Any]:
    """A state dict of the right shapes for dcp.load, before any value is known."""
    model_sd, optim_sd = get_state_dict(state.model, state.optimizer)
    rng = torch.get_rng_state()
    return {
        "model": model_sd,
        "optim": optim_sd,
        "scheduler": state.scheduler.state_dict(),
        "train": {"step": torch.tensor(0), "samples": torch.tensor(0)},
        "rng": torch.zeros((saved_world_size, rng.numel()), dtype=rng.dtype),
    }


def apply_loaded(state: TrainState, sd: dict[str, Any], *, rank: int, seed: int) -> None:
    """Push a loaded state dict into the live objects."""
    set_state_dict(
        state.model, state.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"]
    )
    state.scheduler.load_state_dict(sd["scheduler"])
    state.step = int(sd["train"]["step"])
    state.samples = int(sd["train"]["samples"])
    rng: torch.Tensor = sd["rng"]
    if rank < rng.shape[0]:
        torch.set_rng_state(rng[rank].clone())
    else:
        torch.manual_seed(seed * 1_000_003 + state.step * 1_009 + rank)

"""What a checkpoint holds, as a DCP state dict: model, optimizer, scheduler, counters, RNG.

Model and optimizer go through DCP's state-dict helpers, so they reshard on load at any world
size. RNG states of all ranks are gathered into replicated [world, n] tensors: `rng` (CPU,
always) and `rng_cuda` (the rank's current CUDA device, only when CUDA is available). On load
rank r takes CPU row r when the saved world had one and CUDA row r only at the same world size;
otherwise that generator is reseeded from (seed, step, rank). The built-in training draws no
random numbers after init, so losses do not depend on that choice.
This module must not write files or pick checkpoints.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.optim.lr_scheduler import LRScheduler

RNG_CPU = "rng"  # [saved world, n] uint8; the key predates CUDA support
RNG_CUDA = "rng_cuda"  # [saved world, m] uint8; present only in checkpoints written with CUDA


@dataclass
class TrainState:
    """Everything that advances during training; `samples` is the global sample cursor."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    step: int = 0
    samples: int = 0


def local_rng_states() -> dict[str, torch.Tensor]:
    """This rank's generator states (CPU tensors): the CPU one always, the current CUDA
    device's only when CUDA is available. Nothing here initialises CUDA on a CPU machine."""
    states = {RNG_CPU: torch.get_rng_state()}
    if torch.cuda.is_available():
        states[RNG_CUDA] = torch.cuda.get_rng_state()
    return states


def _gather_rows(mine: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    rows = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(rows, mine, group=group)
    return torch.stack(rows)


def gather_rng(group: dist.ProcessGroup) -> dict[str, torch.Tensor]:
    """Every rank's generator states as replicated [world, n] tensors; collective (gloo)."""
    return {key: _gather_rows(mine, group) for key, mine in local_rng_states().items()}


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
        **gather_rng(group),
    }


def rng_template(*, saved_world_size: int, saved_keys: Collection[str]) -> dict[str, torch.Tensor]:
    """Buffers for the RNG entries to load. `rng_cuda` is requested only when this process
    can use it and the checkpoint has it, so a CUDA checkpoint loads on CPU and vice versa."""
    out: dict[str, torch.Tensor] = {}
    for key, mine in local_rng_states().items():
        if key == RNG_CPU or key in saved_keys:
            out[key] = torch.zeros((saved_world_size, mine.numel()), dtype=mine.dtype)
    return out


def template(
    state: TrainState, *, saved_world_size: int, saved_keys: Collection[str]
) -> dict[str, Any]:
    """A state dict of the right shapes for dcp.load, before any value is known.
    `saved_keys` are the checkpoint's top-level keys (from its DCP metadata)."""
    model_sd, optim_sd = get_state_dict(state.model, state.optimizer)
    return {
        "model": model_sd,
        "optim": optim_sd,
        "scheduler": state.scheduler.state_dict(),
        "train": {"step": torch.tensor(0), "samples": torch.tensor(0)},
        **rng_template(saved_world_size=saved_world_size, saved_keys=saved_keys),
    }


def rng_row(
    saved_world_size: int, *, rank: int, world_size: int, same_world_only: bool
) -> int | None:
    """The saved row this rank restores, or None to reseed. CPU rows carry over to ranks below
    the old world size; CUDA rows only at the same world size, because at another size every
    rank's micro-batches differ, so continuing an old stream would promise nothing."""
    if same_world_only and saved_world_size != world_size:
        return None
    return rank if rank < saved_world_size else None


def reseed_value(*, seed: int, step: int, rank: int) -> int:
    return seed * 1_000_003 + step * 1_009 + rank


def apply_rng(sd: dict[str, Any], *, rank: int, world_size: int, seed: int, step: int) -> None:
    """Restore (or deterministically reseed) this rank's generators; CPU first, because
    torch.manual_seed would also reseed CUDA."""
    cpu: torch.Tensor = sd[RNG_CPU]
    row = rng_row(cpu.shape[0], rank=rank, world_size=world_size, same_world_only=False)
    if row is None:
        torch.manual_seed(reseed_value(seed=seed, step=step, rank=rank))
    else:
        torch.set_rng_state(cpu[row].clone())
    if not torch.cuda.is_available():
        return
    cuda: torch.Tensor | None = sd.get(RNG_CUDA)
    row = (
        None
        if cuda is None
        else rng_row(cuda.shape[0], rank=rank, world_size=world_size, same_world_only=True)
    )
    if cuda is None or row is None:
        torch.cuda.manual_seed(reseed_value(seed=seed, step=step, rank=rank))
    else:
        torch.cuda.set_rng_state(cuda[row].clone())


def apply_loaded(
    state: TrainState, sd: dict[str, Any], *, rank: int, world_size: int, seed: int
) -> None:
    """Push a loaded state dict into the live objects."""
    set_state_dict(
        state.model, state.optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"]
    )
    state.scheduler.load_state_dict(sd["scheduler"])
    state.step = int(sd["train"]["step"])
    state.samples = int(sd["train"]["samples"])
    apply_rng(sd, rank=rank, world_size=world_size, seed=seed, step=state.step)

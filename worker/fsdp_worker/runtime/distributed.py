"""Process-group setup and teardown for one torchrun worker: gloo on CPU, NCCL on CUDA.

It owns the device mesh and a separate gloo group for checkpoint coordination (async saves run
collectives on a background thread; they must not share a group with training collectives).
It must not know about models, data or checkpoints.
"""

from __future__ import annotations

import datetime
import logging
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from fsdp_worker.contract import environment

# Long enough for a slow checkpoint on a shared volume; a dead peer still surfaces as an error.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    mesh: DeviceMesh
    ckpt_group: dist.ProcessGroup


# Read before the gang forms, torch-free (contract/environment.py): kept here for the kit.
env_world_size = environment.env_world_size
env_rank = environment.env_rank


def init() -> DistInfo:
    """Join the torchrun gang and build the 1-D data-parallel mesh."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "cpu:gloo,cuda:nccl"  # async DCP saves need a CPU backend
    else:
        device = torch.device("cpu")
        backend = "gloo"
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29500")
        os.environ.setdefault("RANK", "0")
        os.environ.setdefault("WORLD_SIZE", "1")
        dist.init_process_group(backend=backend, timeout=COLLECTIVE_TIMEOUT)
    world = dist.get_world_size()
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("dp",))
    ckpt_group = dist.new_group(backend="gloo", timeout=COLLECTIVE_TIMEOUT)
    assert isinstance(ckpt_group, dist.ProcessGroup)  # every rank is in it
    log.info(
        "rank %d of %d on device %s, backend %s, torch %s",
        dist.get_rank(),
        world,
        device,
        dist.get_backend(),
        torch.__version__,
    )
    return DistInfo(
        rank=dist.get_rank(),
        world_size=world,
        local_rank=local_rank,
        device=device,
        mesh=mesh,
        ckpt_group=ckpt_group,
    )


def destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()

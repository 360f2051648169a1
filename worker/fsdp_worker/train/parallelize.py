"""FSDP2 sharding: `fully_shard` on each block, then the head, then the root, in that order.

Also applies the mixed-precision policy and activation checkpointing. FSDP averages gradients
over ranks (a custom divide factor needs PREMUL_SUM, which gloo lacks), so the trainer scales
its loss by the world size. It must not build, initialise or checkpoint models.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from fsdp_worker.contract import config

_DTYPES = {config.Precision.FP32: torch.float32, config.Precision.BF16: torch.bfloat16}


def mp_policy(precision: config.PrecisionConfig) -> MixedPrecisionPolicy:
    return MixedPrecisionPolicy(
        param_dtype=_DTYPES[precision.param], reduce_dtype=_DTYPES[precision.reduce]
    )


def _blocks(model: nn.Module) -> list[nn.Module]:
    blocks = getattr(model, "blocks", None)
    return list(blocks) if isinstance(blocks, Iterable) else []


def apply_activation_checkpointing(model: nn.Module) -> None:
    """Recompute each block's activations in backward instead of keeping them."""
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, nn.ModuleList):
        return
    for i, block in enumerate(blocks):
        if hasattr(block, "checkpoint_activations"):
            block.checkpoint_activations = True  # type: ignore[assignment]  # same FQNs
        else:
            blocks[i] = checkpoint_wrapper(block)  # DCP's state-dict helpers strip the prefix


def shard(
    model: nn.Module, *, mesh: DeviceMesh, precision: config.PrecisionConfig, ac: bool
) -> FSDPModule:
    """Shard in place and return the root FSDP module."""
    if ac:
        apply_activation_checkpointing(model)
    policy = mp_policy(precision)
    for block in _blocks(model):
        fully_shard(block, mesh=mesh, mp_policy=policy)
    head = getattr(model, "head", None)
    if isinstance(head, nn.Module):
        fully_shard(head, mesh=mesh, mp_policy=policy)
    return fully_shard(model, mesh=mesh, mp_policy=policy)


def fsdp_units(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]

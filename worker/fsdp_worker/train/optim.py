"""AdamW and the warmup + constant/cosine learning-rate schedule from the config.

The schedule is a pure function of the step, so a resumed run continues the same curve.
This module must not touch data, checkpoints or process groups.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from fsdp_worker.contract import config


def build_optimizer(model: nn.Module, cfg: config.OptimizerConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(
        model.parameters(),
        lr=cfg.lr,
        betas=(cfg.beta1, cfg.beta2),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        foreach=True,
    )


def lr_factor(step: int, *, cfg: config.SchedulerConfig, total_steps: int) -> float:
    """Multiplier of the peak LR at `step` (0-based count of completed steps)."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    if cfg.kind is config.SchedulerKind.CONSTANT:
        return 1.0
    span = max(total_steps - cfg.warmup_steps, 1)
    progress = min((step - cfg.warmup_steps) / span, 1.0)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * cosine


def build_scheduler(optimizer: torch.optim.Optimizer, *, cfg: config.TrainingConfig) -> LambdaLR:
    return LambdaLR(optimizer, lambda s: lr_factor(s, cfg=cfg.scheduler, total_steps=cfg.steps))

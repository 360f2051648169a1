"""The model: a built-in decoder-only transformer sized by `ModelConfig`, or a user factory.

Built-in models are created on the meta device and initialised after sharding by
`init_weights`, from a seeded generator over full tensors, so the initial weights do not depend
on the world size. A user factory may build on the meta device too (`meta_template`,
`materialize`): each module is then initialised by its own `reset_parameters()` on a CPU twin
holding only that module's parameters and buffers, seeded by (seed, module name), and each rank
keeps its shard, so no rank ever holds the whole model unsharded. This module must not shard,
checkpoint or read data.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import pydantic
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor
from torch.utils.checkpoint import checkpoint

from fsdp_worker.contract import config, errors


@dataclass(frozen=True)
class Dims:
    dim: int
    n_layers: int
    n_heads: int


PRESETS: dict[config.ModelPreset, Dims] = {
    config.ModelPreset.TINY: Dims(dim=32, n_layers=2, n_heads=2),
    config.ModelPreset.SMALL: Dims(dim=256, n_layers=4, n_heads=4),
    config.ModelPreset.B1: Dims(dim=2048, n_layers=18, n_heads=16),
    config.ModelPreset.B7: Dims(dim=4096, n_layers=32, n_heads=32),
}


def dims_for(cfg: config.ModelConfig) -> Dims:
    """The preset's dimensions, or the custom ones; ConfigError names a missing field."""
    if cfg.preset is not config.ModelPreset.CUSTOM:
        return PRESETS[cfg.preset]
    for field in ("dim", "n_layers", "n_heads"):
        if getattr(cfg, field) is None:
            camel = pydantic.alias_generators.to_camel(field)
            raise errors.ConfigError(f"training.model.{camel} is required when preset is custom")
    dims = Dims(
        dim=cast(int, cfg.dim), n_layers=cast(int, cfg.n_layers), n_heads=cast(int, cfg.n_heads)
    )
    if dims.dim % dims.n_heads:
        raise errors.ConfigError(
            f"training.model.dim={dims.dim} must be a multiple of nHeads={dims.n_heads}"
        )
    return dims


class Block(nn.Module):
    """Pre-norm attention + SwiGLU-free MLP block; optional activation checkpointing."""

    def __init__(self, dims: Dims) -> None:
        super().__init__()
        self.n_heads = dims.n_heads
        self.attn_norm = nn.RMSNorm(dims.dim)
        self.qkv = nn.Linear(dims.dim, 3 * dims.dim, bias=False)
        self.proj = nn.Linear(dims.dim, dims.dim, bias=False)
        self.mlp_norm = nn.RMSNorm(dims.dim)
        self.up = nn.Linear(dims.dim, 4 * dims.dim, bias=False)
        self.down = nn.Linear(4 * dims.dim, dims.dim, bias=False)
        self.checkpoint_activations = False

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.n_heads, d // self.n_heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        out: torch.Tensor = x + self.down(F.gelu(self.up(self.mlp_norm(x))))
        return out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.checkpoint_activations and self.training:
            return checkpoint(self._forward, x, use_reentrant=False)
        return self._forward(x)


class Transformer(nn.Module):
    """Token + learned position embeddings, `blocks`, final norm, `head` (the FSDP units)."""

    def __init__(self, *, dims: Dims, vocab_size: int, seq_len: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab_size, dims.dim)
        self.pos = nn.Embedding(seq_len, dims.dim)
        self.blocks = nn.ModuleList(Block(dims) for _ in range(dims.n_layers))
        self.norm = nn.RMSNorm(dims.dim)
        self.head = nn.Linear(dims.dim, vocab_size, bias=False)
        self.n_layers = dims.n_layers

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.tok(tokens) + self.pos(positions)
        for block in self.blocks:
            x = block(x)
        return cast(torch.Tensor, self.head(self.norm(x)))

    def init_weights(self, *, seed: int) -> None:
        """Deterministic, world-size-independent init of (possibly sharded) parameters."""
        gen = torch.Generator().manual_seed(seed)
        out_std = 0.02 / math.sqrt(2 * self.n_layers)
        with torch.no_grad():
            for name, param in self.named_parameters():
                if name.endswith("norm.weight"):
                    full = torch.ones(param.shape)
                else:
                    std = out_std if name.endswith(("proj.weight", "down.weight")) else 0.02
                    full = torch.empty(param.shape).normal_(0.0, std, generator=gen)
                _assign(param, full.to(param.dtype))


def _assign(param: torch.Tensor, full: torch.Tensor) -> None:
    if isinstance(param, DTensor):
        local = distribute_tensor(full.to(param.device), param.device_mesh, param.placements)
        param.copy_(local)
    else:
        param.copy_(full.to(param.device))


def load_factory(path: str) -> Callable[[config.TrainingConfig], nn.Module]:
    """Resolve 'pkg.module:function'; ConfigError names the field on failure."""
    module_name, _, attr = path.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise errors.ConfigError(
            f"training.model.factory={path!r} cannot be imported: {exc}"
        ) from exc
    if not callable(fn):
        raise errors.ConfigError(f"training.model.factory={path!r} is not callable")
    return cast(Callable[[config.TrainingConfig], nn.Module], fn)


def build(cfg: config.TrainingConfig) -> nn.Module:
    """The built-in transformer on the meta device, or the user's model as it returns it.

    A factory receives the TrainingConfig and returns an nn.Module mapping int64 tokens
    [batch, seq] to logits [batch, seq, vocab]; optional `blocks` (iterable of modules) and
    `head` attributes become separate FSDP units. It may build under `torch.device("meta")`
    (see `meta_template`).
    """
    if cfg.model.factory:
        torch.manual_seed(cfg.seed)
        return load_factory(cfg.model.factory)(cfg)
    dims = dims_for(cfg.model)
    with torch.device("meta"):
        return Transformer(dims=dims, vocab_size=cfg.model.vocab_size, seq_len=cfg.model.seq_len)


def meta_template(net: nn.Module, *, factory: str | None) -> nn.Module | None:
    """For a user model built on the meta device: an unsharded meta copy to initialise from
    (free: meta tensors hold no data), after checking that every module with parameters or
    buffers can initialise itself. None for the built-in model and for a user model built on
    a device."""
    if isinstance(net, Transformer):
        return None
    on_meta = [p.is_meta for p in net.parameters()]
    if not any(on_meta):
        return None
    field = f"training.model.factory={factory!r}"
    if not all(on_meta):
        raise errors.ConfigError(f"{field}: the model has parameters both on and off meta")
    for name, module in net.named_modules():
        if _needs_init(module) and not callable(getattr(module, "reset_parameters", None)):
            raise errors.ConfigError(
                f"{field}: {_label(name, module)} has parameters or buffers on the meta device "
                "but no reset_parameters() to initialise them; add one or build the model on CPU"
            )
    return copy.deepcopy(net)


def _needs_init(module: nn.Module) -> bool:
    """Has the module parameters or buffers of its own (not its children's) to initialise?"""
    return any(True for _ in module.parameters(recurse=False)) or any(
        True for _ in module.buffers(recurse=False)
    )


def _label(name: str, module: nn.Module) -> str:
    return f"module {name or '(root)'!r} ({type(module).__name__})"


def module_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & (2**63 - 1)


def materialize(
    model: nn.Module, *, device: torch.device, seed: int, template: nn.Module | None = None
) -> None:
    """Allocate meta parameters on `device` and initialise them (after sharding). `template`
    is `meta_template`'s copy for a user model built on meta; its modules are initialised one
    at a time (collective: every rank walks the same modules in the same order). A module's
    `reset_parameters()` must fill its buffers too (as BatchNorm's does); a floating-point
    buffer it leaves unset (still NaN) is a ConfigError naming it."""
    if isinstance(model, Transformer):
        model.to_empty(device=device)
        model.init_weights(seed=seed)
        return
    if template is None:
        return
    model.to_empty(device=device)
    live = dict(model.named_modules())
    with torch.no_grad():
        for name, twin in template.named_modules():
            if not _needs_init(twin):
                continue
            twin.to_empty(device="cpu", recurse=False)
            for buf in twin.buffers(recurse=False):
                if buf.is_floating_point():
                    buf.fill_(math.nan)
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(module_seed(seed, name))
                twin.reset_parameters()
            buffers = dict(twin.named_buffers(recurse=False))  # reset may have replaced them
            for bname, buf in buffers.items():
                if buf.is_floating_point() and bool(buf.isnan().any()):
                    raise errors.ConfigError(
                        f"training.model.factory: {_label(name, twin)}: reset_parameters() "
                        f"left buffer {bname!r} unset; it must fill the module's buffers too"
                    )
            for pname, value in [*twin.named_parameters(recurse=False), *buffers.items()]:
                _assign(getattr(live[name], pname), value.detach())
            twin.to_empty(device="meta", recurse=False)

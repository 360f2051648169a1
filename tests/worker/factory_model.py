"""A user model factory for the worker tests: `factory_model:build` (not a test module)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(dim, dim), nn.GELU()) for _ in range(2))
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block(x)
        out: torch.Tensor = self.head(x)
        return out


def build(cfg: Any) -> nn.Module:
    return Tiny(cfg.model.vocab_size, 24)


def build_on_meta(cfg: Any) -> nn.Module:
    """The same model built on the meta device: the worker initialises it module by module."""
    with torch.device("meta"):
        return Tiny(cfg.model.vocab_size, 24)


class Scaled(Tiny):
    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__(vocab, dim)
        self.scale = nn.Parameter(torch.ones(1))  # and no reset_parameters() to set it

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return super().forward(tokens) * self.scale


def build_on_meta_uninitialisable(cfg: Any) -> nn.Module:
    with torch.device("meta"):
        return Scaled(cfg.model.vocab_size, 24)


class Scaler(nn.Module):
    """A module with a buffer that its reset_parameters() fills (like BatchNorm's stats)."""

    def __init__(self, dim: int, *, fills: bool = True) -> None:
        super().__init__()
        self.fills = fills
        self.register_buffer("gain", torch.empty(dim))

    def reset_parameters(self) -> None:
        if self.fills:
            self.gain.copy_(torch.linspace(0.5, 1.5, self.gain.numel()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gain


class WithBuffer(Tiny):
    def __init__(self, vocab: int, dim: int, *, fills: bool = True) -> None:
        super().__init__(vocab, dim)
        self.scaler = Scaler(dim, fills=fills)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = x + block(x)
        out: torch.Tensor = self.head(self.scaler(x))
        return out


def build_on_meta_with_buffer(cfg: Any) -> nn.Module:
    with torch.device("meta"):
        return WithBuffer(cfg.model.vocab_size, 24)


def build_on_meta_with_unfilled_buffer(cfg: Any) -> nn.Module:
    with torch.device("meta"):
        return WithBuffer(cfg.model.vocab_size, 24, fills=False)

"""Deterministic, resumable data: a global sample cursor that does not depend on world size.

Sample `i` of the stream is a pure function of `i` (and the seed or file). A step consumes
global samples [cursor, cursor + globalBatch); pass `a` of rank `r` of world `W` with micro
batch `m` takes samples cursor + (a*W + r)*m ... + m - 1, so every world size consumes exactly
the same global batch per step (the plan: contract/batch.py). This module must not know about
models or process groups.
"""

from __future__ import annotations

import os
from typing import Protocol

import numpy as np
import torch

from fsdp_worker.contract import batch, config, errors


class Source(Protocol):
    """seq_len + 1 tokens for global sample `index` (inputs are [:-1], targets [1:])."""

    def sample(self, index: int) -> torch.Tensor: ...


class SyntheticSource:
    """A learnable stream: each sample is an arithmetic progression mod vocab, with a
    start and stride drawn from a generator seeded by (seed, index)."""

    def __init__(self, *, seed: int, vocab_size: int, seq_len: int) -> None:
        self.seed, self.vocab, self.seq_len = seed, vocab_size, seq_len

    def sample(self, index: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        start, stride = torch.randint(0, self.vocab, (2,), generator=gen).tolist()
        steps = torch.arange(self.seq_len + 1, dtype=torch.int64)
        out: torch.Tensor = (start + (stride % 7 + 1) * steps) % self.vocab
        return out


class TokenFileSource:
    """A flat memmap of uint16/uint32 tokens; sample i is window (i mod n) of seq_len+1 tokens
    starting at (i mod n) * seq_len, so a file of N tokens holds n = (N-1)//seq_len samples and
    the stream wraps around at epoch boundaries."""

    def __init__(self, *, path: str, dtype: str, vocab_size: int, seq_len: int) -> None:
        if not os.path.isfile(path):
            raise errors.ConfigError(f"training.data.path={path!r} is not a readable file")
        self.tokens = np.memmap(path, dtype=np.dtype(dtype), mode="r")
        self.seq_len, self.vocab = seq_len, vocab_size
        self.n_samples = (len(self.tokens) - 1) // seq_len
        if self.n_samples < 1:
            raise errors.ConfigError(
                f"training.data.path={path!r} holds {len(self.tokens)} tokens; at least "
                f"seqLen+1={seq_len + 1} are needed"
            )

    def sample(self, index: int) -> torch.Tensor:
        start = (index % self.n_samples) * self.seq_len
        window = np.asarray(self.tokens[start : start + self.seq_len + 1], dtype=np.int64)
        return torch.from_numpy(window) % self.vocab


def make_source(cfg: config.TrainingConfig) -> Source:
    if cfg.data.kind is config.DataKind.TOKEN_FILE:
        assert cfg.data.path is not None  # the config validator guarantees it
        return TokenFileSource(
            path=cfg.data.path,
            dtype=cfg.data.dtype,
            vocab_size=cfg.model.vocab_size,
            seq_len=cfg.model.seq_len,
        )
    return SyntheticSource(
        seed=cfg.data.seed, vocab_size=cfg.model.vocab_size, seq_len=cfg.model.seq_len
    )


def micro_batch(
    source: Source, *, plan: batch.Plan, cursor: int, accum_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets, [micro, seq_len] each."""
    rows = torch.stack(
        [source.sample(i) for i in plan.indices(cursor=cursor, accum_index=accum_index)]
    )
    return rows[:, :-1], rows[:, 1:]

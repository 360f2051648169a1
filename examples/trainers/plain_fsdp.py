"""A team's own FSDP2 + DCP training script, kept under the operator with the trainer kit.

Everything about the model, data and loop is the script's own; the kit (fsdp_worker.kit) does
what docs/contract.md asks: resume from the checkpoint the operator chose (at any world size),
report progress for hang detection, save sealed checkpoints with the fence, save on SIGTERM,
and exit with the documented code and termination message.

Run by an FSDPJob with `spec.trainer.script: /opt/fsdp-examples/plain_fsdp.py`; it reads
`spec.training.steps`, `globalBatchSize`, `seed` and `optimizer.lr`, and its own arguments
`--width` and `--step-seconds`.
Deterministic: sample i of the stream is drawn from seed + i, so a resumed run sees exactly the
samples an uninterrupted one would, and logs the same losses.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from fsdp_worker import kit

log = logging.getLogger("plain_fsdp")
VOCAB, SEQ = 64, 16


class Model(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.LayerNorm(width), nn.Linear(width, width), nn.GELU()) for _ in range(2)
        )
        self.head = nn.Linear(width, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.blocks:
            h = h + block(h)
        logits: torch.Tensor = self.head(h)
        return logits


def sample(seed: int, index: int) -> torch.Tensor:
    """Sample `index` of the stream: SEQ + 1 tokens, the same at every world size."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    return torch.randint(0, VOCAB, (SEQ + 1,), generator=gen)


def train(run: kit.Run) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--width", type=int, default=32)
    # The pace of a real model's step, for demos and tests on a laptop: at least this long.
    parser.add_argument("--step-seconds", type=float, default=0.0)
    args = parser.parse_args()
    training = run.config.training
    rank, world = run.dist.rank, run.dist.world_size
    batch = training.global_batch_size
    if batch % world:
        raise kit.ConfigError(f"globalBatchSize={batch} must divide by the world size {world}")
    torch.manual_seed(training.seed)  # the same initial weights on every rank
    model = Model(args.width)
    for block in model.blocks:
        fully_shard(block, mesh=run.dist.mesh)
    fully_shard(model, mesh=run.dist.mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=training.optimizer.lr)
    state = {"app": kit.ModelState(model, optimizer)}
    point = run.resume(state)
    step = point.step if point else 0
    while step < training.steps:
        began = time.monotonic()
        mine = range(
            step * batch + rank * (batch // world), step * batch + (rank + 1) * (batch // world)
        )
        data = torch.stack([sample(training.seed, i) for i in mine])
        logits = model(data[:, :-1])
        loss = nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), data[:, 1:].reshape(-1), reduction="sum"
        ) / (batch * SEQ)
        (loss * world).backward()  # type: ignore[no-untyped-call]  # FSDP averages over ranks
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        total = loss.detach().clone()
        dist.all_reduce(total)
        step += 1
        time.sleep(max(0.0, args.step_seconds - (time.monotonic() - began)))
        if rank == 0:
            log.info("step %s", json.dumps({"step": step, "loss": float(total)}))
        run.after_step(
            step, samples=step * batch, state=state, loss=float(total), final=step == training.steps
        )


if __name__ == "__main__":
    sys.exit(kit.main(train))

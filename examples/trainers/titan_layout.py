"""A trainer that knows nothing of fsdp-operator: FSDP2 with DCP checkpoints in torchtitan's
layout, `<dump folder>/<folder>/step-<N>/`, where DCP writes `.metadata` after every rank's
files. On start it loads the newest `step-<N>` that has a `.metadata`, as torchtitan's
CheckpointManager does (`_find_load_step`); it keeps the newest `--keep-latest-k`.

No marker, no metrics, no termination message, no SIGTERM save: an FSDPJob runs it with
`spec.checkpoint.completion: DCPMetadata` (docs/contract.md says what that mode cannot check).
It reads torchrun's RANK/WORLD_SIZE only; its checkpoint folder comes from its arguments
(`--dump-folder $(FSDP_CHECKPOINT_ROOT)` in `spec.trainer.args`).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

VOCAB, SEQ = 64, 16


def newest_step(folder: str) -> int | None:
    """torchtitan's rule: the largest step-N directory that holds a `.metadata`."""
    if not os.path.isdir(folder):
        return None
    steps = [
        int(m.group(1))
        for name in os.listdir(folder)
        if (m := re.fullmatch(r"step-(\d+)", name))
        and os.path.isfile(os.path.join(folder, name, ".metadata"))
    ]
    return max(steps, default=None)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--dump-folder", required=True)
    p.add_argument("--folder", default="checkpoint")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--interval", type=int, default=10)
    p.add_argument("--keep-latest-k", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--step-seconds", type=float, default=0.0)  # a real model's pace, for demos
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    folder = os.path.join(args.dump_folder, args.folder)
    torch.manual_seed(args.seed)
    model = nn.Sequential(
        nn.Embedding(VOCAB, 32), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, VOCAB)
    )
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    step = 0
    start = newest_step(folder)
    if start is not None:
        model_sd, optim_sd = get_state_dict(model, optimizer)
        state: dict[str, Any] = {
            "model": model_sd,
            "optimizer": optim_sd,
            "train_state": {"step": torch.tensor(0)},
        }
        state_dict_loader.load(state, checkpoint_id=os.path.join(folder, f"step-{start}"))
        set_state_dict(
            model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"]
        )
        step = int(state["train_state"]["step"])
        print(f"rank {rank}: loaded the checkpoint from {folder}/step-{start}", flush=True)
    while step < args.steps:
        began = time.monotonic()
        gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step * world + rank)
        data = torch.randint(0, VOCAB, (args.batch // world, SEQ + 1), generator=gen)
        loss = nn.functional.cross_entropy(
            model(data[:, :-1]).reshape(-1, VOCAB), data[:, 1:].reshape(-1)
        )
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        time.sleep(max(0.0, args.step_seconds - (time.monotonic() - began)))
        if rank == 0:
            print(f"step {step} loss {float(loss):.4f}", flush=True)
        if step % args.interval == 0 or step == args.steps:
            model_sd, optim_sd = get_state_dict(model, optimizer)
            state = {
                "model": model_sd,
                "optimizer": optim_sd,
                "train_state": {"step": torch.tensor(step)},
            }
            state_dict_saver.save(state, checkpoint_id=os.path.join(folder, f"step-{step}"))
            if rank == 0 and args.keep_latest_k > 0:
                done = sorted(
                    int(m.group(1))
                    for n in os.listdir(folder)
                    if (m := re.fullmatch(r"step-(\d+)", n))
                )
                for old in done[: -args.keep_latest_k]:
                    shutil.rmtree(os.path.join(folder, f"step-{old}"), ignore_errors=True)
    # Every rank done before any tears gloo down: one leaving early aborted a peer still in
    # its last collective ("terminate called without an active exception", seen under load).
    dist.barrier()
    dist.destroy_process_group()
    # Seen once more under load after both: rank 0 aborted (SIGABRT, the same message) while
    # the interpreter shut down, as gloo's threads let go of the work they held (PyTorch's
    # pull 179291 describes that crash). Everything is saved and torn down: leave without it.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

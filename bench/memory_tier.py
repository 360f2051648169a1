"""The memory tier against the claim, on the same state, in one run: the blocking save and the
same-size load of a restart in place. Numbers, not pass/fail.

    PYTHONPATH=. .venv/bin/python bench/memory_tier.py [--dim 1024 --layers 8] [--reps 5]

One torchrun gang of 2 CPU ranks (gloo) builds bench/worker_ckpt.py's model (1.13 GiB of model
and AdamW state at the defaults). Each repetition trains a step, then saves it both ways in a
rotating order: to the claim (a sync save, O_DIRECT banded files fsync'd under a marker, the
production default) and to memory (memtier.MemoryTier: each rank's own files in one tmpfs
directory, as a pod of 2 ranks has its emptyDir of medium Memory, sealed by local rank 0).
Then it loads both, rotating: the claim from a cold page cache (as after a restart), memory
from tmpfs (a restart in place: the new ranks read the pod's memory volume). Beside them, the
memory tier with peer copies (checkpoint.memory.peerCopy), each rank standing for a node of
its own with its own volume: its save (own files, then the ring's transfer of each rank's
files to the other), and the load of a rank whose node's volume was emptied (a spare in a lost
node's place): offer, the copy sent back, then the load. Medians and min..max go to
bench/results/memory_tier.json; every temporary file is removed.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import worker_ckpt as wc

RESULTS = wc.RESULTS / "memory_tier.json"
GOAL_LOAD_SECONDS = 0.3  # issue 23: a same-size load from memory


def _timed(into: list[float], fn: Callable[[], object]) -> None:
    """Seconds of `fn` on the slowest rank (barriers before and after)."""
    import torch.distributed as dist

    dist.barrier()
    t0 = time.monotonic()
    fn()
    dist.barrier()
    into.append(time.monotonic() - t0)


def _prune(root: str, *, keep: str) -> None:
    for old in Path(root).glob("step-*"):
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)


def _inner(cfg_doc: dict[str, Any], memory_base: str, out_path: str, reps: int) -> None:
    import torch.distributed as dist

    from fsdp_worker.checkpointing import checkpoint, memtier, resume, state
    from fsdp_worker.contract import catalog
    from fsdp_worker.runtime import distributed

    di, st, meters, manager, _fwd_bwd, train_step = wc._build(cfg_doc, async_=False, attempt=1)
    claim = manager(checkpoint.SaveMode.SYNC)
    ident = checkpoint.Identity(1, None, claim.identity.config_hash, 2)
    tier = memtier.MemoryTier(memory_base, identity=ident, dist_info=di, meters=meters)
    # Each rank a node of its own (its own volume, its own local rank 0), copies on.
    own_node = f"{memory_base}/node-{di.rank}"
    peer = memtier.MemoryTier(
        own_node,
        identity=ident,
        dist_info=dataclasses.replace(di, local_rank=0),
        meters=meters,
        peer_copy=True,
        local_world=1,
    )
    keys = ("claim_save", "memory_save", "memory_save_peer", "claim_load", "memory_load")
    out: dict[str, list[float]] = {
        k: [] for k in (*keys, "memory_copy_peer", "memory_load_from_peer")
    }

    def save_memory() -> None:
        tier.save(
            st.step, samples=st.samples, make_state=lambda: state.to_save(st, group=di.ckpt_group)
        )

    def save_peer() -> None:
        """Its blocking part (the copies travel in the background), then until they landed."""
        t0 = time.monotonic()
        _timed(
            out["memory_save_peer"],
            lambda: peer.save(
                st.step,
                samples=st.samples,
                make_state=lambda: state.to_save(st, group=di.ckpt_group),
            ),
        )
        peer.join_copies()
        dist.barrier()
        out["memory_copy_peer"].append(time.monotonic() - t0)

    def load_from_peer() -> None:
        offer = peer.offer()
        held = peer.choose(offer, None)
        assert offer is not None and offer.from_peers == (1,) and held is not None, offer
        point = resume.ResumePoint(
            peer.rank_path(held[0]), held[0], di.world_size, held[1], 2, memory=True
        )
        resume.load(point, st, dist_info=di, seed=0)

    train_step()
    claim.save(st)  # warm-up of every path
    save_memory()
    save_peer()
    for values in out.values():
        values.clear()  # the warm-up's
    for rep in range(reps):
        train_step()
        saves: list[Callable[[], None]] = [
            lambda: _timed(out["claim_save"], lambda: claim.save(st)),
            lambda: _timed(out["memory_save"], save_memory),
            save_peer,
        ]
        for fn in saves[rep % 3 :] + saves[: rep % 3]:
            fn()
        step = st.step
        path = f"{claim.root}/{catalog.step_dir_name(step)}"
        marker = catalog.Marker.from_json(Path(path, catalog.MARKER_NAME).read_bytes())
        points = {
            "claim_load": resume.ResumePoint(
                path, step, marker.world_size, marker.samples_consumed, 2
            ),
            "memory_load": resume.ResumePoint(
                tier.rank_path(step), step, di.world_size, st.samples, 2, memory=True
            ),
        }
        loads = list(points)
        for key in loads[rep % 2 :] + loads[: rep % 2]:
            if key == "claim_load" and di.rank == 0:
                os.sync()
                wc._settle(path)
                wc._drop_cache(path)
            dist.barrier()
            t0 = time.monotonic()
            resume.load(points[key], st, dist_info=di, seed=0)
            dist.barrier()
            out[key].append(time.monotonic() - t0)
        if di.rank == 1:  # its node's volume is new: a spare in a lost node's place
            shutil.rmtree(own_node)
            os.makedirs(own_node)
        _timed(out["memory_load_from_peer"], load_from_peer)
        if di.rank == 0:  # keep the claim to the newest step: the disk is small
            _prune(claim.root, keep=catalog.step_dir_name(step))
    if di.rank == 0:
        out["bytes"] = [float(sum(catalog.LocalStorage(claim.root).list_files(path).values()))]
        Path(out_path).write_text(json.dumps(out))
    distributed.destroy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inner", action="store_true")
    parser.add_argument("--config")
    parser.add_argument("--memory")
    parser.add_argument("--out")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if args.inner:
        _inner(json.loads(Path(args.config).read_text()), args.memory, args.out, args.reps)
        return
    work = Path(tempfile.mkdtemp(prefix="memtier-bench-", dir=args.workdir))
    memory = Path(tempfile.mkdtemp(prefix="memtier-bench-", dir="/dev/shm"))
    try:
        cfg = wc._config(args, work / "ckpt")
        cfg_path, raw_path = work / "config.json", work / "raw.json"
        cfg_path.write_text(json.dumps(cfg))
        started = time.monotonic()
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(wc.REPO / "worker"))
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node=2",
            __file__,
            "--inner",
            "--config",
            str(cfg_path),
            "--memory",
            str(memory),
            "--out",
            str(raw_path),
            "--reps",
            str(args.reps),
        ]
        subprocess.run(cmd, env=env, check=True)
        raw = json.loads(raw_path.read_text())
        size = raw.pop("bytes")[0]
        stats = {k: wc._stats(v) for k, v in raw.items()}
        summary = {
            "what": "2 CPU ranks (gloo), one process each; claim: sync O_DIRECT banded save, "
            "fsync'd, marker; memory: memtier on tmpfs (one pod's volume); memory_*_peer: each "
            "rank a node of its own with peer copies: the save's blocking part, and until its "
            "copies landed (copy); the load one of a rank whose volume was emptied (its copy "
            "sent back first); loads: same size, the claim's from a cold page cache",
            "bytes": size,
            "reps": args.reps,
            "model": {"dim": args.dim, "layers": args.layers},
            "seconds": stats,
            "load_goal_seconds": GOAL_LOAD_SECONDS,
            "memory_load_met": stats["memory_load"]["median"] <= GOAL_LOAD_SECONDS,
            "benchSeconds": round(time.monotonic() - started, 1),
            "cpus": os.cpu_count(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        RESULTS.write_text(json.dumps(summary, indent=2) + "\n")
        print(f"{size / 2**30:.2f} GiB of state, world size 2, {args.reps} repetitions:")
        for key, s in stats.items():
            print(f"  {key:12s} median {s['median']:.3f}s  ({s['min']:.3f}..{s['max']:.3f})")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(memory, ignore_errors=True)


if __name__ == "__main__":
    main()

"""Checkpoint benchmark for the worker: async blocking vs sync save, sync save vs the disk's
fsync'd sequential-write bandwidth, resharded vs same-size load. Numbers, not pass/fail.

    .venv/bin/python bench/worker_ckpt.py [--dim 1024 --layers 8] [--workdir /tmp/...]

Runs two torchrun gangs on CPU (gloo): world size 1 writes the checkpoint to reshard from;
world size 2 saves (sync x2, async x2) and loads both checkpoints. Results go to
bench/results/worker_ckpt.{json,md}; every large temporary file is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
GOALS = {"async_blocking_over_sync": 0.10, "sync_over_bandwidth": 0.6, "reshard_over_same": 1.25}


def _config(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    return {
        "training": {
            "steps": 100,
            "globalBatchSize": 2,
            "microBatchSize": 1,
            "model": {
                "preset": "custom",
                "dim": args.dim,
                "nLayers": args.layers,
                "nHeads": 8,
                "seqLen": 32,
                "vocabSize": 256,
            },
        },
        "checkpoint": {"root": str(root), "intervalSteps": 1000, "keep": 100},
    }


# --- inside torchrun ------------------------------------------------------------------------


def _build(cfg_doc: dict[str, Any], *, async_: bool, attempt: int) -> Any:
    import torch

    from fsdp_worker import checkpoint, config, distributed, metrics, model, optim, parallelize
    from fsdp_worker import state as state_mod

    cfg = config.WorkerConfig.parse(cfg_doc)
    tcfg = cfg.training
    di = distributed.init()
    net = model.build(tcfg)
    parallelize.shard(net, mesh=di.mesh, precision=tcfg.precision, ac=False)
    model.materialize(net, device=di.device, seed=0)
    opt = optim.build_optimizer(net, tcfg.optimizer)
    st = state_mod.TrainState(net, opt, optim.build_scheduler(opt, cfg=tcfg))
    meters = metrics.Metrics()
    ident = checkpoint.Identity(attempt, None, tcfg.resume_hash(), tcfg.global_batch_size)

    def manager(mode: checkpoint.SaveMode) -> checkpoint.CheckpointManager:
        return checkpoint.CheckpointManager(
            root=cfg.checkpoint.root,
            keep=100,
            mode=mode,
            identity=ident,
            dist_info=di,
            meters=meters,
        )

    def fwd_bwd() -> None:
        tokens = torch.randint(0, 256, (1, 32))
        net(tokens).float().mean().backward()

    def train_step() -> None:
        fwd_bwd()
        opt.step()
        opt.zero_grad(set_to_none=True)
        st.step += 1

    return di, st, meters, manager, fwd_bwd, train_step


def _inner_reference(cfg_doc: dict[str, Any]) -> None:
    from fsdp_worker import checkpoint, distributed

    _di, st, _m, manager, _fb, train_step = _build(cfg_doc, async_=False, attempt=1)
    train_step()  # Adam state exists from here on
    manager(checkpoint.SaveMode.SYNC).save(st)
    distributed.destroy()


def _gauge(meters: Any, kind: str) -> float:
    from fsdp_worker import contract

    value = meters.registry.get_sample_value(contract.METRIC_CKPT_SAVE_SECONDS, {"kind": kind})
    return float(value)


def _drop_cache(directory: str) -> None:
    """Evict a (fsync'd, hence clean) checkpoint from the page cache: loads read the disk."""
    for name in os.listdir(directory):
        fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed(fn: Any) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def _inner_saves(ctx: tuple[Any, ...], out: dict[str, Any]) -> None:
    """Pairs of (fsync'd dd write, sync save) under the same load; then async saves."""
    import torch.distributed as dist

    from fsdp_worker import catalog, checkpoint

    di, st, meters, manager, fwd_bwd, train_step = ctx
    sync = manager(checkpoint.SaveMode.SYNC)
    root = sync.root
    train_step()
    sync.save(st)  # warm-up; also gives the size
    out["bytes"] = size = sum(
        catalog.LocalStorage(root).list_files(f"{root}/step-{st.step}").values()
    )
    dd, world = Path(root, "dd.bin"), di.world_size
    for _ in range(3):
        if di.rank == 0:
            out["dd1"].append(size / _timed(lambda: _write_file(dd, size)))
            out["dd"].append(size / _timed(lambda: _write_parallel(dd, size, streams=world)))
        train_step()
        dist.barrier()
        out["sync"].append(_timed(lambda: sync.save(st)))
    out["same_step"] = st.step
    asy = manager(checkpoint.SaveMode.ASYNC)
    for _ in range(3):
        train_step()
        dist.barrier()
        out["step_alone"].append(_timed(fwd_bwd))
        st.optimizer.zero_grad(set_to_none=True)
        dist.barrier()
        asy.save(st)
        out["step_overlapped"].append(_timed(fwd_bwd))  # overlaps the copy and the write
        asy.before_optimizer_step()
        asy.wait()
        if di.rank == 0:
            out["async"].append(
                {"blocking": _gauge(meters, "blocking"), "total": _gauge(meters, "total")}
            )
    asy.close(wait=True)


def _inner_main(cfg_doc: dict[str, Any], reshard_from: str, out_path: str) -> None:
    import torch.distributed as dist

    from fsdp_worker import catalog, distributed, resume

    ctx = _build(cfg_doc, async_=False, attempt=2)
    di, st = ctx[0], ctx[1]
    keys = (
        "dd",
        "dd1",
        "sync",
        "async",
        "step_alone",
        "step_overlapped",
        "load_same",
        "load_reshard",
    )
    out: dict[str, Any] = {k: [] for k in keys}
    _inner_saves(ctx, out)
    root = cfg_doc["checkpoint"]["root"]
    points = {}
    for key, path in (
        ("load_same", f"{root}/step-{out['same_step']}"),
        ("load_reshard", reshard_from),
    ):
        m = catalog.Marker.from_json(Path(path, catalog.MARKER_NAME).read_bytes())
        points[key] = resume.ResumePoint(path, m.step, m.world_size, m.samples_consumed, 2)
    for _ in range(2):
        for key, point in points.items():
            if di.rank == 0:
                _drop_cache(point.path)
            dist.barrier()
            t0 = time.monotonic()
            resume.load(point, st, dist_info=di, seed=0)
            dist.barrier()
            out[key].append(time.monotonic() - t0)
    if di.rank == 0:
        Path(out_path).write_text(json.dumps(out))
    distributed.destroy()


# --- outside ---------------------------------------------------------------------------------


def _torchrun(nproc: int, *args: str) -> None:
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // nproc)))
    env["PYTHONPATH"] = str(REPO / "worker")
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
    ]
    subprocess.run([*cmd, __file__, *args], env=env, check=True)


def _write_parallel(path: Path, size: int, *, streams: int) -> None:
    """`streams` concurrent fsync'd sequential writers of size/streams each (like the ranks)."""
    import concurrent.futures as cf

    with cf.ThreadPoolExecutor(streams) as pool:
        parts = [
            pool.submit(_write_file, Path(f"{path}.{i}"), size // streams) for i in range(streams)
        ]
        for part in parts:
            part.result()


def _write_file(path: Path, size: int) -> None:
    """One sequential writer, fsync'd, 8 MiB chunks (what `dd conv=fsync` measures)."""
    chunk = os.urandom(8 * 1024 * 1024)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            left -= f.write(chunk[: min(left, len(chunk))])
        f.flush()
        os.fsync(f.fileno())
    path.unlink()


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def _summarise(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    sync = _median(raw["sync"])
    steady = raw["async"][1:]  # the first async save also allocates the staging buffers
    blocking = _median([a["blocking"] for a in steady])
    # Each sync save is paired with dd runs just before it, under the same load; the
    # denominator is the faster of one stream and one stream per rank (the stricter ratio).
    best = [max(a, b) for a, b in zip(raw["dd"], raw["dd1"], strict=True)]
    paired = [raw["bytes"] / s / bw for s, bw in zip(raw["sync"], best, strict=True)]
    ratios = {
        "async_blocking_over_sync": blocking / sync,
        "sync_over_bandwidth": _median(paired),
        "reshard_over_same": min(raw["load_reshard"]) / min(raw["load_same"]),
    }
    met = {
        k: v >= GOALS[k] if k == "sync_over_bandwidth" else v <= GOALS[k] for k, v in ratios.items()
    }
    return {
        "model": {"dim": args.dim, "layers": args.layers},
        "world_size": 2,
        "checkpoint_bytes": raw["bytes"],
        "sync_save_seconds": raw["sync"],
        "fsync_write_bytes_per_s_one_stream": raw["dd1"],
        "fsync_write_bytes_per_s_one_stream_per_rank": raw["dd"],
        "async_save": raw["async"],
        "fwd_bwd_seconds_alone": raw["step_alone"],
        "fwd_bwd_seconds_overlapping_async_save": raw["step_overlapped"],
        "load_same_seconds": raw["load_same"],
        "load_reshard_from_world1_seconds": raw["load_reshard"],
        "ratios": {k: round(v, 4) for k, v in ratios.items()},
        "goals": GOALS,
        "met": met,
        "machine": f"{os.cpu_count()} CPUs (shared), gloo; loads start from a cold page cache",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _markdown(s: dict[str, Any]) -> str:
    gib = s["checkpoint_bytes"] / 2**30
    r, g = s["ratios"], s["goals"]
    rows = [
        (
            "async blocking / sync save",
            r["async_blocking_over_sync"],
            f"<= {g['async_blocking_over_sync']}",
        ),
        (
            "sync save throughput / fsync'd write bandwidth",
            r["sync_over_bandwidth"],
            f">= {g['sync_over_bandwidth']}",
        ),
        (
            "resharded load (1->2) / same-size load (2->2)",
            r["reshard_over_same"],
            f"<= {g['reshard_over_same']}",
        ),
    ]
    lines = [
        f"Checkpoint of {gib:.2f} GiB (model + AdamW), world size 2, {s['machine']}, {s['when']}.",
        "",
    ]
    lines += ["| ratio | measured | goal |", "| --- | --- | --- |"]
    lines += [f"| {name} | {value:.3f} | {goal} |" for name, value, goal in rows]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inner", choices=["reference", "main"])
    parser.add_argument("--config")
    parser.add_argument("--reshard-from")
    parser.add_argument("--out")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    if args.inner:
        doc = json.loads(Path(args.config).read_text())
        if args.inner == "reference":
            _inner_reference(doc)
        else:
            _inner_main(doc, args.reshard_from, args.out)
        return
    work = Path(tempfile.mkdtemp(prefix="worker-ckpt-bench-", dir=args.workdir))
    try:
        cfg1, cfg2 = work / "w1.json", work / "w2.json"
        cfg1.write_text(json.dumps(_config(args, work / "w1")))
        cfg2.write_text(json.dumps(_config(args, work / "w2")))
        _torchrun(1, "--inner", "reference", "--config", str(cfg1))
        out = work / "raw.json"
        _torchrun(
            2,
            "--inner",
            "main",
            "--config",
            str(cfg2),
            "--reshard-from",
            str(work / "w1" / "step-1"),
            "--out",
            str(out),
        )
        raw = json.loads(out.read_text())
        summary = _summarise(raw, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "worker_ckpt.json").write_text(json.dumps(summary, indent=1) + "\n")
    (RESULTS / "worker_ckpt.md").write_text(_markdown(summary))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()

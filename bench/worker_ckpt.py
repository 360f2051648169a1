"""Checkpoint benchmark for the worker: async blocking vs sync save, sync save vs the disk's
fsync'd sequential-write bandwidth, resharded vs same-size load. Numbers, not pass/fail.

    .venv/bin/python bench/worker_ckpt.py [--dim 1024 --layers 8] [--reps 5] [--load-reps 11]
                                          [--workdir ...]

Runs two torchrun gangs on CPU (gloo): world size 1 writes the checkpoint to reshard from;
world size 2 saves (sync x reps: O_DIRECT banded, one file per rank, buffered banded, and
fsync'd dd runs of 1, world and 2 x world streams, in a rotating order; async x3); then a fresh
world-size-2 gang, as after a restart, loads both checkpoints load-reps times each (rotating
order, cold page cache, idle disk).
Medians and min-max are reported. Results go to bench/results/worker_ckpt.{json,md}; every
large temporary file is removed at the end.
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

    from fsdp_worker.checkpointing import checkpoint, state
    from fsdp_worker.contract import config
    from fsdp_worker.runtime import distributed
    from fsdp_worker.telemetry import metrics
    from fsdp_worker.train import model, optim, parallelize

    cfg = config.WorkerConfig.parse(cfg_doc)
    tcfg = cfg.training
    di = distributed.init()
    net = model.build(tcfg)
    parallelize.shard(net, mesh=di.mesh, precision=tcfg.precision, ac=False)
    model.materialize(net, device=di.device, seed=0)
    opt = optim.build_optimizer(net, tcfg.optimizer)
    st = state.TrainState(net, opt, optim.build_scheduler(opt, cfg=tcfg))
    meters = metrics.Metrics()
    ident = checkpoint.Identity(attempt, None, tcfg.resume_hash(), tcfg.global_batch_size)

    def manager(mode: checkpoint.SaveMode, *, bands: int | None = None, direct: bool = True) -> Any:
        """bands=None: the configured (production) layout; 1: DCP's one file per rank, in
        a sibling root `<root>-one-file-per-rank`. direct=False: buffered writes (eager
        writeback) instead of O_DIRECT, in a sibling root `<root>-buffered`."""
        root = cfg.checkpoint.root if bands is None else one_file_root(cfg.checkpoint.root)
        ckcfg = cfg.checkpoint.model_copy(
            update={
                "root": root if direct else f"{root}-buffered",
                "keep": 100,
                "async_": mode is checkpoint.SaveMode.ASYNC,
                "bands_per_rank": cfg.checkpoint.bands_per_rank if bands is None else bands,
                "direct_writes": direct,
            }
        )
        made = checkpoint.CheckpointManager(ckcfg, identity=ident, dist_info=di, meters=meters)
        made.remove_abandoned()  # rank 0 holds the root (its saves go through its writer dir)
        return made

    def fwd_bwd() -> None:
        tokens = torch.randint(0, 256, (1, 32))
        net(tokens).float().mean().backward()

    def train_step() -> None:
        fwd_bwd()
        opt.step()
        opt.zero_grad(set_to_none=True)
        st.step += 1

    return di, st, meters, manager, fwd_bwd, train_step


def one_file_root(root: str) -> str:
    return f"{root}-one-file-per-rank"


def _inner_reference(cfg_doc: dict[str, Any]) -> None:
    """World size 1 writes the checkpoints to reshard from: production layout, then DCP's."""
    from fsdp_worker.checkpointing import checkpoint
    from fsdp_worker.runtime import distributed

    _di, st, _m, manager, _fb, train_step = _build(cfg_doc, async_=False, attempt=1)
    train_step()  # Adam state exists from here on
    manager(checkpoint.SaveMode.SYNC).save(st)
    manager(checkpoint.SaveMode.SYNC, bands=1).save(st)
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


def _settle(directory: str, *, quiet: float = 1.0, limit: float = 30.0) -> float:
    """Wait until the disk under `directory` is idle: nothing in flight and no sectors written
    or discarded for `quiet` seconds (ext4 here is mounted with `discard`, and the deleted dd
    files and old checkpoints keep the disk busy for a while). Returns the seconds waited;
    gives up after `limit`, and does not wait where the block device's stat is not readable."""
    st = os.stat(directory)
    stat = Path(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}/stat")
    if not stat.exists():
        return 0.0
    t0 = time.monotonic()
    last, since = None, t0
    while time.monotonic() - t0 < limit:
        fields = stat.read_text().split()
        busy = (fields[6], fields[14] if len(fields) > 14 else "")  # sectors written, discarded
        now = time.monotonic()
        if fields[8] != "0" or busy != last:
            last, since = busy, now
        elif now - since >= quiet:
            break
        time.sleep(0.1)
    return time.monotonic() - t0


def _timed(fn: Any) -> float:
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def _inner_saves(ctx: tuple[Any, ...], out: dict[str, Any], reps: int) -> None:
    """Each repetition: fsync'd dd writes with 1, world and 2 x world streams and
    one sync save, in a rotating order, each after an untimed `sync`. Then async saves."""
    import torch.distributed as dist

    from fsdp_worker.checkpointing import checkpoint
    from fsdp_worker.contract import catalog

    di, st, meters, manager, fwd_bwd, train_step = ctx
    sync = manager(checkpoint.SaveMode.SYNC)
    root = sync.root
    train_step()
    sync.save(st)  # warm-up; also gives the size
    manager(checkpoint.SaveMode.SYNC, bands=1).save(st)  # the same, in DCP's layout
    buffered = manager(checkpoint.SaveMode.SYNC, direct=False)  # banded, page-cache writes
    buffered.save(st)
    # The same-size loads read these warm-up checkpoints: they are written right after the
    # world-1 checkpoints the resharded loads read, so all have about the same age. (The disk
    # is virtual: a checkpoint written seconds before the loads, like the last sync save, may
    # still sit in the host's cache, which a guest-side DONTNEED does not reach.)
    out["same_step"] = st.step
    if di.rank == 0:
        Path(root, "same_step").write_text(str(st.step))
    out["bytes"] = size = sum(
        catalog.LocalStorage(root).list_files(f"{root}/step-{st.step}").values()
    )
    dd, world = Path(root, "dd.bin"), di.world_size
    streams = sorted({1, world, 2 * world})  # 2 x world: more streams than the save uses
    out["streams"] = streams
    out["writer_threads"] = checkpoint.WRITER_THREADS
    out["bands"] = sync.cfg.bands_per_rank
    one_file = manager(checkpoint.SaveMode.SYNC, bands=1)
    tasks: list[str | int] = ["save", "save_one_file", "save_buffered", *streams]
    for rep in range(reps):
        train_step()
        order = tasks[rep % len(tasks) :] + tasks[: rep % len(tasks)]
        for task in order:
            if di.rank == 0:
                # Untimed: settle earlier writes and the discards of deleted dd files (ext4 is
                # mounted with `discard`), else the next fsync, whoever's, pays for them. sync
                # alone did not: the task after a dd run was the slow one.
                os.sync()
                out["save_settle"].append(_settle(root))
            dist.barrier()
            if task == "save":
                out["sync"].append(_timed(lambda: sync.save(st)))
            elif task == "save_one_file":
                out["sync_one_file"].append(_timed(lambda: one_file.save(st)))
            elif task == "save_buffered":
                out["sync_buffered"].append(_timed(lambda: buffered.save(st)))
            elif di.rank == 0:
                n = int(task)
                out[f"dd{n}"] = [*out.get(f"dd{n}", []), size / _write_parallel(dd, size, n)]
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


# kind: (same-size?, layout, reader). "banded" is the production layout (layout.py), "one_file"
# DCP's one file per rank; "ranged" is reader.RangeReader (production), "dcp" DCP's own reader.
LOADS = {
    "load_same": (True, "banded", "ranged"),
    "load_reshard": (False, "banded", "ranged"),
    "load_same_one_file": (True, "one_file", "ranged"),
    "load_reshard_one_file": (False, "one_file", "ranged"),
    "load_same_dcp_reader": (True, "banded", "dcp"),
    "load_reshard_dcp_reader": (False, "banded", "dcp"),
}


def _load_with_dcp_reader(point: Any, st: Any, di: Any) -> None:
    """resume.load with DCP's stock FileSystemReader instead of reader.RangeReader: the
    reference the ranged reader is compared with, under the same conditions."""
    from torch.distributed.checkpoint import state_dict_loader
    from torch.distributed.checkpoint.filesystem import FileSystemReader

    from fsdp_worker.checkpointing import state

    storage = FileSystemReader(point.path)
    keys = {fqn.split(".", 1)[0] for fqn in storage.read_metadata().state_dict_metadata}
    sd = state.template(st, saved_world_size=point.world_size, saved_keys=keys)
    state_dict_loader.load(sd, storage_reader=storage, process_group=di.ckpt_group)
    state.apply_loaded(st, sd, rank=di.rank, world_size=di.world_size, seed=0)


def _inner_main(cfg_doc: dict[str, Any], out_path: str, reps: int) -> None:
    """Saves: sync (with the dd baselines) and async."""
    from fsdp_worker.runtime import distributed

    ctx = _build(cfg_doc, async_=False, attempt=2)
    keys = (
        "sync",
        "sync_one_file",
        "sync_buffered",
        "async",
        "step_alone",
        "step_overlapped",
        "save_settle",
    )
    out: dict[str, Any] = {k: [] for k in keys}
    _inner_saves(ctx, out, reps)
    if ctx[0].rank == 0:
        Path(out_path).write_text(json.dumps(out))
    distributed.destroy()


def _inner_loads(cfg_doc: dict[str, Any], reshard_from: str, out_path: str, reps: int) -> None:
    """Loads, in a fresh gang as after a restart: same-size and resharded, from both layouts,
    with the ranged reader and with DCP's, in a rotating order, each from a cold page cache on
    an idle disk."""
    import torch.distributed as dist

    from fsdp_worker.checkpointing import resume
    from fsdp_worker.contract import catalog
    from fsdp_worker.runtime import distributed

    di, st = _build(cfg_doc, async_=False, attempt=3)[:2]
    out: dict[str, Any] = json.loads(Path(out_path).read_text()) if di.rank == 0 else {}
    out.update({k: [] for k in (*LOADS, "settle_seconds")})
    root = cfg_doc["checkpoint"]["root"]
    same_step = int(Path(root, "same_step").read_text())
    points = {}
    for key, (same, kind, _reader) in LOADS.items():
        top = root if same else str(Path(reshard_from).parent)
        path = f"{top if kind == 'banded' else one_file_root(top)}/step-{same_step if same else 1}"
        m = catalog.Marker.from_json(Path(path, catalog.MARKER_NAME).read_bytes())
        points[key] = resume.ResumePoint(path, m.step, m.world_size, m.samples_consumed, 2)
    kinds = list(LOADS)
    for rep in range(reps):
        for key in kinds[rep % len(kinds) :] + kinds[: rep % len(kinds)]:
            point = points[key]
            if di.rank == 0:
                os.sync()
                out["settle_seconds"].append(_settle(point.path))
                _drop_cache(point.path)
            dist.barrier()
            t0 = time.monotonic()
            if LOADS[key][2] == "dcp":
                _load_with_dcp_reader(point, st, di)
            else:
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


def _write_parallel(path: Path, size: int, streams: int) -> float:
    """Seconds for `streams` concurrent fsync'd sequential writers of size/streams bytes each
    (threads; `write` and `fsync` release the GIL). Deleting the files is not timed."""
    import concurrent.futures as cf

    chunk = os.urandom(8 * 1024 * 1024)
    paths = [Path(f"{path}.{i}") for i in range(streams)]
    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(streams) as pool:
        for done in [pool.submit(_write_file, p, size // streams, chunk) for p in paths]:
            done.result()
    seconds = time.monotonic() - t0
    for p in paths:
        p.unlink()
    return seconds


def _write_file(path: Path, size: int, chunk: bytes) -> None:
    """One sequential writer, fsync'd, 8 MiB chunks (what `dd conv=fsync` measures)."""
    with open(path, "wb") as f:
        left = size
        while left > 0:
            left -= f.write(chunk[: min(left, len(chunk))])
        f.flush()
        os.fsync(f.fileno())


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _stats(values: list[float], digits: int = 4) -> dict[str, Any]:
    return {
        "median": round(_median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "n": len(values),
        "values": [round(v, digits) for v in values],
    }


def _summarise(raw: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    size, sync = raw["bytes"], raw["sync"]
    steady = raw["async"][1:]  # the first async save also allocates the staging buffers
    blocking = [a["blocking"] for a in steady]
    throughput = [size / s for s in sync]
    # Ratios per repetition: the save against the dd runs of the same repetition.
    per_baseline = {
        f"{n}_streams": [t / raw[f"dd{n}"][i] for i, t in enumerate(throughput)]
        for n in raw["streams"]
    }
    best = [t / max(raw[f"dd{n}"][i] for n in raw["streams"]) for i, t in enumerate(throughput)]
    paired_loads = [r / s for r, s in zip(raw["load_reshard"], raw["load_same"], strict=True)]
    stock = _median(raw["load_reshard_dcp_reader"]) / _median(raw["load_same_dcp_reader"])
    # The disk is shared with other machines: one load of the same files ranges over 3x. The
    # fastest of N is the least disturbed, so the ratio of fastest loads is reported alongside.
    by_layout = {
        layout: {
            "ratio_of_medians": round(
                _median(raw[f"load_reshard{sfx}"]) / _median(raw[f"load_same{sfx}"]), 4
            ),
            "ratio_of_fastest": round(
                min(raw[f"load_reshard{sfx}"]) / min(raw[f"load_same{sfx}"]), 4
            ),
        }
        for layout, sfx in (("banded", ""), ("one_file_per_rank", "_one_file"))
    }
    ratios = {
        "async_blocking_over_sync": _median(blocking) / _median(sync),
        "sync_over_bandwidth": _median(best),
        "reshard_over_same": _median(raw["load_reshard"]) / _median(raw["load_same"]),
    }
    met = {
        k: v >= GOALS[k] if k == "sync_over_bandwidth" else v <= GOALS[k] for k, v in ratios.items()
    }
    return {
        "model": {"dim": args.dim, "layers": args.layers},
        "world_size": 2,
        "writer_threads_per_rank": raw["writer_threads"],
        "repetitions": args.reps,
        "load_repetitions": args.load_reps,
        "checkpoint_bytes": size,
        "seconds": {
            "sync_save": _stats(sync),
            "sync_save_one_file_per_rank": _stats(raw["sync_one_file"]),
            "sync_save_buffered_writes": _stats(raw["sync_buffered"]),
            "async_blocking": _stats(blocking),
            "async_total": _stats([a["total"] for a in steady]),
            "fwd_bwd_alone": _stats(raw["step_alone"]),
            "fwd_bwd_overlapping_async_save": _stats(raw["step_overlapped"]),
            "load_same_2_to_2": _stats(raw["load_same"]),
            "load_reshard_1_to_2": _stats(raw["load_reshard"]),
            "load_same_2_to_2_one_file_per_rank": _stats(raw["load_same_one_file"]),
            "load_reshard_1_to_2_one_file_per_rank": _stats(raw["load_reshard_one_file"]),
            "load_same_2_to_2_dcp_reader": _stats(raw["load_same_dcp_reader"]),
            "load_reshard_1_to_2_dcp_reader": _stats(raw["load_reshard_dcp_reader"]),
            "disk_settle_before_each_save": _stats(raw["save_settle"]),
            "disk_settle_before_each_load": _stats(raw["settle_seconds"]),
        },
        "gb_per_s": {
            "sync_save": _stats([t / 1e9 for t in throughput]),
            **{
                f"fsync_write_{n}_streams": _stats([b / 1e9 for b in raw[f"dd{n}"]])
                for n in raw["streams"]
            },
        },
        "sync_over_bandwidth_by_baseline": {
            **{k: _stats(v) for k, v in per_baseline.items()},
            "fastest_of_them": _stats(best),
        },
        "reshard_over_same_paired": _stats(paired_loads),
        "reshard_over_same_with_dcp_reader": round(stock, 4),
        "reshard_over_same_by_layout": by_layout,
        "bands_per_rank": raw["bands"],
        "ratios": {k: round(v, 4) for k, v in ratios.items()},
        "goals": GOALS,
        "met": met,
        "judged_on": {
            "sync_over_bandwidth": "median over repetitions of save throughput / the fastest "
            "of the 1, world and 2 x world stream dd runs of the same repetition",
            "reshard_over_same": "median reshard load / median same-size load",
            "async_blocking_over_sync": "median blocking (repetitions 2..) / median sync save",
        },
        "machine": f"{os.cpu_count()} CPUs (shared), gloo; loads start from a cold page cache "
        "on an idle disk",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _spread(st: dict[str, Any], fmt: str = "{:.3f}") -> str:
    return f"{fmt.format(st['median'])} | {fmt.format(st['min'])}..{fmt.format(st['max'])}"


def _markdown(s: dict[str, Any]) -> str:
    gib = s["checkpoint_bytes"] / 2**30
    r, g, met = s["ratios"], s["goals"], s["met"]
    by = s["sync_over_bandwidth_by_baseline"]
    lines = [
        f"Checkpoint of {gib:.2f} GiB (model + AdamW), world size 2, "
        f"{s['bands_per_rank']} row bands (files) per rank, "
        f"{s['writer_threads_per_rank']} writer thread(s) per rank, {s['repetitions']} "
        f"save and {s['load_repetitions']} load repetitions, {s['machine']}, {s['when']}.",
        "",
        "| ratio | median | min..max | goal | met |",
        "| --- | --- | --- | --- | --- |",
        f"| async blocking / sync save | {r['async_blocking_over_sync']:.3f} | "
        f"{s['seconds']['async_blocking']['min'] / s['seconds']['sync_save']['median']:.3f}.."
        f"{s['seconds']['async_blocking']['max'] / s['seconds']['sync_save']['median']:.3f} | "
        f"<= {g['async_blocking_over_sync']} | {met['async_blocking_over_sync']} |",
    ]
    for key, st in by.items():
        name = (
            "**judged:** fastest of the dd runs"
            if key == "fastest_of_them"
            else f"vs {key.split('_')[0]} fsync'd stream(s)"
        )
        goal = f">= {g['sync_over_bandwidth']}" if key == "fastest_of_them" else "(reported)"
        ok = met["sync_over_bandwidth"] if key == "fastest_of_them" else ""
        lines.append(f"| sync save throughput {name} | {_spread(st)} | {goal} | {ok} |")
    lines.append(
        f"| resharded load (1->2) / same-size load (2->2), ratio of medians | "
        f"{r['reshard_over_same']:.3f} | {s['reshard_over_same_paired']['min']:.3f}.."
        f"{s['reshard_over_same_paired']['max']:.3f} (paired per repetition) | "
        f"<= {g['reshard_over_same']} | {met['reshard_over_same']} |"
    )
    lines.append(
        f"| (reference) the same ratio with DCP's stock reader | "
        f"{s['reshard_over_same_with_dcp_reader']:.3f} | | | |"
    )
    for name, v in s["reshard_over_same_by_layout"].items():
        lines.append(
            f"| (reference) resharded / same-size, {name.replace('_', ' ')} layout: ratio of "
            f"medians, of fastest loads | {v['ratio_of_medians']:.3f}, {v['ratio_of_fastest']:.3f}"
            " | | | |"
        )
    lines += ["", "| quantity | median | min..max |", "| --- | --- | --- |"]
    lines += [f"| {k} (s) | {_spread(v)} |" for k, v in s["seconds"].items()]
    lines += [f"| {k} (GB/s) | {_spread(v)} |" for k, v in s["gb_per_s"].items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--inner", choices=["reference", "main", "loads"])
    parser.add_argument("--config")
    parser.add_argument("--reshard-from")
    parser.add_argument("--out")
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--load-reps", type=int, default=11, help="loads of each kind (the disk is noisy)"
    )
    args = parser.parse_args()
    if args.inner:
        doc = json.loads(Path(args.config).read_text())
        if args.inner == "reference":
            _inner_reference(doc)
        elif args.inner == "main":
            _inner_main(doc, args.out, args.reps)
        else:
            _inner_loads(doc, args.reshard_from, args.out, args.reps)
        return
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="worker-ckpt-bench-", dir=args.workdir))
    try:
        cfg1, cfg2 = work / "w1.json", work / "w2.json"
        cfg1.write_text(json.dumps(_config(args, work / "w1")))
        cfg2.write_text(json.dumps(_config(args, work / "w2")))
        _torchrun(1, "--inner", "reference", "--config", str(cfg1))
        out = work / "raw.json"
        common = ["--config", str(cfg2), "--out", str(out), "--reps", str(args.reps)]
        _torchrun(2, "--inner", "main", *common)
        loads = [*common[:-1], str(args.load_reps)]
        _torchrun(2, "--inner", "loads", "--reshard-from", str(work / "w1" / "step-1"), *loads)
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

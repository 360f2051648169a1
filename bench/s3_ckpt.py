"""DCP checkpoint save and load on an S3 server (versitygw) against raw PUT/GET of the same
bytes by the same client (boto3, multipart, 8 threads per transfer), same run.

One process, CPU: a state dict of `--mb` MiB in 8 tensors, saved with the worker's writer
(layout.BandedWriter over checkpointing/s3.py, 4 bands) and loaded with reader.RangeReader
(ranged GETs straight into the tensors, checkpointing/ranged.py), and again with every file
downloaded whole then parsed (`WholeFiles`, the way loads went before ranged.py, less its
two-file read-ahead); the raw baseline uploads and downloads the same byte count as the same
number of objects, one after the other and (the fair baseline for the ranged load and the
banded save, which keep 8 requests in flight) as 16 MiB parts 8 at a time.
Also the async save's blocking ratio (time the caller waits / time of the whole save) with the
worker's ThreadStager. Writes bench/results/s3_ckpt.json.

    python -m bench.s3_ckpt --mb 256 --reps 3
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import io
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import state_dict_loader, state_dict_saver

from fsdp_worker.checkpointing import checkpoint, layout, reader, s3
from tests.s3server import S3Server

RESULTS = Path(__file__).parent / "results" / "s3_ckpt.json"


def state(mb: int) -> dict[str, torch.Tensor]:
    rows = mb * 1024 * 1024 // 4 // 8 // 1024
    return {f"w{i}": torch.randn(rows, 1024) for i in range(8)}


def save(fs: s3.S3FileSystem, uri: str, sd: dict[str, Any], *, asynchronous: bool) -> float:
    """Seconds the caller is blocked (async) or the whole save (sync)."""
    writer = layout.writer(uri, step=0, sync_files=True, single_file_per_rank=True)
    writer.fs, writer.path = fs, fs.init_path(uri)  # type: ignore[assignment]
    planner = layout.BandedSavePlanner(bands=4, min_band_bytes=65536)
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if not asynchronous:
            state_dict_saver.save(sd, storage_writer=writer, planner=planner, no_dist=True)
            return time.perf_counter() - started
        stager = checkpoint.ThreadStager()
        response = state_dict_saver.async_save(
            sd, storage_writer=writer, planner=planner, no_dist=True, async_stager=stager
        )
    blocked = time.perf_counter() - started
    upload = response if not hasattr(response, "upload_completion") else response.upload_completion
    upload.result()
    stager.close()
    return blocked


class WholeFiles:
    """The S3 file system without ranged reads: reader.RangeReader then opens each file,
    which downloads it whole into memory, and parses it there."""

    def __init__(self, fs: s3.S3FileSystem) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        if name == "read_into":
            raise AttributeError(name)
        return getattr(self._fs, name)


def load(fs: s3.S3FileSystem | WholeFiles, uri: str, sd: dict[str, Any]) -> float:
    """Seconds of the load alone: the tensors it fills exist and are touched before (as a
    model's are), and the check that it read them right comes after."""
    target = {k: torch.zeros_like(v) for k, v in sd.items()}
    started = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state_dict_loader.load(target, storage_reader=reader.RangeReader(uri, fs=fs), no_dist=True)
    seconds = time.perf_counter() - started
    assert all(torch.equal(target[k], sd[k]) for k in sd)
    return seconds


def raw(fs: s3.S3FileSystem, bucket: str, sizes: list[int]) -> tuple[float, float]:
    """One object after the other, each a multipart transfer of up to 8 threads."""
    blobs = [os.urandom(n) for n in sizes]
    started = time.perf_counter()
    with fs.deferred_closes():
        for i, blob in enumerate(blobs):
            fs.upload(f"s3://{bucket}/raw/{i}", blob)
    put = time.perf_counter() - started
    started = time.perf_counter()
    for i in range(len(blobs)):
        io.BytesIO(fs.download(f"s3://{bucket}/raw/{i}"))
    return put, time.perf_counter() - started


def raw_concurrent(fs: s3.S3FileSystem, bucket: str, sizes: list[int]) -> tuple[float, float]:
    """The same bytes as plain PUTs and GETs of 16 MiB parts, `s3.MULTIPART.max_concurrency`
    at once over every object: the baseline a load's ranged GETs (the same number at once,
    s3.S3FileSystem.gets) and a save's bands are fairly judged against, since the one-by-one
    baseline above leaves the server idle between objects."""
    part = s3.MULTIPART.multipart_chunksize
    blobs = [os.urandom(n) for n in sizes]
    keys = [(i, off) for i, n in enumerate(sizes) for off in range(0, n, part)]

    def put(key: tuple[int, int]) -> None:
        i, off = key
        fs.s3.put_object(Bucket=bucket, Key=f"rawc/{i}/{off}", Body=blobs[i][off : off + part])

    def get(key: tuple[int, int]) -> None:
        i, off = key
        body = fs.s3.get_object(Bucket=bucket, Key=f"rawc/{i}/{off}")["Body"]
        with contextlib.closing(body):
            body.read()

    with cf.ThreadPoolExecutor(max_workers=s3.MULTIPART.max_concurrency) as pool:
        started = time.perf_counter()
        list(pool.map(put, keys))
        put_s = time.perf_counter() - started
        started = time.perf_counter()
        list(pool.map(get, keys))
        return put_s, time.perf_counter() - started


def one_rep(s3srv: S3Server, fs: s3.S3FileSystem, sd: dict[str, Any], rep: int) -> dict[str, Any]:
    uri = f"s3://{s3srv.bucket}/dcp/{rep}"
    t0 = time.perf_counter()
    save(fs, uri, sd, asynchronous=False)
    saved = time.perf_counter() - t0
    objs = fs.s3.list_objects_v2(Bucket=s3srv.bucket, Prefix=f"dcp/{rep}/")["Contents"]
    sizes = [int(o["Size"]) for o in objs]
    loaded = load(fs, uri, sd)
    loaded_whole = load(WholeFiles(fs), uri, sd)
    put, get = raw(fs, s3srv.bucket, sizes)
    put_c, get_c = raw_concurrent(fs, s3srv.bucket, sizes)
    t0 = time.perf_counter()
    blocked = save(fs, f"s3://{s3srv.bucket}/async/{rep}", sd, asynchronous=True)
    whole = time.perf_counter() - t0
    mib = sum(sizes) / 2**20
    return {
        "mib": round(mib, 1),
        "save_mib_s": mib / saved,
        "load_mib_s": mib / loaded,
        "load_whole_files_mib_s": mib / loaded_whole,
        "raw_put_mib_s": mib / put,
        "raw_get_mib_s": mib / get,
        "raw_put_concurrent_mib_s": mib / put_c,
        "raw_get_concurrent_mib_s": mib / get_c,
        "async_blocking_ratio": blocked / whole,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mb", type=int, default=256)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    torch.serialization.set_crc32_options(checkpoint.ZIP_CRC32)
    sd = state(args.mb)
    with tempfile.TemporaryDirectory() as tmp, S3Server(tmp) as srv:
        fs = s3.S3FileSystem(srv.client())
        reps = [one_rep(srv, fs, sd, rep) for rep in range(args.reps)]
    med = {k: statistics.median(r[k] for r in reps) for k in reps[0]}
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, server versitygw (posix, "
        "local disk) on loopback, client boto3 in the same process",
        "command": f"python -m bench.s3_ckpt --mb {args.mb} --reps {args.reps}",
        "median": {k: round(v, 3) for k, v in med.items()},
        "save_vs_raw_put": round(med["save_mib_s"] / med["raw_put_mib_s"], 3),
        "load_vs_raw_get": round(med["load_mib_s"] / med["raw_get_mib_s"], 3),
        "load_whole_files_vs_raw_get": round(
            med["load_whole_files_mib_s"] / med["raw_get_mib_s"], 3
        ),
        "save_vs_raw_put_concurrent": round(med["save_mib_s"] / med["raw_put_concurrent_mib_s"], 3),
        "load_vs_raw_get_concurrent": round(med["load_mib_s"] / med["raw_get_concurrent_mib_s"], 3),
        "reps": reps,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps({k: out[k] for k in out if k not in ("machine", "command", "reps")}))


if __name__ == "__main__":
    main()

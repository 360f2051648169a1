"""A DCP load plan read from an object store with ranged GETs, straight into the tensors.

reader.RangeReader hands its plan here when its file system is an object store
(checkpointing/s3.py). Every item's first bytes come first (one small GET each, all of the
plan's files at once), which give its layout (reader.head_layout); then the bytes the rank
needs are fetched as ranged GETs of at most `CHUNK` bytes, concurrently on the file system's
pool, each read straight into the destination tensor (or a staging buffer when that is not a
contiguous CPU tensor of the stored dtype). Nothing is downloaded whole and copied again, as
when a file was fetched into memory and then parsed, and at most `WINDOW` bytes are in flight,
so the next file streams while this one lands. Byte items (DCP's BYTE_IO) are one GET each.
What is not one run of bytes of a stored tensor (reader.located's rules, storage transforms)
is handed back for DCP's reader, which downloads its file whole.

This module must not choose checkpoints or write anything; tensors are resolved and committed
on the caller's thread only (DCP's planners are not thread-safe).
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import MetadataIndex
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlanner, ReadItem

CHUNK = 16 * 1024 * 1024  # one ranged GET, as s3transfer's multipart chunk (s3.MULTIPART)
WINDOW = 512 * 1024 * 1024  # bytes fetched ahead of the item being committed

# (layout, absolute position in the file, byte count) of what a request reads, from its head.
Locate = Callable[[bytes, ReadItem, _StorageInfo], tuple[Any, int, int] | None]


@dataclass
class _Landing:
    """One tensor request on its way: the GETs filling `out`, then copied into `target` (when
    `out` is a staging buffer) and committed."""

    req: ReadItem
    target: torch.Tensor
    out: torch.Tensor
    parts: list[cf.Future[None]]
    nbytes: int


def as_bytes(out: torch.Tensor) -> memoryview:
    """The writable bytes of the contiguous CPU tensor `out`."""
    return memoryview(cast(bytearray, out.reshape(-1).view(torch.uint8).numpy()))


class RangedLoad:
    """One `read_data` call's ranged reads; `files_read` counts bytes per file name."""

    def __init__(
        self,
        fs: Any,
        root: str,
        storage_data: dict[MetadataIndex, _StorageInfo],
        *,
        locate: Locate,
        head_bytes: int,
    ) -> None:
        self.fs, self._root, self._info = fs, root, storage_data
        self._locate, self._head_bytes = locate, head_bytes
        self.files_read: dict[str, int] = {}

    def _uri(self, req: ReadItem) -> str:
        return str(self.fs.concat_path(self._root, self._info[req.storage_index].relative_path))

    def _head(self, pool: cf.ThreadPoolExecutor, req: ReadItem) -> cf.Future[bytes]:
        """A byte item whole, a tensor item's first `head_bytes`."""
        sinfo = self._info[req.storage_index]
        size = int(sinfo.length)
        if req.type == LoadItemType.TENSOR:
            size = min(size, self._head_bytes)
        return pool.submit(self.fs.read_range, self._uri(req), int(sinfo.offset), size)

    def run(self, per_file: dict[str, list[ReadItem]], planner: LoadPlanner) -> list[ReadItem]:
        """Read what can be read as ranges, in file and offset order; return the rest."""
        pool = self.fs.gets()
        reqs = [req for group in per_file.values() for req in group]
        reqs.sort(key=lambda r: (self._info[r.storage_index].relative_path, self._offset(r)))
        rest = [req for req in reqs if self._info[req.storage_index].transform_descriptors]
        plain = [req for req in reqs if not self._info[req.storage_index].transform_descriptors]
        heads = [(req, self._head(pool, req)) for req in plain]
        landing: collections.deque[_Landing] = collections.deque()
        in_flight = 0
        for req, head in heads:
            if req.type == LoadItemType.BYTE_IO:
                planner.load_bytes(req, io.BytesIO(head.result()))
                continue
            started = self._start(pool, req, head.result(), planner)
            if started is None:
                rest.append(req)
                continue
            landing.append(started)
            in_flight += started.nbytes
            while in_flight > WINDOW:
                in_flight -= self._finish(landing.popleft(), planner)
        while landing:
            self._finish(landing.popleft(), planner)
        return rest

    def _offset(self, req: ReadItem) -> int:
        return int(self._info[req.storage_index].offset)

    def _start(
        self, pool: cf.ThreadPoolExecutor, req: ReadItem, head: bytes, planner: LoadPlanner
    ) -> _Landing | None:
        """Resolve the request's tensor and start the GETs that fill it; None when it is not
        one run of bytes."""
        sinfo = self._info[req.storage_index]
        found = self._locate(head, req, sinfo)
        if found is None:
            return None
        layout, position, nbytes = found
        target, out, _ = landing(planner, req, layout.dtype, nbytes)
        parts = self._fill(pool, req, as_bytes(out) if nbytes else memoryview(b""), position, head)
        return _Landing(req, target, out, parts, nbytes)

    def _fill(
        self,
        pool: cf.ThreadPoolExecutor,
        req: ReadItem,
        buf: memoryview,
        position: int,
        head: bytes,
    ) -> list[cf.Future[None]]:
        """GETs of `CHUNK` bytes into `buf`, or a copy from the head when it holds them."""
        within = position - int(self._info[req.storage_index].offset)
        if within + len(buf) <= len(head):
            buf[:] = head[within : within + len(buf)]
            return []
        uri = self._uri(req)
        return [
            pool.submit(self.fs.read_into, uri, position + at, buf[at : at + CHUNK])
            for at in range(0, len(buf), CHUNK)
        ]

    def _finish(self, landing: _Landing, planner: LoadPlanner) -> int:
        """Wait for a request's GETs, copy and commit it; its byte count."""
        for part in landing.parts:
            part.result()
        if landing.out is not landing.target:
            landing.target.copy_(landing.out)
        planner.commit_tensor(landing.req, landing.target)
        name = self._info[landing.req.storage_index].relative_path
        self.files_read[name] = self.files_read.get(name, 0) + landing.nbytes
        return landing.nbytes


def landing(
    planner: LoadPlanner, req: ReadItem, dtype: torch.dtype, nbytes: int
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Where a read item's bytes land: (the planner's tensor, the buffer the bytes go into,
    whether that buffer is the tensor itself). A staging buffer only when the stored dtype or
    the device differs, or the tensor is not contiguous (then copied in after the read)."""
    target = planner.resolve_tensor(req).detach()
    if tuple(target.shape) != tuple(req.lengths):
        raise RuntimeError(
            f"req {req.storage_index} mismatch sizes {tuple(target.shape)} vs {req.lengths}"
        )
    direct = target.is_cpu and target.dtype == dtype and target.is_contiguous()
    out = target if direct else torch.empty(tuple(req.lengths), dtype=dtype)
    assert out.numel() * out.element_size() == nbytes
    return target, out, direct

"""Row-banded checkpoint files: a load at another world size reads mostly its own files.

With DCP's default layout (one file per rank) a rank resuming at another world size needs a
run of rows of every tensor, and those rows sit in files that other ranks read too: every
reader takes part of every item of a shared file. Here each rank cuts its shard of every
large tensor (`Shard(0)`, FSDP2's placement) into `bands` runs of rows and writes band b of
every tensor to its own file, `__<rank>_<b>.distcp`. Global row order is then file order, so
the rows any rank needs at any world size lie in a contiguous run of files that other ranks
touch only at the ends, and a resharded load reads like a same-size one: each process streams
its own files front to back (docs/worker.md, "Benchmarks", has the numbers).

Each band is an ordinary DCP chunk in the metadata; loading needs nothing from this module (DCP's
load planner and `reader.RangeReader` read chunks of any layout). Tensors whose bands would be
smaller than `min_band_bytes`, and everything that is not a sharded tensor, stay whole in file 0.
This module must not decide when or where to save.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import queue
import time
from typing import Any

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.filesystem import DEFAULT_SUFFIX, FileSystemWriter
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.futures import Future

from fsdp_worker.contract import catalog
from fsdp_worker.runtime import faults


@dataclasses.dataclass(frozen=True)
class Band:
    """Rows [first, first + rows) of the local shard at `parent`, written to file `file`."""

    parent: MetadataIndex
    first: int
    rows: int
    file: int


def band_rows(rows: int, bands: int) -> list[tuple[int, int]]:
    """(first row, row count) of each of `bands` near-equal runs covering `rows` rows."""
    edges = [rows * b // bands for b in range(bands + 1)]
    return [(edges[b], edges[b + 1] - edges[b]) for b in range(bands)]


def rows_view(tensor: torch.Tensor, first: int, rows: int) -> torch.Tensor:
    """Rows [first, first + rows) of `tensor`. For a contiguous CPU tensor the view gets a storage
    of exactly its own bytes (sharing memory), so DCP's writer saves it without the copy it makes
    of any view of a larger storage."""
    view = tensor.narrow(0, first, rows)
    if not (tensor.is_cpu and tensor.is_contiguous()) or view.numel() == 0:
        return view
    start = view.storage_offset() * view.element_size()
    storage = tensor.untyped_storage()[start : start + view.numel() * view.element_size()]
    return torch.empty(0, dtype=view.dtype).set_(storage, 0, view.shape, view.stride())


class BandedSavePlanner(DefaultSavePlanner):
    """DefaultSavePlanner whose local plan cuts each large sharded tensor into row bands."""

    def __init__(self, *, bands: int, min_band_bytes: int) -> None:
        super().__init__()
        if bands < 1:
            raise ValueError(f"bands must be >= 1, got {bands}")
        self.bands, self.min_band_bytes = bands, min_band_bytes
        self._bands: dict[tuple[str, tuple[int, ...]], Band] = {}

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        self.plan = dataclasses.replace(plan, items=[b for i in plan.items for b in self._cut(i)])
        return self.plan

    def _cut(self, item: WriteItem) -> list[WriteItem]:
        data = item.tensor_data
        if item.type != WriteItemType.SHARD or data is None or len(data.chunk.sizes) == 0:
            return [item]
        sizes, offsets = data.chunk.sizes, data.chunk.offsets
        nbytes = math.prod(sizes) * data.properties.dtype.itemsize
        count = min(self.bands, sizes[0], nbytes // max(1, self.min_band_bytes))
        if count < 2:
            return [item]
        out = []
        for j, (first, rows) in enumerate(band_rows(sizes[0], count)):
            at = torch.Size([offsets[0] + first, *offsets[1:]])
            chunk = ChunkStorageMetadata(offsets=at, sizes=torch.Size([rows, *sizes[1:]]))
            index = MetadataIndex(item.index.fqn, at)
            file = j * self.bands // count  # keeps row order = file order when count < bands
            self._bands[(index.fqn, tuple(at))] = Band(item.index, first, rows, file)
            out.append(
                dataclasses.replace(
                    item, index=index, tensor_data=dataclasses.replace(data, chunk=chunk)
                )
            )
        return out

    def band(self, index: MetadataIndex) -> Band | None:
        return self._bands.get((index.fqn, tuple(index.offset or ())))

    def resolve_data(self, write_item: WriteItem) -> Any:
        band = self.band(write_item.index)
        if band is None:
            return super().resolve_data(write_item)
        shard = self.lookup_object(band.parent)
        return rows_view(shard, band.first, band.rows)

    def file_of(self, item: WriteItem) -> int:
        band = self.band(item.index)
        return 0 if band is None else band.file


class BandedWriter(FileSystemWriter):
    """FileSystemWriter that writes band b of every tensor to `__<rank>_<b>.distcp` (in plan
    order within a file). With any other planner it writes as DCP does.

    With `sync_files` every file is fsync'd before `write_data` returns, as in DCP, but after
    the last file is written rather than each as it is closed: DCP's per-file fsync would make
    the copy into file b+1 wait for file b's last dirty pages, once per band."""

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[Any]]:
        if not isinstance(planner, BandedSavePlanner):
            return super().write_data(plan, planner)
        files: dict[int, list[WriteItem]] = {}
        for item in plan.items:
            files.setdefault(planner.file_of(item), []).append(item)
        work: queue.Queue[tuple[str, str, list[WriteItem]]] = queue.Queue()
        paths = []
        for file in sorted(files):
            name = f"{plan.storage_data.prefix}{file}{DEFAULT_SUFFIX}"
            paths.append(str(self.fs.concat_path(self.path, name)))
            work.put((paths[-1], name, files[file]))
        durable, self.sync_files = self.sync_files, False
        # direct.DirectFileSystem: a file's last writes overlap the next file's; all are done
        # when the block is left, before the fsyncs below.
        closes = getattr(self.fs, "deferred_closes", contextlib.nullcontext)
        try:
            with closes():
                result: Future[list[Any]] = self._write_data(planner, work)
        finally:
            self.sync_files = durable
        if durable and not getattr(self.fs, "durable_on_close", False):  # s3.py: uploaded
            # the first fsync waits for most of the data, the rest are quick
            for path in paths:
                catalog.fsync_path(path)
        return result


# --- injected faults (faults.py; no-ops in production) -----------------------------------------


class FaultyWriter(BandedWriter):
    """A FileSystemWriter whose writes are slowed down or fail, for async-save tests."""

    def __init__(self, path: str, *, step: int, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self._step = step

    def write_data(self, plan: Any, planner: Any) -> Any:
        delay = faults.number("slow_write")
        if delay:
            time.sleep(delay)
        if faults.at_step("fail_write", self._step):
            raise OSError(f"injected write failure at step {self._step}")
        return super().write_data(plan, planner)


def writer(path: str, *, step: int, **kwargs: Any) -> BandedWriter:
    if "slow_write" in faults.FAULTS or "fail_write" in faults.FAULTS:
        return FaultyWriter(path, step=step, **kwargs)
    return BandedWriter(path, **kwargs)

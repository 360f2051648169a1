"""A DCP FileSystemReader that reads only the bytes a rank needs, straight into its tensor.

DCP's own reader deserialises every stored tensor whole (`torch.load`) and then narrows it.
After a world-size change a rank that needs half of a stored tensor therefore reads and copies
all of it. Here, when the stored tensor is contiguous and the request narrows it along dim 0
only (FSDP2's `Shard(0)`; a whole tensor is the special case), the requested byte range is read
with one `readinto` into the destination (or a staging buffer when the destination is not a
contiguous CPU tensor of the same dtype). Same-size and resharded loads take this same path.
Anything else (scalars, other layouts, storage transforms, foreign byte order, byte items)
goes through DCP's reader unchanged. This module must not choose checkpoints or write files.
"""

from __future__ import annotations

import io
import math
import os
import sys
from dataclasses import dataclass
from typing import IO, Any, cast

import torch
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.utils import _create_file_view
from torch.futures import Future


@dataclass(frozen=True)
class StoredLayout:
    """Where a `torch.save`d tensor's elements start (bytes from the item's offset), and how
    they are laid out."""

    dtype: torch.dtype
    size: tuple[int, ...]
    contiguous: bool
    data_offset: int


def stored_layout(stream: IO[bytes], sinfo: _StorageInfo) -> StoredLayout | None:
    """The layout of one DCP tensor item (a `torch.save` zip archive inside the file), without
    reading its data: `torch.load` under `skip_data` for dtype/shape/strides, the zip directory
    for the record offset. None when the fast path cannot be used."""
    view = cast(IO[bytes], _create_file_view(cast(io.IOBase, stream), sinfo.offset, sinfo.length))
    with torch.serialization.skip_data():
        meta = torch.load(view, map_location="cpu", weights_only=True)
    if not isinstance(meta, torch.Tensor) or meta.dim() == 0:
        return None
    view.seek(0)
    archive: Any = torch._C.PyTorchFileReader(view)  # the stubs lack has_record, offsets
    data = [name for name in archive.get_all_records() if name.startswith("data/")]
    if len(data) != 1 or not archive.has_record("byteorder"):
        return None
    if bytes(archive.get_record("byteorder")).decode() != sys.byteorder:
        return None
    offset = archive.get_record_offset(data[0]) + meta.storage_offset() * meta.element_size()
    return StoredLayout(meta.dtype, tuple(meta.shape), meta.is_contiguous(), offset)


def row_range(
    layout: StoredLayout, offsets: tuple[int, ...], lengths: tuple[int, ...]
) -> tuple[int, int] | None:
    """(byte offset from the tensor's first element, byte count) of the requested region when
    it is one contiguous run, i.e. narrowed along dim 0 only; else None."""
    if not layout.contiguous or len(offsets) != len(layout.size) or not layout.size:
        return None
    for dim in range(1, len(layout.size)):
        if offsets[dim] != 0 or lengths[dim] != layout.size[dim]:
            return None
    row_bytes = math.prod(layout.size[1:]) * torch.empty((), dtype=layout.dtype).element_size()
    return offsets[0] * row_bytes, lengths[0] * row_bytes


def read_exactly(stream: IO[bytes], position: int, out: torch.Tensor) -> None:
    """Fill the contiguous CPU tensor `out` with the bytes at `position`."""
    if out.numel() == 0:
        return
    buf = memoryview(cast(bytearray, out.reshape(-1).view(torch.uint8).numpy()))
    stream.seek(position, os.SEEK_SET)
    got = 0
    while got < len(buf):
        n = stream.readinto(buf[got:])  # type: ignore[attr-defined]
        if not n:
            raise OSError(f"short read: wanted {len(buf)} bytes at {position}, got {got}")
        got += n


class RangeReader(FileSystemReader):
    """FileSystemReader with ranged tensor reads; metadata is read once per checkpoint."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._metadata: Metadata | None = None
        self.ranged_bytes = 0  # bytes read by the fast path (for tests and benchmarks)
        self.fallback_items = 0

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if kwargs.get("rank") is not None:
            return super().read_metadata(*args, **kwargs)
        if self._metadata is None:
            self._metadata = super().read_metadata()
        return self._metadata

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        per_file: dict[str, list[ReadItem]] = {}
        for item in plan.items:
            per_file.setdefault(self.storage_data[item.storage_index].relative_path, []).append(
                item
            )
        rest: list[ReadItem] = []
        for relative_path, reqs in per_file.items():
            reqs.sort(key=lambda r: int(self.storage_data[r.storage_index].offset))
            path = self.fs.concat_path(self.path, relative_path)
            with self.fs.create_stream(path, "rb") as stream:
                rest += [
                    r for r in reqs if not self._read_ranged(cast(IO[bytes], stream), r, planner)
                ]
        self.fallback_items += len(rest)
        if rest:
            return super().read_data(LoadPlan(rest), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_ranged(self, stream: IO[bytes], req: ReadItem, planner: LoadPlanner) -> bool:
        sinfo: _StorageInfo = self.storage_data[req.storage_index]
        if req.type != LoadItemType.TENSOR or sinfo.transform_descriptors:
            return False
        layout = stored_layout(stream, sinfo)
        span = (
            None
            if layout is None
            else row_range(layout, tuple(req.storage_offsets), tuple(req.lengths))
        )
        if layout is None or span is None:
            return False
        start, nbytes = span
        target = planner.resolve_tensor(req).detach()
        if tuple(target.shape) != tuple(req.lengths):
            raise RuntimeError(
                f"req {req.storage_index} mismatch sizes {tuple(target.shape)} vs {req.lengths}"
            )
        direct = target.is_cpu and target.dtype == layout.dtype and target.is_contiguous()
        out = target if direct else torch.empty(tuple(req.lengths), dtype=layout.dtype)
        assert out.numel() * out.element_size() == nbytes
        read_exactly(stream, int(sinfo.offset) + layout.data_offset + start, out)
        if not direct:
            target.copy_(out)
        planner.commit_tensor(req, target)
        self.ranged_bytes += nbytes
        return True

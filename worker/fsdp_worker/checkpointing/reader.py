"""A DCP FileSystemReader that reads only the bytes a rank needs, straight into its tensor.

DCP's own reader deserialises every stored tensor whole (`torch.load`) and then narrows it.
After a world-size change a rank that needs half of a stored tensor therefore reads and copies
all of it. Here, when the stored tensor is contiguous and the request narrows it along dim 0
only (FSDP2's `Shard(0)`; a whole tensor is the special case), the requested byte range is read
with one `readinto` into the destination (or a staging buffer when the destination is not a
contiguous CPU tensor of the same dtype). Same-size and resharded loads take this same path.
Anything else (scalars, other layouts, storage transforms, foreign byte order, byte items)
goes through DCP's reader unchanged. This module must not choose checkpoints or write files.

Each file is read front to back (items in offset order) and every access moves forward; for
the items a rank reads whole the kernel is asked to read 64 MiB ahead (`Prefetcher`). An
item's layout comes from its first `HEAD_BYTES` only (`head_layout`), not from the zip
directory at its end, which cost a jump to the end of the item and back for every item
(docs/worker.md has the numbers). `stored_layout`, which reads the directory, is the fallback.
"""

from __future__ import annotations

import contextlib
import functools
import io
import math
import os
import struct
import sys
from dataclasses import dataclass, replace
from typing import IO, Any, cast

import torch
from torch import _weights_only_unpickler
from torch.distributed.checkpoint.filesystem import FileSystemReader, _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, LoadPlanner, ReadItem
from torch.distributed.checkpoint.utils import _create_file_view
from torch.futures import Future

from fsdp_worker.checkpointing import ranged


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


_LOCAL_HEADER = struct.Struct("<4sHHHHHIIIHH")  # zip local file header, 30 bytes
_LOCAL_SIG, _DESCRIPTOR_SIG = b"PK\x03\x04", b"PK\x07\x08"
# Bytes read at the start of an item for `head_layout`; a tensor's pickle and the headers before
# its data record take a few hundred bytes.
HEAD_BYTES = 4096
PREFETCH_WINDOW = 64 * 1024 * 1024  # read-ahead asked for, beyond the current position
PREFETCH_PIECE = 8 * 1024 * 1024  # one posix_fadvise call
PREFETCH_GAP = 1024 * 1024  # items read whole this close together are prefetched as one span


class _MetaStorages:
    """persistent_load for the weights-only unpickler: storages on the meta device, so the
    unpickled tensor has the stored dtype, shape, strides and offset and no data."""

    def __init__(self) -> None:
        self.keys: list[str] = []

    def __call__(self, saved_id: Any) -> Any:
        if not isinstance(saved_id, tuple) or len(saved_id) != 5 or saved_id[0] != "storage":
            raise ValueError(f"unexpected persistent id {saved_id!r}")
        storage_type, key, _location, numel = saved_id[1:]
        dtype = torch.uint8 if storage_type is torch.UntypedStorage else storage_type.dtype
        self.keys.append(str(key))
        untyped_cls: Any = torch.UntypedStorage  # untyped in the stubs
        typed_cls: Any = torch.storage.TypedStorage
        untyped = untyped_cls(int(numel) * dtype.itemsize, device="meta")
        return typed_cls(wrap_storage=untyped, dtype=dtype, _internal=True)


def _descriptor_end(head: bytes, payload: int) -> int | None:
    """End of the data descriptor that closes a record whose payload starts at `payload`: the
    first descriptor signature whose recorded size equals the distance to it."""
    at = head.find(_DESCRIPTOR_SIG, payload)
    while at >= 0 and at + 16 <= len(head):
        if struct.unpack_from("<I", head, at + 8)[0] == at - payload:
            return at + 16
        at = head.find(_DESCRIPTOR_SIG, at + 1)
    return None


@functools.lru_cache(maxsize=4096)
def _unpickle_meta(pickled: bytes) -> StoredLayout | None:
    """The layout `data.pkl` describes, unpickled weights-only onto meta storages, or None;
    `data_offset` counts from the start of the data record. Cached by the pickle's bytes: the
    items of one checkpoint repeat a few dozen shapes (every band, shard and optimizer moment
    of a weight), and the unpickler costs ~0.5 ms a call."""
    unpickler: Any = _weights_only_unpickler.Unpickler(io.BytesIO(pickled))
    storages = _MetaStorages()
    unpickler.persistent_load = storages
    try:
        tensor = unpickler.load()
    except Exception:  # truncated, unexpected or disallowed: the slow path decides
        return None
    if not isinstance(tensor, torch.Tensor) or storages.keys != ["0"]:
        return None
    return StoredLayout(
        tensor.dtype,
        tuple(tensor.shape),
        tensor.is_contiguous(),
        int(tensor.storage_offset()) * tensor.element_size(),
    )


def head_layout(head: bytes) -> StoredLayout | None:
    """The layout of a `torch.save`d tensor from the first bytes of its archive only: walk the
    zip's local headers (torch's writer puts every record's size in a data descriptor after
    it), unpickle `data.pkl` weights-only onto meta storages, and stop at the data record's
    header. A 0-d tensor gets a layout too (`row_range` turns it down without a second parse).
    None whenever anything differs from that shape; `stored_layout` then parses the whole
    archive."""
    pos, prefix, byteorder = 0, "", None
    tensor: StoredLayout | None = None
    while pos + _LOCAL_HEADER.size <= len(head):
        sig, _v, flags, method, _t, _d, _crc, _cs, _us, nlen, elen = _LOCAL_HEADER.unpack_from(
            head, pos
        )
        name = head[pos + 30 : pos + 30 + nlen].decode("utf-8", "replace")
        payload = pos + 30 + nlen + elen
        if sig != _LOCAL_SIG or method != 0 or not flags & 0x8 or payload > len(head):
            return None
        if tensor is not None and name == f"{prefix}data/0":
            if byteorder != sys.byteorder:
                return None
            return replace(tensor, data_offset=payload + tensor.data_offset)
        end = _descriptor_end(head, payload)
        if end is None:
            return None
        if tensor is None:  # the first record is <prefix>/data.pkl
            prefix = name.removesuffix("data.pkl")
            if not name.endswith("/data.pkl"):
                return None
            tensor = _unpickle_meta(head[payload : end - 16])
            if tensor is None:
                return None
        elif not name.startswith(prefix) or "/data/" in name:
            return None
        if name == f"{prefix}byteorder":
            byteorder = head[payload : end - 16].decode("ascii", "replace")
        pos = end
    return None


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


def located(
    layout: StoredLayout | None, req: ReadItem, sinfo: _StorageInfo
) -> tuple[StoredLayout, int, int] | None:
    """(layout, absolute position in the file, byte count) of what `req` reads from the item
    `sinfo` stored with `layout`, or None when that is not one run of bytes."""
    span = (
        None
        if layout is None
        else row_range(layout, tuple(req.storage_offsets), tuple(req.lengths))
    )
    if layout is None or span is None:
        return None
    start, nbytes = span
    return layout, int(sinfo.offset) + layout.data_offset + start, nbytes


def locate_in_head(
    head: bytes, req: ReadItem, sinfo: _StorageInfo
) -> tuple[StoredLayout, int, int] | None:
    """`located` from the item's first bytes only (`head_layout`)."""
    return located(head_layout(head), req, sinfo)


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


class Prefetcher:
    """Asks the kernel to read ahead (`POSIX_FADV_WILLNEED`) the parts of a file a rank will
    read whole, up to `window` bytes beyond the current position. Without it every item costs
    two synchronous trips to the disk (its head, then its data), which on a virtual or network
    disk is what a rank that reads hundreds of items waits for."""

    def __init__(self, fd: int | None, spans: list[tuple[int, int]], *, window: int) -> None:
        self._fd, self._window = fd, window
        self._pieces = [
            (at, min(at + PREFETCH_PIECE, end))
            for start, end in spans
            for at in range(start, end, PREFETCH_PIECE)
        ]
        self._next = 0
        self.advised = 0  # bytes (for tests)

    def advance(self, position: int) -> None:
        """Called before reading at `position` (increasing)."""
        while self._next < len(self._pieces) and self._pieces[self._next][0] < (
            position + self._window
        ):
            start, end = self._pieces[self._next]
            self._next += 1
            if self._fd is not None:
                with contextlib.suppress(OSError):  # advice only
                    os.posix_fadvise(self._fd, start, end - start, os.POSIX_FADV_WILLNEED)
                    self.advised += end - start


def _fileno(stream: IO[bytes]) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a local file
        return None


class RangeReader(FileSystemReader):
    """FileSystemReader with ranged tensor reads; metadata is read once per checkpoint."""

    def __init__(self, path: str | os.PathLike[str], *, fs: Any | None = None) -> None:
        super().__init__(path)
        if fs is not None:  # an object store (s3.S3FileSystem): the path is a URI
            self.fs, self.path = fs, fs.init_path(path)
        self._metadata: Metadata | None = None
        self.ranged_bytes = 0  # bytes read by the fast path (for tests and benchmarks)
        self.files_read: dict[str, int] = {}  # ranged bytes per file name
        self.fallback_items = 0  # items left to DCP's reader
        self.full_parses = 0  # items whose layout needed the whole archive (`stored_layout`)
        self.prefetched_bytes = 0  # bytes the kernel was asked to read ahead
        self._chunk_sizes: dict[tuple[str, tuple[int, ...]], tuple[int, ...]] | None = None

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
        if hasattr(self.fs, "read_into"):  # an object store: ranged GETs, no files opened
            rest, per_file = self._read_remote(per_file, planner), {}
        for relative_path, reqs in per_file.items():
            reqs.sort(key=lambda r: int(self.storage_data[r.storage_index].offset))
            path = self.fs.concat_path(self.path, relative_path)
            with self.fs.create_stream(path, "rb") as stream:
                rest += self._read_file(cast(IO[bytes], stream), reqs, planner)
        self.fallback_items += len(rest)
        if rest:
            return super().read_data(LoadPlan(rest), planner)
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def _read_remote(
        self, per_file: dict[str, list[ReadItem]], planner: LoadPlanner
    ) -> list[ReadItem]:
        """Read the plan with ranged GETs (checkpointing/ranged.py); return what it left."""
        load = ranged.RangedLoad(
            self.fs, str(self.path), self.storage_data, locate=locate_in_head, head_bytes=HEAD_BYTES
        )
        rest = load.run(per_file, planner)
        self.ranged_bytes += sum(load.files_read.values())
        for name, nbytes in load.files_read.items():
            self.files_read[name] = self.files_read.get(name, 0) + nbytes
        return rest

    def _whole(self, req: ReadItem) -> bool:
        """Does `req` read its stored item whole (rows and all)?"""
        if self._chunk_sizes is None:
            self._chunk_sizes = {
                (fqn, tuple(chunk.offsets)): tuple(chunk.sizes)
                for fqn, md in self.read_metadata().state_dict_metadata.items()
                if isinstance(md, TensorStorageMetadata)
                for chunk in md.chunks
            }
        index = req.storage_index
        stored = self._chunk_sizes.get((index.fqn, tuple(index.offset or ())))
        return stored == tuple(req.lengths) and not any(req.storage_offsets)

    def _spans(self, reqs: list[ReadItem]) -> list[tuple[int, int]]:
        """Byte spans of the items read whole, in order; neighbours closer than
        PREFETCH_GAP joined."""
        spans: list[tuple[int, int]] = []
        for req in reqs:
            if req.type != LoadItemType.TENSOR or not self._whole(req):
                continue
            sinfo = self.storage_data[req.storage_index]
            start, end = int(sinfo.offset), int(sinfo.offset) + int(sinfo.length)
            if spans and start - spans[-1][1] <= PREFETCH_GAP:
                spans[-1] = (spans[-1][0], max(end, spans[-1][1]))
            else:
                spans.append((start, end))
        return spans

    def _read_file(
        self, stream: IO[bytes], reqs: list[ReadItem], planner: LoadPlanner
    ) -> list[ReadItem]:
        """Read what can be read as ranges from one file, front to back (reqs in offset
        order); return the rest, for DCP's reader."""
        rest = []
        ahead = Prefetcher(_fileno(stream), self._spans(reqs), window=PREFETCH_WINDOW)
        for req in reqs:
            ahead.advance(int(self.storage_data[req.storage_index].offset))
            located = self._locate(stream, req)
            if located is None:
                rest.append(req)
            else:
                self._read_located(stream, req, *located, planner)
        self.prefetched_bytes += ahead.advised
        return rest

    def _locate(self, stream: IO[bytes], req: ReadItem) -> tuple[StoredLayout, int, int] | None:
        """(layout, absolute position, byte count) of what `req` reads, or None when it is
        not one run of bytes of a stored tensor."""
        sinfo: _StorageInfo = self.storage_data[req.storage_index]
        if req.type != LoadItemType.TENSOR or sinfo.transform_descriptors:
            return None
        stream.seek(int(sinfo.offset))
        layout = head_layout(stream.read(min(HEAD_BYTES, int(sinfo.length))))
        if layout is None:
            self.full_parses += 1
            layout = stored_layout(stream, sinfo)
        return located(layout, req, sinfo)

    def _read_located(
        self,
        stream: IO[bytes],
        req: ReadItem,
        layout: StoredLayout,
        position: int,
        nbytes: int,
        planner: LoadPlanner,
    ) -> None:
        target, out, direct = ranged.landing(planner, req, layout.dtype, nbytes)
        read_exactly(stream, position, out)
        if not direct:
            target.copy_(out)
        planner.commit_tensor(req, target)
        self.ranged_bytes += nbytes
        name = self.storage_data[req.storage_index].relative_path
        self.files_read[name] = self.files_read.get(name, 0) + nbytes

"""A DCP file system whose files start writeback while they are still being written.

DCP writes a rank's whole file into the page cache and fsyncs it at the end, so the disk idles
during the copy and the CPU idles during the flush. `EagerWritebackFileSystem` asks the kernel
to start writing back every `chunk` bytes as soon as they are written
(`posix_fadvise(POSIX_FADV_DONTNEED)`, which on Linux starts asynchronous writeback of dirty
pages and then drops clean ones), so the final fsync finds most of the file already on disk;
closing a file starts writeback of its tail. Durability is unchanged: every file is fsync'd
(`sync_files=True`; `layout.BandedWriter` does it after its last file) before the save returns,
and the marker is written only after that. This module must not decide what is saved or where.
"""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystem

CHUNK_BYTES = 64 * 1024 * 1024


class _EagerWriteback(io.RawIOBase):
    """Write-only wrapper of a buffered file that starts writeback behind the writer."""

    def __init__(self, f: Any, chunk: int) -> None:
        super().__init__()
        self._f, self._chunk = f, chunk
        self._advised = 0  # file offset up to which writeback has been requested

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._f.seekable())

    def tell(self) -> int:
        return int(self._f.tell())

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return int(self._f.seek(offset, whence))

    def fileno(self) -> int:
        return int(self._f.fileno())

    def flush(self) -> None:
        if not self._f.closed:
            self._f.flush()

    def write(self, b: Any) -> int:
        n = int(self._f.write(b))
        if self._f.tell() - self._advised >= self._chunk:
            self._advise()
        return n

    def _advise(self) -> None:
        """Start writeback of everything written since the last call."""
        self._f.flush()
        end = self._f.tell()
        with contextlib.suppress(OSError):  # advice only
            os.posix_fadvise(
                self._f.fileno(), self._advised, end - self._advised, os.POSIX_FADV_DONTNEED
            )
        self._advised = end

    def close(self) -> None:
        if not self.closed:
            if not self._f.closed:
                self._advise()  # the tail too, so it is on its way before the next file
            super().close()  # flushes through to the file first
            self._f.close()


class EagerWritebackFileSystem(FileSystem):
    def __init__(self, chunk: int = CHUNK_BYTES) -> None:
        self.chunk = chunk

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str) -> Generator[Any, None, None]:
        if mode != "wb":
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        with open(path, "wb") as f, _EagerWriteback(f, self.chunk) as stream:
            yield stream

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        """The save's own directory, never its parents (DCP's default creates them): the
        writer directory that holds a save is the checkpoint fence (fence.py), and a rank of a
        superseded attempt must fail here rather than bring it back."""
        with contextlib.suppress(FileExistsError):
            os.mkdir(path)

    def close(self) -> None:
        """Nothing to release (a subclass may hold buffers and threads)."""

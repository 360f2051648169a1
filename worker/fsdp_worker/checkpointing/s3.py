"""DCP's file system on an S3-API object store, through boto3, for `s3://` checkpoint roots.

A file DCP writes is a buffer in memory until it is closed, then one upload (multipart and
concurrent above 16 MiB, s3transfer), with its sha256 as object metadata so that the manifest
needs no second read. Inside `deferred_closes` (layout.BandedWriter) an upload runs in the
background while the next file is filled, and the block waits for all of them: a rank's files
are in the store when DCP's write returns, as fsync makes them durable on a claim. Loads
do not open files: reader.RangeReader hands its plan to checkpointing/ranged.py, which reads
each item with ranged GETs (`read_range`, `read_into`) on this file system's pool (`gets`)
straight into the tensors. A file opened for reading (DCP's `.metadata`, and the files of
items the ranged path leaves to DCP's reader) is downloaded whole (concurrent ranged GETs).
`rename` (DCP's `.metadata` write) is a server-side copy within the writer's own prefix; the
seal is never a rename (contract/s3store.py). This module must not choose checkpoints or seal
them.
"""

from __future__ import annotations

import concurrent.futures as cf
import contextlib
import hashlib
import io
import os
import threading
from collections.abc import Generator, Iterator
from typing import Any

from boto3.s3.transfer import TransferConfig
from torch.distributed.checkpoint.filesystem import FileSystemBase

from fsdp_worker.contract import objstore

MULTIPART = TransferConfig(
    multipart_threshold=16 * 1024 * 1024,
    multipart_chunksize=16 * 1024 * 1024,
    max_concurrency=8,
    use_threads=True,
)


def is_remote(path: str | os.PathLike[str]) -> bool:
    return objstore.is_uri(str(path))


class _Upload(io.BytesIO):
    """A file being written: uploaded when closed."""

    def __init__(self, fs: S3FileSystem, uri: str) -> None:
        super().__init__()
        self._fs, self._uri = fs, uri

    def close(self) -> None:
        if not self.closed:
            data = self.getvalue()
            super().close()
            self._fs.upload(self._uri, data)


class S3FileSystem(FileSystemBase):
    """DCP's FileSystemBase over boto3; paths are `s3://bucket/key` strings."""

    durable_on_close = True  # layout.BandedWriter: no fsync to do

    def __init__(self, s3: Any | None = None) -> None:
        self.s3 = s3 if s3 is not None else objstore.client()
        self._pool: cf.ThreadPoolExecutor | None = None
        self._pending: list[cf.Future[None]] = []
        self._lock = threading.Lock()
        self._gets: cf.ThreadPoolExecutor | None = None

    @staticmethod
    def _split(path: str | os.PathLike[str]) -> tuple[str, str]:
        bucket, _, key = str(path).removeprefix(objstore.SCHEME).partition("/")
        return bucket, key

    def upload(self, uri: str, data: bytes) -> None:
        """Now, or in the background inside `deferred_closes`."""
        with self._lock:
            pool = self._pool
        if pool is None:
            self._put(uri, data)
        else:
            fut = pool.submit(self._put, uri, data)
            with self._lock:
                self._pending.append(fut)

    def _put(self, uri: str, data: bytes) -> None:
        bucket, key = self._split(uri)
        meta = {objstore.SHA256_META: hashlib.sha256(data).hexdigest()}
        self.s3.upload_fileobj(
            io.BytesIO(data), bucket, key, ExtraArgs={"Metadata": meta}, Config=MULTIPART
        )

    @contextlib.contextmanager
    def deferred_closes(self) -> Iterator[None]:
        """Uploads of files closed in the block overlap the next file; all done at its end."""
        with self._lock:
            self._pool = cf.ThreadPoolExecutor(max_workers=2, thread_name_prefix="s3-upload")
            self._pending = []
        try:
            yield
        finally:
            with self._lock:
                pool, pending, self._pool = self._pool, self._pending, None
            assert pool is not None
            pool.shutdown(wait=True)
            for fut in pending:
                fut.result()  # re-raise a failed upload

    @contextlib.contextmanager
    def create_stream(
        self, path: str | os.PathLike[str], mode: str
    ) -> Generator[io.IOBase, None, None]:
        if "w" in mode:
            stream = _Upload(self, str(path))
            try:
                yield stream
            finally:
                stream.close()
            return
        yield io.BytesIO(self.download(str(path)))

    def gets(self) -> cf.ThreadPoolExecutor:
        """The pool ranged reads run on: as many GETs at once as one multipart transfer."""
        with self._lock:
            if self._gets is None:
                self._gets = cf.ThreadPoolExecutor(
                    max_workers=MULTIPART.max_concurrency, thread_name_prefix="s3-get"
                )
            return self._gets

    def _get(self, uri: str, start: int, nbytes: int) -> Any:
        bucket, key = self._split(uri)
        span = f"bytes={start}-{start + nbytes - 1}"
        return self.s3.get_object(Bucket=bucket, Key=key, Range=span)["Body"]

    def read_range(self, uri: str, start: int, nbytes: int) -> bytes:
        """`nbytes` bytes of the object from `start` (fewer only at its end)."""
        if nbytes <= 0:
            return b""
        with contextlib.closing(self._get(uri, start, nbytes)) as body:
            return bytes(body.read())

    def read_into(self, uri: str, start: int, out: memoryview) -> None:
        """Fill `out` with the object's bytes from `start`: one ranged GET, read straight
        into `out` (no intermediate buffer)."""
        if not len(out):
            return
        with contextlib.closing(self._get(uri, start, len(out))) as body:
            got = 0
            while got < len(out):
                n = body.readinto(out[got:])
                if not n:
                    raise OSError(f"{uri}: short read at {start + got}, wanted {len(out)} bytes")
                got += n

    def download(self, uri: str) -> bytes:
        bucket, key = self._split(uri)
        buf = io.BytesIO()
        self.s3.download_fileobj(bucket, key, buf, Config=MULTIPART)
        return buf.getvalue()

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return f"{str(path).rstrip('/')}/{suffix}"

    def init_path(self, path: str | os.PathLike[str]) -> str:
        return str(path)

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        bucket, key = self._split(path)
        _, new_key = self._split(new_path)
        self.s3.copy_object(Bucket=bucket, Key=new_key, CopySource={"Bucket": bucket, "Key": key})
        self.s3.delete_object(Bucket=bucket, Key=key)

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        """Prefixes need no creating."""

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return is_remote(checkpoint_id)

    def exists(self, path: str | os.PathLike[str]) -> bool:
        bucket, key = self._split(path)
        try:
            self.s3.head_object(Bucket=bucket, Key=key)
        except Exception as exc:
            if objstore.status_of(exc) == 404:
                return False
            raise
        return True

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        bucket, key = self._split(path)
        self.s3.delete_object(Bucket=bucket, Key=key)

    def close(self) -> None:
        """Stop the ranged reads' pool (the client's connections close with the process)."""
        with self._lock:
            gets, self._gets = self._gets, None
        if gets is not None:
            gets.shutdown(wait=False, cancel_futures=True)

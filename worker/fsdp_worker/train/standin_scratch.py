"""Where the stand-in's ranks leave each other notes: the step to save on SIGTERM, that the gang
met. The real worker's ranks agree through collectives; the stand-in's step on their own clocks
and agree through small files beside the checkpoints: on the claim, files in its root; on an
object store (no claim is mounted), objects under the root's prefix. Neither is a checkpoint:
selection and the fence never look at them. Torch-free.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from fsdp_worker.contract import catalog, objstore


class Scratch(Protocol):
    """Small notes by name, shared by every rank of the job."""

    def write_atomic(self, name: str, data: bytes) -> None: ...
    def exists(self, name: str) -> bool: ...
    def read_bytes(self, name: str) -> bytes: ...
    def remove(self, name: str) -> None: ...


class ClaimScratch:
    """Files in the claim's root, as the stand-in has always kept them."""

    def __init__(self, storage: catalog.LocalStorage) -> None:
        self.storage = storage

    def write_atomic(self, name: str, data: bytes) -> None:
        self.storage.write_atomic(name, data)

    def exists(self, name: str) -> bool:
        return self.storage.exists(name)

    def read_bytes(self, name: str) -> bytes:
        return self.storage.read_bytes(name)

    def remove(self, name: str) -> None:
        path = self.storage.resolve(name)
        if os.path.exists(path):
            os.unlink(path)


class BucketScratch:
    """Objects under an `s3://` root's prefix (a PUT is whole or absent: atomic already)."""

    def __init__(self, s3: Any, loc: objstore.Location) -> None:
        self.s3, self.loc = s3, loc

    def write_atomic(self, name: str, data: bytes) -> None:
        self.s3.put_object(Bucket=self.loc.bucket, Key=self.loc.key(name), Body=data)

    def exists(self, name: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.loc.bucket, Key=self.loc.key(name))
        except Exception as exc:
            if objstore.status_of(exc) == 404:
                return False
            raise
        return True

    def read_bytes(self, name: str) -> bytes:
        got = self.s3.get_object(Bucket=self.loc.bucket, Key=self.loc.key(name))
        return bytes(got["Body"].read())

    def remove(self, name: str) -> None:
        self.s3.delete_object(Bucket=self.loc.bucket, Key=self.loc.key(name))

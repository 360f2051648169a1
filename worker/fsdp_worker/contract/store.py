"""The storage seam of the claim path: one checkpoint root, read and changed by its writer.

Everything a worker does to a checkpoint root goes through a `CheckpointStore`: the read view
selection applies its rules to (`storage`: list steps, read marker and manifest), where a
save is written (`partial`), its manifest, the seal (`publish`), set aside, retention
delete, and the fence (`take_over`, `newer_writer`, `refusal`). `LocalStore` is the claim:
fence.py's renames through the writer directory. `s3store.S3Store` is an object store:
conditional writes, no rename. A third backend (GCS, Azure) is a new class with these methods
and a scheme in `open_store`, nothing else. Torch-free; it must not choose checkpoints.
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import shutil
from collections.abc import Sequence
from typing import Any, Protocol

from fsdp_worker.contract import catalog, fence, objstore, s3store, selection

log = logging.getLogger(__name__)


class CheckpointStore(Protocol):
    """A checkpoint root: what its readers see, and what its one writer may change."""

    root: str

    @property
    def storage(self) -> catalog.Storage:
        """The root's sealed steps as they are now, for selection's rules."""
        ...

    def probe(self, me: fence.Writer) -> None: ...
    def take_over(self, me: fence.Writer) -> None: ...
    def remove_abandoned(self, me: fence.Writer) -> None: ...
    def partial(self, me: fence.Writer, step: int) -> str: ...
    def clear_partial(self, me: fence.Writer, step: int) -> None: ...
    def write_file(self, me: fence.Writer, step: int, name: str, data: bytes) -> None: ...
    def manifest(
        self, me: fence.Writer, step: int, *, checksums: bool
    ) -> dict[str, catalog.FileEntry]: ...
    def publish(self, me: fence.Writer, *, marker: catalog.Marker) -> str: ...
    def set_aside(self, me: fence.Writer, *, step: int) -> str: ...
    def delete(self, me: fence.Writer, *, path: str) -> None: ...
    def locate(self, step_path: str) -> str: ...
    def newer_writer(self, me: fence.Writer) -> bool: ...
    def refusal(self, me: fence.Writer, act: str) -> fence.Superseded: ...


class LocalStore:
    """A root on a POSIX claim: sealed by one rename (fence.py)."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._storage = catalog.LocalStorage(root)

    @property
    def storage(self) -> catalog.LocalStorage:
        return self._storage

    def probe(self, me: fence.Writer) -> None:
        """A rename is atomic on every POSIX file system: nothing to ask."""

    def take_over(self, me: fence.Writer) -> None:
        fence.take_over(self._storage, self.root, me)

    def remove_abandoned(self, me: fence.Writer) -> None:
        """Hold the root (idempotent) and delete partial saves of versions before writer
        directories; earlier writers' own are cleared by the takeover."""
        self.take_over(me)
        ours = (me.attempt, me.generation)
        for name in self._storage.list_dirs(self.root):
            writer = catalog.partial_writer(name)
            if writer is not None and writer < ours:
                log.info("removing %s, abandoned by an earlier writer", name)
                path = self._storage.resolve(posixpath.join(self.root, name))
                shutil.rmtree(path, ignore_errors=True)

    def partial(self, me: fence.Writer, step: int) -> str:
        return posixpath.join(self.root, me.partial(step))

    def clear_partial(self, me: fence.Writer, step: int) -> None:
        shutil.rmtree(self._storage.resolve(self.partial(me, step)), ignore_errors=True)

    def write_file(self, me: fence.Writer, step: int, name: str, data: bytes) -> None:
        """A small file of `me`'s save of `step`, durable on return (a writer without DCP, such
        as the stand-in). The partial is made, never its parents: the writer directory above it
        is the fence, and a superseded writer must not bring it back (FileNotFoundError)."""
        path = self._storage.resolve(posixpath.join(self.partial(me, step), name))
        with contextlib.suppress(FileExistsError):
            os.mkdir(os.path.dirname(path))
        with open(path, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())

    def manifest(
        self, me: fence.Writer, step: int, *, checksums: bool
    ) -> dict[str, catalog.FileEntry]:
        return catalog.build_manifest(self._storage, self.partial(me, step), checksums=checksums)

    def publish(self, me: fence.Writer, *, marker: catalog.Marker) -> str:
        return fence.publish(self._storage, self.root, me, marker=marker)

    def set_aside(self, me: fence.Writer, *, step: int) -> str:
        return fence.set_aside(self._storage, self.root, me, step=step)

    def delete(self, me: fence.Writer, *, path: str) -> None:
        fence.delete(self._storage, self.root, me, path=path)

    def locate(self, step_path: str) -> str:
        return step_path

    def newer_writer(self, me: fence.Writer) -> bool:
        return fence.newer_writer(self._storage, self.root, me)

    def refusal(self, me: fence.Writer, act: str) -> fence.Superseded:
        return fence.refusal(self._storage, self.root, me, act)


def open_store(root: str, **kwargs: Any) -> CheckpointStore:
    """The backend a root names: a path is the claim, `s3://` an object store. ValueError
    (naming checkpoint.root, the value and what is allowed) for any other scheme."""
    if objstore.is_uri(root):
        return s3store.S3Store(root, **kwargs)
    return LocalStore(root)


def check_root(root: str) -> None:
    """ValueError for a root no backend takes (parsed, nothing contacted)."""
    if objstore.is_uri(root):
        objstore.parse_root(root)


def quarantine_corrupt(
    store: CheckpointStore, rejected: Sequence[selection.Candidate], *, me: fence.Writer
) -> tuple[int, ...]:
    """Set aside the candidates that failed verification; returns their steps. Superseded
    (changing nothing more) when a newer writer took the root over; one that cannot be set
    aside otherwise is skipped."""
    moved = []
    for c in rejected:
        if c.reason not in selection.CORRUPT:
            continue
        try:
            store.set_aside(me, step=c.step)
        except fence.Superseded:
            raise
        except (catalog.CatalogError, OSError):
            continue
        moved.append(c.step)
    return tuple(moved)

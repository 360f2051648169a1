"""The checkpoint catalog: step directory names, the storage they live in, the marker format.

Shared by the operator (which picks the resume checkpoint) and the worker (which writes markers
and applies retention). Torch-free (the operator image has none): the marker is a pydantic
model. It must never unpickle anything (DCP's `.metadata` is pickled; only the JSON marker is
read here), never import torch/numpy, and never write a step directory's contents other than the
marker.

Layout: `<root>/step-<N>/` holds one checkpoint. It counts only when `COMPLETE.json` (the
marker) exists, parses strictly, and its manifest matches the files present. Any other name
under the root (writer directories with their partial saves, quarantined steps) is ignored by
`selection.list_checkpoints`: which checkpoints count, and which one is resumed or kept, is
selection.py's. Who may change the root, and how, is fence.py's.

With `contract.Proof.DCP_METADATA` (trainers that know nothing of the marker, torchtitan's
layout) a step directory counts when DCP's `.metadata` is a non-empty regular file. That file
is pickled: it is never read here, only its presence and size are checked.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import stat
import tempfile
from typing import Annotated, Any, Protocol

import pydantic
import pydantic.dataclasses

from fsdp_worker.contract import wire

MARKER_NAME = "COMPLETE.json"
DCP_METADATA_NAME = ".metadata"  # DCP's own index, written by its coordinator after all ranks
MARKER_FORMAT = 1
STEP_PREFIX = "step-"
STEP_DIR_RE = re.compile(r"^step-(0|[1-9][0-9]{0,17})$")
PARTIAL_INFIX = ".partial-a"  # step-<N>.partial-a<attempt>[g<gen>]: a save in flight
QUARANTINE_INFIX = ".quarantined-"  # step-<N>.quarantined-<k>: set aside, ignored here
MAX_MARKER_BYTES = 16 * 1024 * 1024  # a marker is small; refuse to parse anything huge
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_READ_CHUNK = 8 * 1024 * 1024


class CatalogError(Exception):
    """A marker that does not parse, or a storage path that escapes its root."""


def step_dir_name(step: int) -> str:
    return f"{STEP_PREFIX}{step}"


def partial_dir_name(*, step: int, attempt: int, generation: int = 0) -> str:
    """Where `attempt` saves `step` before publishing it. From a restart in place's first
    generation on, the generation is named too: a rank 0 of an earlier generation still saving
    (its pod frozen, then thawed, while a spare took its place) writes beside the save of the
    generation that replaced it, never into it."""
    return f"{STEP_PREFIX}{step}{PARTIAL_INFIX}{attempt}" + (f"g{generation}" if generation else "")


def partial_writer(name: str) -> tuple[int, int] | None:
    """The (attempt, generation) whose save `name` is, or None for any other name."""
    _, sep, rest = name.partition(PARTIAL_INFIX)
    attempt, g, generation = rest.partition("g")
    if not sep or not attempt.isdigit() or (g and not generation.isdigit()):
        return None
    return int(attempt), int(generation or 0)


# --- storage ------------------------------------------------------------------------------------


class Storage(Protocol):
    """The few operations the catalog needs, so an object store can follow the filesystem."""

    def list_dirs(self, root: str) -> list[str]: ...
    def list_files(self, path: str) -> dict[str, int]: ...
    def read_bytes(self, path: str) -> bytes: ...
    def exists(self, path: str) -> bool: ...
    def rename(self, src: str, dst: str) -> None: ...


class LocalStorage:
    """Filesystem storage; every path must resolve (realpath) inside `base`.

    Paths may be absolute or relative to `base`. Symlinks are not followed out of `base`, and
    only regular files count in `list_files` (a symlinked shard reads as missing).
    """

    def __init__(self, base: str) -> None:
        self.base = os.path.realpath(base)

    def resolve(self, path: str) -> str:
        full = os.path.realpath(os.path.join(self.base, path))
        if os.path.commonpath([self.base, full]) != self.base:
            raise CatalogError(f"path {path!r} escapes the checkpoint root {self.base!r}")
        return full

    def list_dirs(self, root: str) -> list[str]:
        full = self.resolve(root)
        try:
            entries = list(os.scandir(full))
        except FileNotFoundError:
            return []
        return sorted(e.name for e in entries if e.is_dir(follow_symlinks=False))

    def list_files(self, path: str) -> dict[str, int]:
        top = self.resolve(path)
        out: dict[str, int] = {}
        for dirpath, _dirs, files in os.walk(top, followlinks=False):
            for name in files:
                st = os.lstat(os.path.join(dirpath, name))
                if stat.S_ISREG(st.st_mode):
                    rel = os.path.relpath(os.path.join(dirpath, name), top)
                    out[rel.replace(os.sep, "/")] = st.st_size
        return out

    def read_bytes(self, path: str) -> bytes:
        with open(self.resolve(path), "rb") as f:
            return f.read()

    def sha256(self, path: str) -> str:
        digest = hashlib.sha256()
        with open(self.resolve(path), "rb") as f:
            while chunk := f.read(_READ_CHUNK):
                digest.update(chunk)
        return digest.hexdigest()

    def exists(self, path: str) -> bool:
        return os.path.lexists(self.resolve(path))

    def rename(self, src: str, dst: str) -> None:
        # os.rename of a directory onto an existing non-empty one fails: no silent overwrite.
        os.rename(self.resolve(src), self.resolve(dst))

    def write_atomic(self, path: str, data: bytes) -> None:
        """Write a file so readers see the old state or the whole new file, durably."""
        full = self.resolve(path)
        directory = os.path.dirname(full)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.rename(tmp, full)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        fsync_path(directory)


def fsync_path(path: str) -> None:
    """Make a file's data, or a directory's entries, durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# --- the marker ---------------------------------------------------------------------------------


Count = Annotated[int, pydantic.Field(ge=0)]


@pydantic.dataclasses.dataclass(frozen=True)
class FileEntry:
    size: Count
    sha256: Annotated[str, pydantic.Field(pattern=_SHA256_RE.pattern)] | None = None


@pydantic.dataclasses.dataclass(frozen=True)
class Marker:
    """The completion marker of one checkpoint; written last, by rank 0, atomically. Read
    strictly: every field present with its type (job_uid may be absent: markers before uids)."""

    step: Count
    attempt: Count
    world_size: Annotated[int, pydantic.Field(ge=1)]
    global_batch_size: Annotated[int, pydantic.Field(ge=1)]
    samples_consumed: Count
    resumed_from_step: Count | None
    time: float
    torch_version: str
    config_hash: str
    files: dict[str, FileEntry]
    job_uid: str | None = None  # the FSDPJob object that wrote it; None: written before uids

    @pydantic.model_validator(mode="before")
    @classmethod
    def _format_given(cls, doc: Any) -> Any:
        """A marker says its format: a JSON object without it is not a marker."""
        if isinstance(doc, dict) and doc.get("format") != MARKER_FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {MARKER_FORMAT}")
        return doc

    @pydantic.field_validator("files")
    @classmethod
    def _inside_the_step(
        cls, files: dict[str, FileEntry], info: pydantic.ValidationInfo
    ) -> dict[str, FileEntry]:
        # Read, a marker lists its files; written, an empty manifest (the writer's directory
        # taken over under it) fails at the fenced publish, as Superseded, not here.
        if not files and info.mode == "json":
            raise ValueError("it must list at least one file")
        for name in files:
            parts = name.split("/")
            if name.startswith("/") or ".." in parts or name == MARKER_NAME:
                raise ValueError(f"invalid file name {name!r}")
        return files

    def to_json(self) -> bytes:
        doc = {**wire.to_doc(self), "format": MARKER_FORMAT}
        return json.dumps(doc, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Marker:
        """Strict parse: JSON only, every field present with the right type."""
        if len(raw) > MAX_MARKER_BYTES:
            raise CatalogError(f"marker is {len(raw)} bytes, over {MAX_MARKER_BYTES}")
        return wire.parse(cls, raw, what="marker", error=CatalogError)


def quarantine(storage: Storage, root: str, step: int) -> str:
    """Rename step-<N> to a name `selection.list_checkpoints` ignores; returns the new path. The
    operator's (between attempts); a rank sets aside through its writer (fence.set_aside)."""
    src = posixpath.join(root, step_dir_name(step))
    if not storage.exists(src):
        raise CatalogError(f"{src} does not exist")
    for k in range(1, 10_000):
        dst = posixpath.join(root, f"{step_dir_name(step)}{QUARANTINE_INFIX}{k}")
        if not storage.exists(dst):
            storage.rename(src, dst)
            return dst
    raise CatalogError(f"too many quarantined copies of {src}")


def build_manifest(
    storage: LocalStorage, step_path: str, *, checksums: bool
) -> dict[str, FileEntry]:
    """The manifest of a finished save: every file with its size (and sha256 if asked)."""
    files = storage.list_files(step_path)
    files.pop(MARKER_NAME, None)
    return {
        name: FileEntry(
            size=size,
            sha256=storage.sha256(posixpath.join(step_path, name)) if checksums else None,
        )
        for name, size in sorted(files.items())
    }

"""The checkpoint catalog: step directory names, the storage they live in, the marker format.

Shared by the operator (which picks the resume checkpoint) and the worker (which writes markers
and applies retention). Standard library only: the operator image has no torch. It must never
unpickle anything (DCP's `.metadata` is pickled; only the JSON marker is read here), never
import torch/numpy/pydantic, and never write a step directory's contents other than the marker.

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

import dataclasses
import hashlib
import json
import os
import posixpath
import re
import stat
import tempfile
from dataclasses import dataclass
from typing import Any, Protocol

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


@dataclass(frozen=True)
class FileEntry:
    size: int
    sha256: str | None = None


@dataclass(frozen=True)
class Marker:
    """The completion marker of one checkpoint; written last, by rank 0, atomically."""

    step: int
    attempt: int
    world_size: int
    global_batch_size: int
    samples_consumed: int
    resumed_from_step: int | None
    time: float
    torch_version: str
    config_hash: str
    files: dict[str, FileEntry]
    job_uid: str | None = None  # the FSDPJob object that wrote it; None: written before uids

    def to_json(self) -> bytes:
        doc: dict[str, Any] = dataclasses.asdict(self)
        doc["format"] = MARKER_FORMAT
        return json.dumps(doc, sort_keys=True, indent=1).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Marker:
        """Strict parse: JSON only, every field present with the right type."""
        if len(raw) > MAX_MARKER_BYTES:
            raise CatalogError(f"marker is {len(raw)} bytes, over {MAX_MARKER_BYTES}")
        try:
            doc = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            raise CatalogError(f"marker is not JSON: {exc}") from exc
        if not isinstance(doc, dict):
            raise CatalogError("marker is not a JSON object")
        if doc.get("format") != MARKER_FORMAT:
            raise CatalogError(f"marker format {doc.get('format')!r}, expected {MARKER_FORMAT}")
        return cls(
            step=_int(doc, "step"),
            attempt=_int(doc, "attempt"),
            world_size=_int(doc, "world_size", minimum=1),
            global_batch_size=_int(doc, "global_batch_size", minimum=1),
            samples_consumed=_int(doc, "samples_consumed"),
            resumed_from_step=_opt_int(doc, "resumed_from_step"),
            time=_float(doc, "time"),
            torch_version=_str(doc, "torch_version"),
            config_hash=_str(doc, "config_hash"),
            files=_files(doc),
            job_uid=_opt_str(doc, "job_uid"),
        )


def _int(doc: dict[str, Any], key: str, *, minimum: int = 0) -> int:
    value = doc.get(key)
    if type(value) is not int or value < minimum:
        raise CatalogError(f"marker field {key!r}={value!r} must be an integer >= {minimum}")
    return value


def _opt_int(doc: dict[str, Any], key: str) -> int | None:
    if key not in doc:
        raise CatalogError(f"marker field {key!r} is missing")
    return None if doc[key] is None else _int(doc, key)


def _float(doc: dict[str, Any], key: str) -> float:
    value = doc.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise CatalogError(f"marker field {key!r}={value!r} must be a number")
    return float(value)


def _str(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise CatalogError(f"marker field {key!r}={value!r} must be a string")
    return value


def _opt_str(doc: dict[str, Any], key: str) -> str | None:
    return None if doc.get(key) is None else _str(doc, key)


def _files(doc: dict[str, Any]) -> dict[str, FileEntry]:
    raw = doc.get("files")
    if not isinstance(raw, dict) or not raw:
        raise CatalogError("marker field 'files' must be a non-empty object")
    out: dict[str, FileEntry] = {}
    for name, entry in raw.items():
        parts = name.split("/")
        if name.startswith("/") or ".." in parts or name == MARKER_NAME:
            raise CatalogError(f"marker lists an invalid file name {name!r}")
        if not isinstance(entry, dict):
            raise CatalogError(f"marker entry for {name!r} must be an object")
        size = _int(entry, "size")
        digest = entry.get("sha256")
        if digest is not None and (not isinstance(digest, str) or not _SHA256_RE.match(digest)):
            raise CatalogError(f"marker entry for {name!r} has a malformed sha256")
        out[name] = FileEntry(size=size, sha256=digest)
    return out


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

"""The checkpoint catalog: marker format, listing, verification, selection, retention choice.

Shared by the operator (which picks the resume checkpoint) and the worker (which writes markers
and applies retention). Torch-free (the operator image has none): the marker is a pydantic
model. It must never unpickle anything (DCP's `.metadata` is pickled; only the JSON marker is
read here), never import torch/numpy, and never write a step directory's contents other than the
marker.

Layout: `<root>/step-<N>/` holds one checkpoint. It counts only when `COMPLETE.json` (the
marker) exists, parses strictly, and its manifest matches the files present. Any other name
under the root (writer directories with their partial saves, quarantined steps) is ignored by
`list_checkpoints`. Who may change the root, and how, is fence.py's.

With `contract.Proof.DCP_METADATA` (trainers that know nothing of the marker, torchtitan's
layout) a step directory counts when DCP's `.metadata` is a non-empty regular file. That file
is pickled: it is never read here, only its presence and size are checked.
"""

from __future__ import annotations

import enum
import hashlib
import json
import os
import posixpath
import re
import stat
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Protocol

import pydantic
import pydantic.dataclasses

from fsdp_worker import contract
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


class RejectReason(enum.StrEnum):
    """Why a step directory cannot be resumed from."""

    NO_MARKER = "NoMarker"  # incomplete: a save never finished (or is still in flight)
    BAD_MARKER = "BadMarker"  # marker unreadable, malformed, or for another step
    MANIFEST_MISMATCH = "ManifestMismatch"  # a file missing, truncated, or unexpected
    CHECKSUM_MISMATCH = "ChecksumMismatch"  # sizes match but content does not (deep only)
    CONFIG_HASH_MISMATCH = "ConfigHashMismatch"  # written by a different training config
    LINEAGE = "Lineage"  # written by a superseded attempt after the restart point
    OTHER_JOB = "OtherJob"  # written by another FSDPJob object (e.g. deleted, same name)


# A checkpoint that failed verification this way is set aside (quarantined), never deleted:
# it is evidence. The other reasons say a checkpoint is not this attempt's to load, not broken.
CORRUPT = frozenset(
    {RejectReason.BAD_MARKER, RejectReason.MANIFEST_MISMATCH, RejectReason.CHECKSUM_MISMATCH}
)


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


# --- verification and selection -----------------------------------------------------------------


@dataclass(frozen=True)
class Lineage:
    """The attempt that is running (or just failed) and the step it resumed from (None: fresh).

    Allowed: checkpoints of `attempt` itself, and of earlier attempts only at steps
    <= `resumed_from_step`. An attempt that started fresh (None) superseded every earlier one,
    so no earlier-attempt checkpoint qualifies. Later attempts' markers are always refused.
    """

    attempt: int
    resumed_from_step: int | None
    job_uid: str | None = None
    """The FSDPJob object running now; None skips the job check (tests, legacy callers)."""
    other_jobs: bool = False
    """Whether another job's checkpoints may be resumed (spec.checkpoint.resumeFromPreviousJobs):
    then they count like an earlier attempt's, before this job's first attempt or at or before
    the step it resumed from."""

    def same_job(self, marker: Marker) -> bool:
        """Written by this job. A marker without a uid predates uids: this job's own once the
        job has run (it may have written it), another's for a job that never started."""
        if self.job_uid is None or marker.job_uid == self.job_uid:
            return True
        return marker.job_uid is None and self.attempt > 0


@dataclass(frozen=True)
class Candidate:
    step: int
    path: str
    marker: Marker | None
    ok: bool
    reason: str  # a RejectReason member, or "" when ok
    detail: str = ""


def lineage_allows(marker: Marker, lineage: Lineage) -> bool:
    if not lineage.same_job(marker):
        before = lineage.resumed_from_step
        return lineage.attempt == 0 or (before is not None and marker.step <= before)
    if marker.attempt == lineage.attempt:
        return True
    if marker.attempt > lineage.attempt or lineage.resumed_from_step is None:
        return False
    return marker.step <= lineage.resumed_from_step


def verify(
    storage: Storage,
    step_path: str,
    *,
    config_hash: str | None = None,
    lineage: Lineage | None = None,
    deep: bool = False,
    proof: contract.Proof = contract.Proof.MARKER,
) -> Candidate:
    """Check one step directory: marker, manifest (sizes; sha256 when deep), config, lineage;
    or, with `proof` DCP_METADATA, only that DCP's `.metadata` is there (nothing else is known)."""
    match = STEP_DIR_RE.match(posixpath.basename(step_path.rstrip("/")))
    step = int(match.group(1)) if match else -1

    def reject(reason: RejectReason, detail: str, marker: Marker | None = None) -> Candidate:
        return Candidate(step, step_path, marker, ok=False, reason=reason, detail=detail)

    if proof is contract.Proof.DCP_METADATA:
        size = storage.list_files(step_path).get(DCP_METADATA_NAME, 0)
        if size <= 0:
            detail = f"DCP {DCP_METADATA_NAME} absent or empty: the save never completed"
            return reject(RejectReason.NO_MARKER, detail)
        return Candidate(step, step_path, None, ok=True, reason="")

    marker_path = posixpath.join(step_path, MARKER_NAME)
    if not storage.exists(marker_path):
        return reject(RejectReason.NO_MARKER, f"{MARKER_NAME} absent: the save never completed")
    try:
        marker = Marker.from_json(storage.read_bytes(marker_path))
    except (CatalogError, OSError) as exc:
        return reject(RejectReason.BAD_MARKER, str(exc))
    if marker.step != step:
        return reject(RejectReason.BAD_MARKER, f"marker says step {marker.step}", marker)
    problem = _manifest_problem(storage, step_path=step_path, marker=marker, deep=deep)
    if problem:
        reason = RejectReason.CHECKSUM_MISMATCH if "sha256" in problem else None
        return reject(reason or RejectReason.MANIFEST_MISMATCH, problem, marker)
    if config_hash is not None and marker.config_hash != config_hash:
        detail = (
            f"written with training-config hash {marker.config_hash}, the running config has "
            f"{config_hash} (globalBatchSize={marker.global_batch_size} then)"
        )
        return reject(RejectReason.CONFIG_HASH_MISMATCH, detail, marker)
    if lineage is not None and not lineage.same_job(marker) and not lineage.other_jobs:
        detail = f"written by another FSDPJob (uid {marker.job_uid or 'unrecorded'})"
        return reject(RejectReason.OTHER_JOB, detail, marker)
    if lineage is not None and not lineage_allows(marker, lineage):
        detail = (
            f"written by attempt {marker.attempt}; attempt {lineage.attempt} resumed from step "
            f"{lineage.resumed_from_step}"
        )
        return reject(RejectReason.LINEAGE, detail, marker)
    return Candidate(step, step_path, marker, ok=True, reason="")


def _manifest_problem(storage: Storage, *, step_path: str, marker: Marker, deep: bool) -> str:
    present = storage.list_files(step_path)
    present.pop(MARKER_NAME, None)
    for name, entry in sorted(marker.files.items()):
        if name not in present:
            return f"file {name} listed in the marker is missing"
        if present[name] != entry.size:
            return f"file {name} is {present[name]} bytes, the marker says {entry.size}"
    extra = sorted(set(present) - set(marker.files))
    if extra:
        return f"files not in the marker: {', '.join(extra[:5])}"
    if deep:
        for name, entry in sorted(marker.files.items()):
            if entry.sha256 is None:
                continue
            digest = _sha256(storage, posixpath.join(step_path, name))
            if digest != entry.sha256:
                return f"file {name} sha256 {digest[:12]} differs from the marker's"
    return ""


def _sha256(storage: Storage, path: str) -> str:
    fast = getattr(storage, "sha256", None)
    if callable(fast):
        return str(fast(path))
    return hashlib.sha256(storage.read_bytes(path)).hexdigest()


def list_checkpoints(
    storage: Storage,
    root: str,
    *,
    config_hash: str | None = None,
    lineage: Lineage | None = None,
    deep: bool = False,
    proof: contract.Proof = contract.Proof.MARKER,
) -> list[Candidate]:
    """Every `step-<N>` directory under root, newest first, each verified."""
    steps = sorted(
        (int(m.group(1)), name)
        for name in storage.list_dirs(root)
        if (m := STEP_DIR_RE.match(name))
    )
    return [
        verify(
            storage,
            posixpath.join(root, name),
            config_hash=config_hash,
            lineage=lineage,
            deep=deep,
            proof=proof,
        )
        for _step, name in reversed(steps)
    ]


def select(
    storage: Storage,
    root: str,
    *,
    config_hash: str | None,
    lineage: Lineage | None,
    deep: bool = False,
    proof: contract.Proof = contract.Proof.MARKER,
) -> tuple[Candidate | None, list[Candidate]]:
    """The newest checkpoint that passes, and every rejected one (newest first, with reasons)."""
    candidates = list_checkpoints(
        storage, root, config_hash=config_hash, lineage=lineage, deep=deep, proof=proof
    )
    chosen = next((c for c in candidates if c.ok), None)
    return chosen, [c for c in candidates if not c.ok]


def auto_lineage(
    rules: contract.ResumeRules | None, *, attempt: int, job_uid: str | None, other_jobs: bool
) -> Lineage:
    """The lineage a rank choosing its own resume point (``auto``) applies: the operator's
    ``rules`` when it sent them, else only "no checkpoint of a later attempt" (without the
    restart chain, nothing finer is known)."""
    if rules is None:
        return Lineage(
            attempt=attempt, resumed_from_step=sys.maxsize, job_uid=job_uid, other_jobs=other_jobs
        )
    return Lineage(
        attempt=rules.attempt,
        resumed_from_step=rules.resumed_from_step,
        job_uid=job_uid,
        other_jobs=other_jobs,
    )


def fresh_start_refusal(
    root: str, rules: contract.ResumeRules | None, rejected: Sequence[Candidate]
) -> str | None:
    """Why starting from step 0 would be wrong when nothing under ``root`` qualifies: a rank 0
    reported a step sealed (``rules.expect_step``). None when a fresh start is what is left."""
    if rules is None or rules.expect_step is None:
        return None
    seen = "; ".join(f"{c.path}: {c.reason} {c.detail}".strip() for c in rejected[:3])
    return (
        f"no checkpoint to resume from under {root}, but step {rules.expect_step} was sealed "
        f"before this restart (after attempt {rules.attempt}); refusing to train again from "
        f"step 0. {'Found and refused: ' + seen if seen else 'The directory holds none.'} "
        "Check that checkpoint.claimName is the claim those checkpoints were written to and "
        "that it mounts at checkpoint.root on every pod."
    )


def quarantine(storage: Storage, root: str, step: int) -> str:
    """Rename step-<N> to a name `list_checkpoints` ignores; returns the new path. The
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


def retention_victims(candidates: Sequence[Candidate], *, keep: int) -> list[Candidate]:
    """Complete, usable checkpoints beyond the newest `keep`; incomplete ones are never chosen.

    A directory without a marker may be a save still in flight, and a rejected one is evidence
    for the operator, so only `ok` candidates are ever victims; the newest is always kept.
    """
    usable = sorted((c for c in candidates if c.ok), key=lambda c: c.step, reverse=True)
    return usable[max(keep, 1) :]


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

"""Which checkpoints count, and which one a restart resumes from: verification of a step
directory against its marker, the job's lineage and config, then selection and retention.

Shared by the operator (which picks the resume checkpoint and sets corrupt ones aside) and the
worker (a rank choosing its own under ``auto``, and retention after a save). Apart from the
catalog (catalog.py: names, storage, the marker format) because these are the rules, not the
format: they read only through `catalog.Storage` and never write. Standard library only, as the
catalog: the operator image has no torch; nothing here unpickles (DCP's `.metadata` is only
checked for presence and size).
"""

from __future__ import annotations

import enum
import hashlib
import posixpath
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from fsdp_worker import contract
from fsdp_worker.contract import catalog


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

    def same_job(self, marker: catalog.Marker) -> bool:
        """Written by this job. A marker without a uid predates uids: this job's own once the
        job has run (it may have written it), another's for a job that never started."""
        if self.job_uid is None or marker.job_uid == self.job_uid:
            return True
        return marker.job_uid is None and self.attempt > 0


@dataclass(frozen=True)
class Candidate:
    step: int
    path: str
    marker: catalog.Marker | None
    ok: bool
    reason: str  # a RejectReason member, or "" when ok
    detail: str = ""


def lineage_allows(marker: catalog.Marker, lineage: Lineage) -> bool:
    if not lineage.same_job(marker):
        before = lineage.resumed_from_step
        return lineage.attempt == 0 or (before is not None and marker.step <= before)
    if marker.attempt == lineage.attempt:
        return True
    if marker.attempt > lineage.attempt or lineage.resumed_from_step is None:
        return False
    return marker.step <= lineage.resumed_from_step


def verify(
    storage: catalog.Storage,
    step_path: str,
    *,
    config_hash: str | None = None,
    lineage: Lineage | None = None,
    deep: bool = False,
    proof: contract.Proof = contract.Proof.MARKER,
) -> Candidate:
    """Check one step directory: marker, manifest (sizes; sha256 when deep), config, lineage;
    or, with `proof` DCP_METADATA, only that DCP's `.metadata` is there (nothing else is known)."""
    match = catalog.STEP_DIR_RE.match(posixpath.basename(step_path.rstrip("/")))
    step = int(match.group(1)) if match else -1

    def reject(
        reason: RejectReason, detail: str, marker: catalog.Marker | None = None
    ) -> Candidate:
        return Candidate(step, step_path, marker, ok=False, reason=reason, detail=detail)

    if proof is contract.Proof.DCP_METADATA:
        size = storage.list_files(step_path).get(catalog.DCP_METADATA_NAME, 0)
        if size <= 0:
            detail = f"DCP {catalog.DCP_METADATA_NAME} absent or empty: the save never completed"
            return reject(RejectReason.NO_MARKER, detail)
        return Candidate(step, step_path, None, ok=True, reason="")

    marker_path = posixpath.join(step_path, catalog.MARKER_NAME)
    if not storage.exists(marker_path):
        return reject(
            RejectReason.NO_MARKER, f"{catalog.MARKER_NAME} absent: the save never completed"
        )
    try:
        marker = catalog.Marker.from_json(storage.read_bytes(marker_path))
    except (catalog.CatalogError, OSError) as exc:
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


def _manifest_problem(
    storage: catalog.Storage, *, step_path: str, marker: catalog.Marker, deep: bool
) -> str:
    present = storage.list_files(step_path)
    present.pop(catalog.MARKER_NAME, None)
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


def _sha256(storage: catalog.Storage, path: str) -> str:
    fast = getattr(storage, "sha256", None)
    if callable(fast):
        return str(fast(path))
    return hashlib.sha256(storage.read_bytes(path)).hexdigest()


def list_checkpoints(
    storage: catalog.Storage,
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
        if (m := catalog.STEP_DIR_RE.match(name))
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
    storage: catalog.Storage,
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


def other_job_refusal(root: str, rejected: Sequence[Candidate]) -> str | None:
    """Why not to start fresh beside another FSDPJob's checkpoints (a job deleted and created
    again under the same name) without `resumeFromPreviousJobs`; None when there are none. On a
    claim the operator refuses first (CheckpointsOfAnotherJob); on an object store, which it
    never reads, this is the only refusal."""
    others = [c for c in rejected if c.reason == RejectReason.OTHER_JOB]
    if not others:
        return None
    return (
        f"{root} holds checkpoints of another FSDPJob ({others[0].path}: {others[0].detail}); "
        "set checkpoint.resumeFromPreviousJobs to resume from them, or use another "
        "checkpoint.root"
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


def retention_victims(candidates: Sequence[Candidate], *, keep: int) -> list[Candidate]:
    """Complete, usable checkpoints beyond the newest `keep`; incomplete ones are never chosen.

    A directory without a marker may be a save still in flight, and a rejected one is evidence
    for the operator, so only `ok` candidates are ever victims; the newest is always kept.
    """
    usable = sorted((c for c in candidates if c.ok), key=lambda c: c.step, reverse=True)
    return usable[max(keep, 1) :]

"""What the operator sees of a job's checkpoints, where its settings let it read them: the
newest one the job may resume from (catalog + lineage), the corrupt ones to quarantine, and
another job's checkpoints in the way. Reads files only; no API calls, no decisions.
"""

from __future__ import annotations

import dataclasses
import logging
import os

from fsdp_operator.types import api, names, observed, status
from fsdp_worker.contract import catalog, selection

log = logging.getLogger(__name__)


def storage_for(job: names.JobRef, spec: api.FSDPJobSpec, template: str) -> str | None:
    """Local directory where the operator sees this job's checkpoints, if it can (`template`:
    Settings.storage_template)."""
    claim = spec.checkpoint.claim_name
    if not template or not claim:
        return None
    volume = template.format(namespace=job.namespace, claim=claim)
    return names.checkpoint_dir(volume, job.name)


def _writer(cand: selection.Candidate) -> str:
    uid = cand.marker.job_uid if cand.marker else None
    return f"FSDPJob uid {uid}" if uid else "an FSDPJob that recorded no uid (an older version)"


@dataclasses.dataclass(frozen=True)
class Found:
    """The newest checkpoint the job may resume from, those to quarantine, and whose
    checkpoints are in the way."""

    newest: status.CheckpointRef | None = None
    corrupt: tuple[str, ...] = ()
    conflicts: tuple[observed.Conflict, ...] = ()
    visible: bool = True
    """Whether the operator reads the job's checkpoint directory at all (its storage template
    mounts the job's claim); when not, the pods choose under its rules (``auto``)."""


def newest(
    job: names.JobRef,
    spec: api.FSDPJobSpec,
    job_status: status.FSDPJobStatus,
    base: str | None,
    *,
    deep: bool,
) -> Found:
    """What `base` (the job's checkpoint directory as the operator sees it) holds for it."""
    if base is None or not os.path.isdir(base):
        return Found(visible=False)
    storage = catalog.LocalStorage(base)
    lineage = selection.Lineage(
        attempt=job_status.attempt,
        resumed_from_step=job_status.resumed_from_step,
        job_uid=job.uid,
        other_jobs=spec.checkpoint.resume_from_previous_jobs,
    )
    proof = spec.checkpoint.completion
    chosen, rejected = selection.select(
        storage,
        ".",
        config_hash=spec.training.resume_hash(),
        lineage=lineage,
        deep=deep,
        proof=proof,
    )
    for cand in rejected:
        log.debug(
            "%s/%s: checkpoint %s rejected: %s %s",
            job.namespace,
            job.name,
            cand.path,
            cand.reason,
            cand.detail,
        )
    corrupt = tuple(c.path for c in rejected if c.reason in selection.CORRUPT)
    others = [c for c in rejected if c.reason == selection.RejectReason.OTHER_JOB]
    # Before the first attempt, another job's checkpoints mean the user re-used a name (or a
    # directory): starting fresh there would mix two runs' steps, resuming would be a guess.
    conflicts = tuple(
        observed.Conflict(observed.ConflictKind.CHECKPOINTS, f"checkpoint {c.path}", _writer(c))
        for c in others[:1]
        if job_status.attempt == 0
    )
    if chosen is None:
        return Found(None, corrupt, conflicts)
    job_dir = names.checkpoint_dir(spec.checkpoint.location, job.name)
    in_pod = f"{job_dir}/{catalog.step_dir_name(chosen.step)}"
    m = chosen.marker
    if m is None:  # DCPMetadata: the step and the time of its .metadata are all that is known
        sealed = os.path.getmtime(os.path.join(base, chosen.path, catalog.DCP_METADATA_NAME))
        ref = status.CheckpointRef(step=chosen.step, path=in_pod, world_size=0, time=sealed)
    else:
        ref = status.CheckpointRef(
            step=m.step, path=in_pod, attempt=m.attempt, world_size=m.world_size, time=m.time
        )
    return Found(ref, corrupt, conflicts)

"""Resume: choose the checkpoint to load (named, or `auto` via the catalog) and load it.

Rank 0 reads the catalog and broadcasts the decision, so every rank loads the same step. A
checkpoint written by a different training config is refused with a ConfigError (permanent);
a damaged one named explicitly is a CheckpointError (retryable: the operator picks another).
This module must not write checkpoints.
"""

from __future__ import annotations

import logging
import os
import posixpath
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint import state_dict_loader
from torch.distributed.checkpoint.api import CheckpointException

from fsdp_worker import contract
from fsdp_worker.checkpointing import checkpoint, memtier, reader, s3, state
from fsdp_worker.contract import catalog, config, errors, fence, selection, store
from fsdp_worker.runtime.distributed import DistInfo

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Choice:
    """What rank 0 decided: the checkpoint to load (None: fresh), and the steps it set aside
    because they failed verification (under ``auto``: the operator could not do it)."""

    point: ResumePoint | None
    quarantined: tuple[int, ...] = ()


@dataclass(frozen=True)
class ResumePoint:
    path: str
    step: int
    world_size: int
    samples: int
    global_batch_size: int
    memory: bool = False  # the memory tier (memtier.py): `path` is this rank's own files


def _config_refusal(c: selection.Candidate, training: config.TrainingConfig) -> errors.ConfigError:
    assert c.marker is not None
    m = c.marker
    batch = (
        f"training.globalBatchSize was {m.global_batch_size}, "
        f"the config now says {training.global_batch_size}"
        if m.global_batch_size != training.global_batch_size
        else "the training config differs (model, data, optimizer, precision or seed)"
    )
    return errors.ConfigError(
        f"refusing to resume from {c.path}: it was written with config hash {m.config_hash}, "
        f"the running config hashes to {training.resume_hash()}; {batch}. Restore the original "
        "config, or start a new run in an empty checkpoint root."
    )


def _point(st: store.CheckpointStore, c: selection.Candidate) -> ResumePoint:
    """Where DCP reads the chosen step: its directory, or on an object store the prefix of
    the save the fence lists."""
    assert c.marker is not None
    m = c.marker
    return ResumePoint(
        st.locate(c.path), m.step, m.world_size, m.samples_consumed, m.global_batch_size
    )


def _choose_auto(
    cfg: config.WorkerConfig,
    st: store.CheckpointStore,
    *,
    attempt: int,
    job_uid: str | None,
    rules: contract.ResumeRules | None,
    generation: int = 0,
    memory_step: int | None = None,
) -> Choice:
    root = cfg.checkpoint.root
    other_jobs = cfg.checkpoint.resume_from_previous_jobs
    lineage = selection.auto_lineage(rules, attempt=attempt, job_uid=job_uid, other_jobs=other_jobs)
    chosen, rejected = _select(
        st, root, config_hash=cfg.training.resume_hash(), lineage=lineage, memory_step=memory_step
    )
    for c in rejected:
        log.warning("not resuming from %s: %s: %s", c.path, c.reason, c.detail)
    try:
        moved = store.quarantine_corrupt(
            st, rejected, me=fence.Writer(attempt, generation, job_uid)
        )
    except fence.Superseded as exc:
        raise errors.CheckpointError(str(exc)) from None
    if moved:
        log.warning("quarantined steps %s under %s: they failed verification", moved, root)
    if chosen is not None:
        return Choice(_point(st, chosen), moved)
    mismatched = [c for c in rejected if c.reason == selection.RejectReason.CONFIG_HASH_MISMATCH]
    if mismatched:
        raise _config_refusal(mismatched[0], cfg.training)
    refusal = selection.other_job_refusal(root, rejected) or selection.fresh_start_refusal(
        root, rules, rejected
    )
    if refusal is not None:
        raise errors.ConfigError(refusal)
    log.warning("resume=auto: no complete checkpoint under %s; starting fresh", root)
    return Choice(None, moved)


def _select(
    st: store.CheckpointStore,
    root: str,
    *,
    config_hash: str,
    lineage: selection.Lineage,
    memory_step: int | None,
) -> tuple[selection.Candidate | None, list[selection.Candidate]]:
    """The newest step that passes, and the rejected ones. Its files are hashed (read whole,
    where the marker has their sha256) only when it may be loaded: not when the memory tier
    holds `memory_step`, not older, which is loaded instead (memtier.wins); its marker and
    sizes are still checked, to say which step the claim offers."""
    if memory_step is not None:
        chosen, rejected = selection.select(
            st.storage, root, config_hash=config_hash, lineage=lineage, deep=False
        )
        if chosen is None or memtier.wins(memory_step, chosen.step):
            if chosen is not None:
                log.info(
                    "step %d of %s not hashed: memory's step %d is loaded instead",
                    chosen.step,
                    root,
                    memory_step,
                )
            return chosen, rejected
    return selection.select(st.storage, root, config_hash=config_hash, lineage=lineage, deep=True)


def _choose(
    cfg: config.WorkerConfig,
    st: store.CheckpointStore,
    *,
    resume: str,
    attempt: int,
    job_uid: str | None,
    rules: contract.ResumeRules | None,
    generation: int = 0,
    memory_step: int | None = None,
) -> Choice:
    if resume == contract.RESUME_AUTO:
        return _choose_auto(
            cfg,
            st,
            attempt=attempt,
            job_uid=job_uid,
            rules=rules,
            generation=generation,
            memory_step=memory_step,
        )
    candidate = selection.verify(st.storage, resume, config_hash=cfg.training.resume_hash())
    if candidate.reason == selection.RejectReason.CONFIG_HASH_MISMATCH:
        raise _config_refusal(candidate, cfg.training)
    if not candidate.ok:
        raise errors.CheckpointError(
            f"checkpoint {resume} is unusable: {candidate.reason}: {candidate.detail}"
        )
    return Choice(_point(st, candidate))


def choose(
    cfg: config.WorkerConfig,
    *,
    resume: str,
    attempt: int,
    dist_info: DistInfo,
    job_uid: str | None = None,
    rules: contract.ResumeRules | None = None,
    generation: int = 0,
    memory_step: int | None = None,
) -> Choice:
    """Collective: rank 0 decides, every rank gets the same answer (or the same error).

    `resume` is the operator's request: empty (start fresh), `auto`, or a checkpoint path;
    with `auto`, `rules` (FSDP_RESUME_RULES) are the operator's lineage and the step it expects,
    and `memory_step` the step every rank holds in the memory tier (memtier.MemoryTier.offer):
    a chosen step not newer than it is not hashed (_select), as memory's is loaded instead.
    Rank 0 first takes the checkpoint root over for this attempt (fence.take_over): from then
    on no earlier attempt can publish, set aside or delete there, so the step chosen stays.
    """
    box: list[object] = [None]
    if dist_info.rank == 0:
        try:
            me = fence.Writer(attempt, generation, job_uid)
            st = store.open_store(cfg.checkpoint.root)
            st.probe(me)  # an object store that ignores conditional writes: ConfigError
            st.take_over(me)
            box[0] = (
                _choose(
                    cfg,
                    st,
                    resume=resume,
                    attempt=attempt,
                    job_uid=job_uid,
                    rules=rules,
                    generation=generation,
                    memory_step=memory_step,
                )
                if resume
                else Choice(None)
            )
        except (errors.WorkerError, catalog.CatalogError) as exc:
            box[0] = exc
        except OSError as exc:  # the root cannot be written: every rank stops the same way
            box[0] = errors.CheckpointError(f"checkpoint root {cfg.checkpoint.root}: {exc}")
    dist.broadcast_object_list(box, src=0, group=dist_info.ckpt_group)
    outcome = box[0]
    if isinstance(outcome, catalog.CatalogError):
        raise errors.CheckpointError(str(outcome))
    if isinstance(outcome, errors.WorkerError):
        raise outcome
    assert isinstance(outcome, Choice)
    return outcome


def read_into(
    point: ResumePoint,
    make_state: Callable[[set[str]], dict[str, Any]],
    *,
    dist_info: DistInfo,
) -> tuple[dict[str, Any], reader.RangeReader]:
    """Load `point` into the state dict `make_state(saved top-level keys)` returns, in place
    (DCP reshards to this world size; Stateful entries get `load_state_dict`); collective."""
    remote = s3.is_remote(point.path)
    if not remote and not os.path.isdir(point.path):
        raise errors.CheckpointError(f"checkpoint {point.path} vanished before loading")
    try:
        storage = reader.RangeReader(point.path, fs=s3.S3FileSystem() if remote else None)
        saved_keys = {fqn.split(".", 1)[0] for fqn in storage.read_metadata().state_dict_metadata}
        sd = make_state(saved_keys)
        if point.memory:  # this rank's own shards, saved without collectives
            with warnings.catch_warnings():  # DCP warns that no_dist means one process
                warnings.simplefilter("ignore", UserWarning)
                state_dict_loader.load(sd, storage_reader=storage, no_dist=True)
        else:
            state_dict_loader.load(sd, storage_reader=storage, process_group=dist_info.ckpt_group)
    except (Exception, CheckpointException) as exc:
        raise errors.CheckpointError(
            f"loading {point.path} failed: {checkpoint.brief(exc)}"
        ) from exc
    return sd, storage


def load(point: ResumePoint, st: state.TrainState, *, dist_info: DistInfo, seed: int) -> None:
    """Load (resharding if the world size changed) into st; collective."""
    sd, storage = read_into(
        point,
        lambda keys: state.template(st, saved_world_size=point.world_size, saved_keys=keys),
        dist_info=dist_info,
    )
    state.apply_loaded(st, sd, rank=dist_info.rank, world_size=dist_info.world_size, seed=seed)
    log.info(
        "resumed from %s%s: step %d, samples %d, saved at world size %d, now %d "
        "(%d bytes read as ranges from %d of %d files, %d items through DCP's reader)",
        f"step-{point.step}" if point.memory else posixpath.basename(point.path),
        " (memory)" if point.memory else "",
        st.step,
        st.samples,
        point.world_size,
        dist_info.world_size,
        storage.ranged_bytes,
        len(storage.files_read),
        len({info.relative_path for info in storage.storage_data.values()}),
        storage.fallback_items,
    )

"""Checkpoint saving: DCP save (sync or async, one in flight), publish, marker, retention.

A save writes into `<writer>/step-<N>.partial-a<attempt>[g<generation>]`, under this attempt's
writer directory (fence.py); when DCP has returned (which on the coordinator means every rank's
files are written and fsync'd and `.metadata` is written) and a barrier has passed, rank 0
writes `COMPLETE.json` inside it and renames it to `step-<N>`: one act, which fails for a
writer that a newer attempt superseded.
An async failure is re-raised by `poll`/`wait`, never swallowed. This module must not choose
resume checkpoints (see resume.py) or run training.
"""

from __future__ import annotations

import concurrent.futures as cf
import enum
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict_saver
from torch.distributed.checkpoint._state_dict_stager import StateDictStager
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions

from fsdp_worker.checkpointing import direct, layout, s3, state, writeback
from fsdp_worker.contract import catalog, config_checkpoint, errors, fence, selection, store
from fsdp_worker.runtime import faults
from fsdp_worker.runtime.distributed import DistInfo
from fsdp_worker.telemetry import flight, metrics

log = logging.getLogger(__name__)

CHECKSUM_MAX_BYTES = 256 * 1024 * 1024  # sha256 in the manifest only below this total size
# Files (and writer threads) per rank. Measured at world size 2 with eager writeback on: one
# thread 0.49 s, two 0.56 s (median of 5, rotating order): with the flush already overlapping
# the copy, a second thread only competes for the 2 CPUs. It also keeps DCP's copy-ahead of
# CUDA tensors, which DCP uses only with one thread.
WRITER_THREADS = 1
# torch.save (which DCP uses per tensor) computes a zip CRC32 over every byte; on this machine
# that halved the rate at which a rank copies its state into the page cache. No reader checks
# it: torch.load, DCP's reader and reader.RangeReader all ignore it (verified). Integrity is the
# marker manifest's job (sizes; sha256 up to CHECKSUM_MAX_BYTES). Durability (fsync) is
# unaffected. The setting is process-wide; the worker's only torch.save calls are DCP's.
ZIP_CRC32 = False


class SaveMode(enum.StrEnum):
    SYNC = "sync"
    ASYNC = "async"


@dataclass(frozen=True)
class Identity:
    """What a marker says about the run that wrote it."""

    attempt: int
    resumed_from_step: int | None
    config_hash: str
    global_batch_size: int
    job_uid: str | None = None
    generation: int = 0  # of restarts in place (FSDP_GENERATION): the fence's too


@dataclass
class _InFlight:
    step: int
    started: float
    blocking: float
    future: cf.Future[Any]  # rank 0: publish+marker done; others: DCP upload done
    staging: cf.Future[Any] | None


class ThreadStager(AsyncStager):
    """CPU staging on a background thread into cached, reused buffers.

    DefaultStager stages asynchronously only on CUDA; on CPU it would copy the whole state on
    the training thread. The copy here overlaps the next forward/backward, which only read
    parameters; `CheckpointManager.before_optimizer_step` waits for it before they change.
    """

    _synchronize_after_execute = False

    def __init__(self) -> None:
        self._copier = StateDictStager(pin_memory=False, share_memory=False)
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-stage")

    def stage(self, state_dict: dict[str, Any]) -> cf.Future[dict[str, Any]]:
        return self._pool.submit(self._copier.stage, state_dict)

    def synchronize_staging(self) -> None:
        """Nothing to do: the future returned by `stage` is the synchronisation point."""

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._copier.close()  # type: ignore[no-untyped-call]


def brief(exc: BaseException) -> str:
    """One line per failing rank instead of DCP's multi-rank traceback dump."""
    if isinstance(exc, CheckpointException):
        parts = []
        for rank, wrapped in sorted(exc.failures.items()):
            inner = wrapped[0] if isinstance(wrapped, tuple) else wrapped
            parts.append(f"rank {rank}: {type(inner).__name__}: {inner}")
        return "; ".join(parts)
    return f"{type(exc).__name__}: {exc}"


class CheckpointManager:
    """Saves checkpoints of one attempt. Public methods are collective unless noted."""

    def __init__(
        self,
        cfg: config_checkpoint.CheckpointConfig,
        *,
        identity: Identity,
        dist_info: DistInfo,
        meters: metrics.Metrics,
    ) -> None:
        self.cfg, self.root, self.identity = cfg, cfg.root, identity
        self.mode = SaveMode.ASYNC if cfg.async_ else SaveMode.SYNC
        # Files are written around the page cache (direct.py) or buffered with writeback
        # started behind the writer (writeback.py); either way fsync'd before the marker.
        # On an object store (an s3:// root) each file is uploaded when closed (s3.py).
        self.fs: writeback.EagerWritebackFileSystem | s3.S3FileSystem = (
            s3.S3FileSystem()
            if s3.is_remote(cfg.root)
            else direct.DirectFileSystem()
            if cfg.direct_writes
            else writeback.EagerWritebackFileSystem()
        )
        self.dist, self.meters = dist_info, meters
        self.store = store.open_store(cfg.root)
        self.lineage = selection.Lineage(
            identity.attempt, identity.resumed_from_step, job_uid=identity.job_uid
        )
        self._inflight: _InFlight | None = None
        self.sealed_step: int | None = None  # rank 0: the newest step this attempt sealed
        self._samples: dict[int, int] = {}
        self._pool = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-publish")
        torch.serialization.set_crc32_options(ZIP_CRC32)
        # One stager for the whole run: its cached staging buffers are reused by every save.
        self._stager: AsyncStager = (
            DefaultStager(
                StagingOptions(
                    use_pinned_memory=True,
                    use_shared_memory=False,
                    use_async_staging=True,
                    use_non_blocking_copy=True,
                )
            )
            if dist_info.device.type == "cuda"
            else ThreadStager()
        )

    @property
    def writer(self) -> fence.Writer:
        i = self.identity
        return fence.Writer(i.attempt, i.generation, i.job_uid)

    def remove_abandoned(self) -> None:
        """Rank 0: hold the directory for this attempt (fence.take_over: resume.choose took it
        over already; this is idempotent), which deletes earlier writers' partial saves. They
        can never be published now: their writer directory is this one's."""
        if self.dist.rank != 0:
            return
        try:
            self.store.remove_abandoned(self.writer)
        except fence.Superseded as exc:
            raise errors.CheckpointError(str(exc)) from None

    def _failed(self, message: str) -> errors.CheckpointError:
        """A failed save's error; a writer superseded by a newer attempt (its directory taken
        over, so its files could not be created) is told so rather than with DCP's words."""
        if self.store.newer_writer(self.writer):
            message = str(self.store.refusal(self.writer, "saving"))
        return errors.CheckpointError(message)

    def _partial(self, step: int) -> str:
        return self.store.partial(self.writer, step)

    def save(self, st: state.TrainState) -> None:
        """Checkpoint st.step; returns after the save (sync) or after staging (async)."""
        self.save_state(
            st.step,
            samples=st.samples,
            make_state=lambda: state.to_save(st, group=self.dist.ckpt_group),
        )

    def save_state(
        self, step: int, *, samples: int, make_state: Callable[[], dict[str, Any]]
    ) -> None:
        """Checkpoint `make_state()` (any state dict DCP saves: tensors, DTensors, Stateful
        objects) as `step`, with `samples` as its data cursor; collective. Returns after the
        save (sync) or after staging (async); the marker follows once every rank's files are
        durable."""
        self.wait()
        started = time.monotonic()
        self._samples[step] = samples
        partial = self._partial(step)
        if self.dist.rank == 0:
            self.store.clear_partial(self.writer, step)  # our own leftover
        dist.barrier(group=self.dist.ckpt_group)
        sd = make_state()
        writer = layout.writer(
            partial,
            step=step,
            sync_files=True,  # durability before the marker; never skipped
            single_file_per_rank=True,
            thread_count=WRITER_THREADS,
        )
        writer.fs, writer.path = cast(Any, self.fs), self.fs.init_path(partial)
        if self.mode is SaveMode.SYNC:
            self._save_sync(sd, writer=writer, step=step, started=started)
        else:
            self._save_async(sd, writer=writer, step=step, started=started)
        flight.hold_fast()  # the slowest rank's staging or marker holds the next steps

    def _save_sync(self, sd: dict[str, Any], *, writer: Any, step: int, started: float) -> None:
        try:
            state_dict_saver.save(
                sd,
                storage_writer=writer,
                planner=self._planner(),
                process_group=self.dist.ckpt_group,
            )
            dist.barrier(group=self.dist.ckpt_group)
        except (Exception, CheckpointException) as exc:
            raise self._failed(f"saving step {step} failed: {brief(exc)}") from exc
        if self.dist.rank == 0:
            self._publish(step=step, started=started, blocking=time.monotonic() - started)

    def _save_async(self, sd: dict[str, Any], *, writer: Any, step: int, started: float) -> None:
        response = state_dict_saver.async_save(
            sd,
            storage_writer=writer,
            planner=self._planner(),
            process_group=self.dist.ckpt_group,
            async_stager=self._stager,
        )
        staging: cf.Future[Any] | None = None
        if isinstance(response, cf.Future):
            upload = response
        else:
            upload, staging = response.upload_completion, response.staging_completion
        inflight = _InFlight(step, started, time.monotonic() - started, upload, staging)
        if self.dist.rank == 0:
            inflight.future = self._pool.submit(self._finish_async, upload, inflight)
        self._inflight = inflight
        log.info(
            "checkpoint step %d submitted (%.3fs), writing in background", step, inflight.blocking
        )

    def _planner(self) -> layout.BandedSavePlanner:
        return layout.BandedSavePlanner(
            bands=self.cfg.bands_per_rank, min_band_bytes=self.cfg.min_band_bytes
        )

    def _finish_async(self, upload: cf.Future[Any], inflight: _InFlight) -> None:
        upload.result()  # re-raises a failed background write
        self._publish(step=inflight.step, started=inflight.started, blocking=inflight.blocking)

    def before_optimizer_step(self) -> None:
        """Parameters must not change while an async save is still copying them; the time
        spent waiting here counts as the save's blocking time."""
        inflight = self._inflight
        if inflight is None or inflight.staging is None:
            return
        waited = time.monotonic()
        try:
            inflight.staging.result()
        except (Exception, CheckpointException) as exc:
            raise errors.CheckpointError(
                f"staging step {inflight.step} failed: {brief(exc)}"
            ) from exc
        inflight.blocking += time.monotonic() - waited
        inflight.staging = None
        self.meters.ckpt_seconds.labels(kind="blocking").set(inflight.blocking)

    def poll(self) -> None:
        """Finish an async save that is done; raise if it failed. Local, not collective."""
        if self._inflight is not None and self._inflight.future.done():
            self._collect()

    def wait(self) -> None:
        """Block until the in-flight save (if any) is complete; raise if it failed."""
        if self._inflight is not None:
            self.before_optimizer_step()
            cf.wait([self._inflight.future])
            self._collect()

    def _collect(self) -> None:
        assert self._inflight is not None
        inflight, self._inflight = self._inflight, None
        try:
            inflight.future.result()
        except (Exception, CheckpointException) as exc:
            raise self._failed(f"async save of step {inflight.step} failed: {brief(exc)}") from exc

    def close(self, *, wait: bool) -> None:
        """Release staging buffers and the publisher thread (not collective). On failure
        (wait=False) an in-flight publish is not waited for: its peers may be gone."""
        self._pool.shutdown(wait=wait)
        self._stager.close()
        if wait:  # else the process is about to exit, and a stuck write must not hold it
            self.fs.close()

    # --- rank 0 only -------------------------------------------------------------------------

    def _publish(self, *, step: int, started: float, blocking: float) -> None:
        faults.kill_self_if("kill_before_marker", step)
        manifest = self._manifest(step)
        marker = catalog.Marker(
            step=step,
            attempt=self.identity.attempt,
            world_size=self.dist.world_size,
            global_batch_size=self.identity.global_batch_size,
            samples_consumed=self._samples.pop(step),
            resumed_from_step=self.identity.resumed_from_step,
            time=time.time(),
            torch_version=torch.__version__,
            config_hash=self.identity.config_hash,
            files=manifest,
            job_uid=self.identity.job_uid,
        )
        try:
            self.store.publish(self.writer, marker=marker)
        except fence.Superseded as exc:
            raise errors.CheckpointError(str(exc)) from None
        self.sealed_step = step
        total = time.monotonic() - started
        size = sum(f.size for f in manifest.values())
        self._record(step=step, blocking=blocking, total=total, size=size)
        self._retain()

    def _manifest(self, step: int) -> dict[str, catalog.FileEntry]:
        sizes = self.store.manifest(self.writer, step, checksums=False)
        if sum(f.size for f in sizes.values()) > CHECKSUM_MAX_BYTES:
            return sizes
        return self.store.manifest(self.writer, step, checksums=True)

    def _record(self, *, step: int, blocking: float, total: float, size: int) -> None:
        self.meters.ckpt_step.set(step)
        self.meters.ckpt_seconds.labels(kind="blocking").set(blocking)
        self.meters.ckpt_seconds.labels(kind="total").set(total)
        self.meters.ckpt_bytes.set(size)
        log.info(
            "checkpoint step %d complete: %d bytes, blocking %.3fs, total %.3fs",
            step,
            size,
            blocking,
            total,
        )

    def _retain(self) -> None:
        candidates = selection.list_checkpoints(
            self.store.storage,
            self.root,
            config_hash=self.identity.config_hash,
            lineage=self.lineage,
        )
        for victim in selection.retention_victims(candidates, keep=self.cfg.keep):
            log.info("retention: removing %s", victim.path)
            try:
                self.store.delete(self.writer, path=victim.path)
            except fence.Superseded as exc:
                raise errors.CheckpointError(str(exc)) from None
            except OSError as exc:  # gone already: nothing to keep it from
                log.warning("retention: %s: %s", victim.path, exc)

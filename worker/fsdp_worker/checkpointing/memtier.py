"""The memory tier: a checkpoint in the pods' memory that survives a restart in place.

With `checkpoint.memory` the operator mounts an emptyDir of medium Memory in every worker pod
(FSDP_MEMORY_ROOT) and restarts failed ranks in place (gang.py), so the pod and its volume stay.
Every rank saves its own state there: DCP without collectives into
`step-<N>.partial/rank-<R>` (its shards and what it replicates, nothing it would have to fetch
from a peer at load). Then the same rule as the claim's marker: after a barrier of the whole
gang (every rank's files are written), each node's local rank 0 renames the directory to
`step-<N>` and writes `COMPLETE.json` (step, data cursor, world size, config hash, job, attempt,
and each of its ranks' file sizes), atomically. A node keeps its newest sealed step only.

A restart in place at the same world size loads from memory when every rank holds the same
sealed step of this job, attempt and config, no older than what the claim offers; anything else
(another world size, a new pod, a rank without it, a marker that does not match its files)
loads from the claim. Same sharding, same bytes: the resume is as exact as from the claim.
The gang's offer is asked before the claim's step is verified, so that step's files are hashed
(read whole: resume.choose) only when it is the one loaded.

The claim stays the durable tier with its own interval (checkpoint.intervalSteps): memory does
not survive a lost node or a recreated gang. This module must not write the claim.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable
from typing import Any, Final, Literal

import pydantic.dataclasses
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict_saver
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter

from fsdp_worker import contract
from fsdp_worker.checkpointing import checkpoint
from fsdp_worker.contract import catalog, config_checkpoint, errors, wire
from fsdp_worker.runtime import faults
from fsdp_worker.runtime.distributed import DistInfo
from fsdp_worker.telemetry import metrics

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"
FORMAT: Final = 1


@pydantic.dataclasses.dataclass(frozen=True)
class Seal:
    """One node's COMPLETE.json in memory: written after every rank of the gang saved."""

    step: int
    samples: int
    world_size: int
    global_batch_size: int
    config_hash: str
    job_uid: str | None
    attempt: int
    ranks: dict[str, dict[str, int]]  # rank -> file name -> size, for this node's ranks
    time: float
    format: Literal[1] = FORMAT

    def to_json(self) -> bytes:
        return json.dumps(wire.to_doc(self), sort_keys=True).encode()

    @classmethod
    def parse(cls, raw: bytes) -> Seal:
        """Strictly (a seal another release wrote, or a damaged one, is not loaded): ValueError
        names the field, the value and what is allowed."""
        return wire.parse(cls, raw, what=f"memory {catalog.MARKER_NAME}")


def _files(path: str) -> dict[str, int]:
    return {e.name: e.stat().st_size for e in os.scandir(path) if e.is_file()}


def _step_of(name: str) -> int | None:
    digits = name.removeprefix("step-").removesuffix(PARTIAL_SUFFIX)
    return int(digits) if name.startswith("step-") and digits.isdigit() else None


class MemoryTier:
    """This rank's view of its node's memory volume. `save` and `choose` are collective."""

    def __init__(
        self,
        root: str,
        *,
        identity: checkpoint.Identity,
        dist_info: DistInfo,
        meters: metrics.Metrics,
    ) -> None:
        self.root, self.identity, self.dist, self.meters = root, identity, dist_info, meters
        self.held: int | None = None  # the newest step the gang holds sealed in memory
        os.makedirs(root, exist_ok=True)

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.root, f"step-{step}")

    def rank_path(self, step: int) -> str:
        """This rank's files of sealed `step` (what resume.read_into loads, no collective)."""
        return self._rank_dir(self._step_dir(step))

    def _rank_dir(self, step_dir: str) -> str:
        return os.path.join(step_dir, f"rank-{self.dist.rank}")

    def save(self, step: int, *, samples: int, make_state: Callable[[], dict[str, Any]]) -> float:
        """Seal `make_state()` as `step` in memory; returns the seconds training waited."""
        started = time.monotonic()
        partial = self._step_dir(step) + PARTIAL_SUFFIX
        mine = self._rank_dir(partial)
        shutil.rmtree(mine, ignore_errors=True)
        try:
            with warnings.catch_warnings():  # DCP warns that no_dist means one process
                warnings.simplefilter("ignore", UserWarning)
                state_dict_saver.save(
                    make_state(),
                    storage_writer=FileSystemWriter(
                        mine, single_file_per_rank=True, sync_files=False
                    ),
                    no_dist=True,
                )
            dist.barrier(group=self.dist.ckpt_group)  # every rank's files are written
        except (Exception, CheckpointException) as exc:
            raise errors.CheckpointError(
                f"saving step {step} to memory failed: {checkpoint.brief(exc)}"
            ) from exc
        if self.dist.local_rank == 0:
            self._seal(step, samples=samples, partial=partial)
        self.held = step
        seconds = time.monotonic() - started
        self.meters.memory_step.set(step)
        self.meters.memory_save_seconds.set(seconds)
        return seconds

    def _seal(self, step: int, *, samples: int, partial: str) -> None:
        final = self._step_dir(step)
        ranks = {
            e.name.removeprefix("rank-"): _files(e.path)
            for e in os.scandir(partial)
            if e.is_dir() and e.name.startswith("rank-")
        }
        seal = Seal(
            step=step,
            samples=samples,
            world_size=self.dist.world_size,
            global_batch_size=self.identity.global_batch_size,
            config_hash=self.identity.config_hash,
            job_uid=self.identity.job_uid,
            attempt=self.identity.attempt,
            ranks=ranks,
            time=time.time(),
        )
        shutil.rmtree(final, ignore_errors=True)  # the same step again (after a resume)
        os.rename(partial, final)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=final)
        with os.fdopen(fd, "wb") as fh:
            fh.write(seal.to_json())
        os.rename(tmp, os.path.join(final, catalog.MARKER_NAME))
        for entry in os.scandir(self.root):  # older steps, sealed or not; newer partials stay
            other = _step_of(entry.name)
            if other is not None and other < step:
                shutil.rmtree(entry.path, ignore_errors=True)

    def newest(self) -> tuple[int, int]:
        """(step, samples) of the newest step sealed here that this rank may load; (-1, -1)."""
        best = (-1, -1)
        with contextlib.suppress(OSError):
            for entry in os.scandir(self.root):
                step = _step_of(entry.name)
                if step is None or entry.name.endswith(PARTIAL_SUFFIX) or step <= best[0]:
                    continue
                seal = self._loadable(entry.path, step)
                if isinstance(seal, str):
                    log.warning("memory tier: not loading %s: %s", entry.name, seal)
                else:
                    best = (step, seal.samples)
        return best

    def _seal_of(self, path: str) -> Seal:
        with open(os.path.join(path, catalog.MARKER_NAME), "rb") as fh:
            return Seal.parse(fh.read(1 << 20))

    def _refusal(self, path: str, step: int) -> str:
        """Why this rank may not load `path` (empty: it may)."""
        seal = self._loadable(path, step)
        return seal if isinstance(seal, str) else ""

    def _loadable(self, path: str, step: int) -> Seal | str:
        """The seal of `path` when this rank may load it, else why not (read once)."""
        try:
            seal = self._seal_of(path)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return f"no valid {catalog.MARKER_NAME} ({type(exc).__name__}: {exc})"
        ident = self.identity
        expected = {
            "step": (seal.step, step),
            "world size": (seal.world_size, self.dist.world_size),
            "config hash": (seal.config_hash, ident.config_hash),
            "global batch": (seal.global_batch_size, ident.global_batch_size),
            "job": (seal.job_uid, ident.job_uid),
            "attempt": (seal.attempt, ident.attempt),
        }
        for what, (found, wanted) in expected.items():
            if found != wanted:
                return f"written with {what} {found}, this rank has {wanted}"
        files = seal.ranks.get(str(self.dist.rank))
        if not files:
            return f"rank {self.dist.rank}'s state is not in it"
        try:
            present = _files(self._rank_dir(path))
        except OSError as exc:
            return f"rank {self.dist.rank}'s files are gone ({exc})"
        if present != files:
            return f"rank {self.dist.rank}'s files differ from the marker's: {present} != {files}"
        return seal

    def offer(self) -> tuple[int, int] | None:
        """Collective: (step, samples) of the sealed step every rank holds, the same answer on
        every rank, or None (a rank holds none, or another step). Asked before the claim's
        step is verified: when memory's step wins, the claim's data is never read."""
        step, samples = self.newest()
        if faults.at_step("memory_lost", self.dist.rank):  # a test's rank without its memory
            step, samples = -1, -1
        mine = torch.tensor([step, -step, samples], dtype=torch.int64)
        dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=self.dist.ckpt_group)
        high, low = int(mine[0]), -int(mine[1])
        if high < 0 or high != low:
            if self.dist.rank == 0 and high >= 0:
                log.info("memory tier: ranks hold steps %d..%d: loading from the claim", low, high)
            return None
        return high, int(mine[2])

    def choose(self, offer: tuple[int, int] | None, claim: int | None) -> tuple[int, int] | None:
        """(step, samples) to load from memory, the same answer on every rank (`offer` is), or
        None. Memory wins when every rank holds the same step (`offer`), not older than `claim`
        (the step the claim would give; None: nothing)."""
        if offer is None:
            return None
        if not wins(offer[0], claim):
            if self.dist.rank == 0:
                log.info(
                    "memory tier: the gang holds step %d, the claim step %s: loading from the "
                    "claim",
                    offer[0],
                    claim,
                )
            return None
        self.held = offer[0]
        if faults.at_step("memory_garbled", self.dist.rank):  # a test's rank that cannot load it
            _garble(os.path.join(self.rank_path(offer[0]), ".metadata"))
        return offer

    def loaded(self, step: int, *, ok: bool) -> bool:
        """Collective: whether every rank loaded `step` from memory (`ok` is this rank's word).
        When one did not, every node's seal of `step` goes (its files stay for a post-mortem),
        so no later generation of this attempt offers it again: the caller loads the claim."""
        flag = torch.tensor([1 if ok else 0], dtype=torch.int64)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.dist.ckpt_group)
        if int(flag[0]) == 1:
            return True
        if self.dist.local_rank == 0:
            with contextlib.suppress(FileNotFoundError):
                os.remove(os.path.join(self._step_dir(step), catalog.MARKER_NAME))
        self.held = None
        return False


def _garble(path: str) -> None:
    """Zeros over a file, its size kept (the seal still matches): a test's damaged memory."""
    size = os.path.getsize(path)
    with open(path, "r+b") as fh:
        fh.write(bytes(size))


def wins(memory: int, claim: int | None) -> bool:
    """Whether memory's step is loaded rather than the claim's (`claim` None: it has none):
    not older is enough, as memory loads faster (resume.choose skips hashing the claim's step
    on the same rule)."""
    return claim is None or memory >= claim


def open_tier(
    cfg: config_checkpoint.CheckpointConfig,
    *,
    identity: checkpoint.Identity,
    dist_info: DistInfo,
    meters: metrics.Metrics,
) -> MemoryTier | None:
    """The memory tier when `checkpoint.memory` is set and the pod has the volume."""
    if cfg.memory is None:
        return None
    root = os.environ.get(contract.ENV_MEMORY_ROOT)
    if not root:
        log.warning(
            "checkpoint.memory is set but %s is not: no memory tier (the operator mounts it)",
            contract.ENV_MEMORY_ROOT,
        )
        return None
    return MemoryTier(root, identity=identity, dist_info=dist_info, meters=meters)

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

With `checkpoint.memory.peerCopy` each rank's files of a sealed step are also sent, in the
background, to the same local rank of the next node (peercopy.py), which keeps them under
`copy-<rank>/step-<N>` with a seal of their own: a rank whose node lost its memory (a new pod:
a spare taking a lost node's place) gets them back from that peer. With copies a node keeps
its two newest sealed steps, so that a failure while the newest one's copies travel finds the
one before whole on every node or its peer.

The claim stays the durable tier with its own interval (checkpoint.intervalSteps): memory does
not survive a recreated gang, nor two neighbouring nodes lost. This module must not write the
claim.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import shutil
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any, Final, Literal, NamedTuple

import pydantic.dataclasses
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import state_dict_saver
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystemWriter

from fsdp_worker import contract
from fsdp_worker.checkpointing import checkpoint, peercopy
from fsdp_worker.contract import catalog, config_base, config_checkpoint, errors, wire
from fsdp_worker.runtime import faults
from fsdp_worker.runtime.distributed import DistInfo
from fsdp_worker.telemetry import metrics

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"
COPY_TIMEOUT = datetime.timedelta(minutes=10)
"""A peer copy that has not arrived by then failed (the next save waits for it at most that)."""
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


class Offer(NamedTuple):
    """The step every rank can load from memory (MemoryTier.offer): its own, or `from_peers`,
    the ranks that get theirs back from a peer's copy first."""

    step: int
    samples: int
    from_peers: tuple[int, ...] = ()


class MemoryTier:
    """This rank's view of its node's memory volume. `save`, `offer`, `choose` and `loaded`
    are collective."""

    def __init__(
        self,
        root: str,
        *,
        identity: checkpoint.Identity,
        dist_info: DistInfo,
        meters: metrics.Metrics,
        peer_copy: bool = False,
        limit: int | None = None,
        local_world: int | None = None,
    ) -> None:
        """Collective when `peer_copy` (the copies' own process group is made here)."""
        self.root, self.identity, self.dist, self.meters = root, identity, dist_info, meters
        self.held: int | None = None  # the newest step the gang holds sealed in memory
        env_local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.local_world = local_world if local_world is not None else env_local
        # Copies need another node; torchrun gives a node's ranks consecutive numbers.
        self.peer_copy = peer_copy and dist_info.world_size > self.local_world
        self.limit = limit  # the volume's sizeLimit in bytes
        self._copies_refused = False
        self._copying: threading.Thread | None = None
        # The background copies talk on a group of their own: never beside a collective of
        # the training thread on the same group.
        self._copy_group: dist.ProcessGroup | None = None
        if self.peer_copy:
            group = dist.new_group(backend="gloo", timeout=COPY_TIMEOUT)
            assert isinstance(group, dist.ProcessGroup)  # every rank is in it
            self._copy_group = group
        os.makedirs(root, exist_ok=True)

    def _step_dir(self, step: int) -> str:
        return os.path.join(self.root, f"step-{step}")

    def rank_path(self, step: int) -> str:
        """This rank's files of sealed `step` (what resume.read_into loads, no collective)."""
        return self._rank_dir(self._step_dir(step))

    def _rank_dir(self, step_dir: str) -> str:
        return os.path.join(step_dir, f"rank-{self.dist.rank}")

    def save(self, step: int, *, samples: int, make_state: Callable[[], dict[str, Any]]) -> float:
        """Seal `make_state()` as `step` in memory, then (peer copies) send this rank's files
        to its peer in the background; returns the seconds training waited (for the last
        step's copies too, when they were still travelling)."""
        started = time.monotonic()
        self.join_copies()
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
        if self.peer_copy:
            dist.barrier(group=self.dist.ckpt_group)  # every node sealed: its files stay put
            self._copying = threading.Thread(
                target=self._copy_to_peer, args=(step, samples), name="memory-copy", daemon=True
            )
            self._copying.start()
        seconds = time.monotonic() - started
        self.meters.memory_step.set(step)
        self.meters.memory_save_seconds.set(seconds)
        return seconds

    def join_copies(self, timeout: float | None = None) -> None:
        """Wait for the last save's copies (the next save may remove what they read); at
        most `timeout` seconds (a rank on its way out: its peer may be gone)."""
        if self._copying is not None:
            self._copying.join(timeout)
            if not self._copying.is_alive():
                self._copying = None

    def _copy_home(self, src: int) -> str:
        return os.path.join(self.root, f"{peercopy.COPY_PREFIX}{src}")

    def copy_path(self, src: int, step: int) -> str:
        """Where this rank keeps `src`'s files of `step`; their seal is `<path>.json`."""
        return os.path.join(self._copy_home(src), f"step-{step}")

    def _copy_to_peer(self, step: int, samples: int) -> None:
        """The background half of a save: send this rank's files of sealed `step` to the next
        node's same local rank and keep the previous node's, sealed. Collective on the copies'
        group; skipped on every rank alike when a node's volume would not hold them. Never
        raises: a copy that fails leaves the one before (the next restart loads the step every
        rank or its peer holds)."""
        g = self._copy_group
        assert g is not None  # peer_copy
        mine = self.rank_path(step)
        try:
            own = sum(_files(mine).values())
            fits = peercopy.fits(own, local_world_size=self.local_world, limit=self.limit, group=g)
            if not fits:
                if self.dist.rank == 0 and not self._copies_refused:
                    log.warning(
                        "memory tier: no peer copies: %d ranks per node of up to %d bytes, "
                        "%d times over with copies, exceed checkpoint.memory.sizeLimit "
                        "(%s bytes)",
                        self.local_world,
                        own,
                        peercopy.SHARES_HELD,
                        self.limit,
                    )
                self._copies_refused = True
                self.meters.memory_peer_bytes.set(0)
                return
            dst, src = peercopy.ring(self.dist.rank, self.dist.world_size, self.local_world)
            blob = peercopy.pack(mine)
            self._prune_copies(src, keep=1)  # room for the one coming
            got = peercopy.swap({dst: blob}, [src], g)
            where = self.copy_path(src, step)
            with contextlib.suppress(FileNotFoundError):
                os.remove(where + ".json")  # the same step again: unsealed while it is written
            files = peercopy.unpack(got[src], where)
            seal = self._seal_of_files(step, samples=samples, ranks={str(src): files})
            _write_atomically(where + ".json", seal.to_json())
            self._prune_copies(src, keep=2)
            self.meters.memory_peer_bytes.set(sum(files.values()))
        except Exception:  # a background thread: say it; the save stands
            log.warning("memory tier: step %d's peer copy failed", step, exc_info=True)

    def _prune_copies(self, src: int, *, keep: int) -> None:
        """Keep `src`'s `keep` newest sealed copies; remove the rest, unsealed ones included."""
        home = self._copy_home(src)
        with contextlib.suppress(FileNotFoundError):
            entries = list(os.scandir(home))
            sealed = sorted(
                step
                for e in entries
                if e.name.endswith(".json")
                and (step := _step_of(e.name.removesuffix(".json"))) is not None
            )
            kept = set(sealed[-keep:]) if keep else set()
            for e in entries:
                step = _step_of(e.name.removesuffix(".json"))
                if step is None or step in kept:
                    continue
                if e.is_dir():
                    shutil.rmtree(e.path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(e.path)

    def _seal(self, step: int, *, samples: int, partial: str) -> None:
        final = self._step_dir(step)
        seal = self._seal_for(step, samples=samples, directory=partial)
        shutil.rmtree(final, ignore_errors=True)  # the same step again (after a resume)
        os.rename(partial, final)
        self._write_seal(final, seal)
        # Older steps, sealed or not (newer partials stay); with copies the newest before
        # this one stays too, until the next seal.
        sealed = sorted(
            s
            for e in os.scandir(self.root)
            if (s := _step_of(e.name)) is not None and s < step and e.name == f"step-{s}"
        )
        keep = sealed[-1:] if self.peer_copy else []
        for entry in os.scandir(self.root):
            other = _step_of(entry.name)
            if (
                other is not None
                and other < step
                and not (other in keep and entry.name == f"step-{other}")
            ):
                shutil.rmtree(entry.path, ignore_errors=True)

    def _write_seal(self, final: str, seal: Seal) -> None:
        _write_atomically(os.path.join(final, catalog.MARKER_NAME), seal.to_json())

    def _seal_for(self, step: int, *, samples: int, directory: str) -> Seal:
        """The seal of `directory`'s ranks' files, as written now."""
        ranks = {
            e.name.removeprefix("rank-"): _files(e.path)
            for e in os.scandir(directory)
            if e.is_dir() and e.name.startswith("rank-")
        }
        return self._seal_of_files(step, samples=samples, ranks=ranks)

    def _seal_of_files(self, step: int, *, samples: int, ranks: dict[str, dict[str, int]]) -> Seal:
        return Seal(
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

    def newest(self) -> tuple[int, int]:
        """(step, samples) of the newest step sealed here that this rank may load; (-1, -1)."""
        held = self.steps()
        return held[0] if held else (-1, -1)

    def steps(self) -> list[tuple[int, int]]:
        """(step, samples) of the steps sealed here that this rank may load, newest first."""
        return self._sealed(self.root, self._loadable, quiet=False)

    def copy_steps(self) -> list[int]:
        """The steps of which this rank holds a whole, sealed copy of the previous node's same
        local rank (peer copies), newest first."""
        src = peercopy.ring(self.dist.rank, self.dist.world_size, self.local_world)[1]
        found = self._sealed(self._copy_home(src), self._copy_loadable, quiet=True)
        return [step for step, _ in found]

    def _sealed(
        self, where: str, check: Callable[[str, int], Seal | str], *, quiet: bool
    ) -> list[tuple[int, int]]:
        found = []
        with contextlib.suppress(OSError):
            for entry in os.scandir(where):
                step = _step_of(entry.name)
                if step is None or entry.name != f"step-{step}" or not entry.is_dir():
                    continue
                seal = check(entry.path, step)
                if isinstance(seal, str):
                    if not quiet:
                        log.warning("memory tier: not loading %s: %s", entry.name, seal)
                else:
                    found.append((step, seal.samples))
        return sorted(found, reverse=True)

    def _refusal(self, path: str, step: int) -> str:
        """Why this rank may not load `path` (empty: it may)."""
        seal = self._loadable(path, step)
        return seal if isinstance(seal, str) else ""

    def _loadable(self, path: str, step: int) -> Seal | str:
        """The seal of `path` when this rank may load it, else why not (read once)."""
        marker = os.path.join(path, catalog.MARKER_NAME)
        return self._holds(marker, step, self.dist.rank, self._rank_dir(path))

    def _copy_loadable(self, path: str, step: int) -> Seal | str:
        """The seal of copy `path` when it holds all of the rank this one keeps copies of."""
        src = peercopy.ring(self.dist.rank, self.dist.world_size, self.local_world)[1]
        return self._holds(path + ".json", step, src, path)

    def _holds(self, marker: str, step: int, rank: int, where: str) -> Seal | str:
        """The seal in `marker` when it is this job's, attempt's, config's and world size's and
        `where` holds `rank`'s files as it says, else why not."""
        try:
            with open(marker, "rb") as fh:
                seal = Seal.parse(fh.read(1 << 20))
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
        files = seal.ranks.get(str(rank))
        if not files:
            return f"rank {rank}'s state is not in it"
        try:
            present = _files(where)
        except OSError as exc:
            return f"rank {rank}'s files are gone ({exc})"
        if present != files:
            return f"rank {rank}'s files differ from the marker's: {present} != {files}"
        return seal

    def offer(self) -> Offer | None:
        """Collective: the newest sealed step every rank can load, from its own memory or
        (peer copies) from the peer that holds its copy; the same answer on every rank, or
        None (a rank can load none, or ranks hold different steps). Asked before the claim's
        step is verified: when memory's step wins, the claim's data is never read."""
        held = self.steps()[:2]
        if faults.at_step("memory_wiped", self.dist.rank):  # a test's node whose pod is new
            self._wipe()
            held = []
        if faults.at_step("memory_lost", self.dist.rank):  # a test's rank without its memory
            held = []
        step, samples = held[0] if held else (-1, -1)
        g, ws = self.dist.ckpt_group, self.dist.world_size
        if not self.peer_copy:
            mine = torch.tensor([step, -step, samples], dtype=torch.int64)
            dist.all_reduce(mine, op=dist.ReduceOp.MAX, group=g)
            high, low = int(mine[0]), -int(mine[1])
            if high < 0 or high != low:
                if self.dist.rank == 0 and high >= 0:
                    log.info("memory tier: ranks hold steps %d..%d: loading the claim", low, high)
                return None
            return Offer(high, int(mine[2]))
        copies = self.copy_steps()[:2]
        row = [v for pair in held for v in pair] + [-1, -1] * (2 - len(held))
        row += copies + [-1] * (2 - len(copies))
        table = [torch.zeros(6, dtype=torch.int64) for _ in range(ws)]
        dist.all_gather(table, torch.tensor(row, dtype=torch.int64), group=g)
        return self._offer_of([[int(v) for v in t] for t in table])

    def _offer_of(self, table: list[list[int]]) -> Offer | None:
        """The newest step every rank holds, or whose copy its peer holds (a row per rank:
        two (step, samples) of its own, two steps of the copies it keeps)."""
        ws = len(table)
        own = [{row[0]: row[1], row[2]: row[3]} for row in table]
        kept = [set(row[4:6]) for row in table]
        for step in sorted({s for held in own for s in held if s >= 0}, reverse=True):
            missing = tuple(r for r in range(ws) if step not in own[r])
            if all(step in kept[peercopy.holder(r, ws, self.local_world)] for r in missing):
                samples = next(held[step] for held in own if step in held)
                return Offer(step, samples, missing)
        if self.dist.rank == 0 and any(s >= 0 for held in own for s in held):  # not fresh
            log.info(
                "memory tier: no step that every rank holds, in its memory or in a peer's "
                "copy (%s): loading the claim",
                ", ".join(f"rank {r}: {sorted(o)}/{sorted(kept[r])}" for r, o in enumerate(own)),
            )
        return None

    def _wipe(self) -> None:
        """A test's new pod: its node's memory volume empty (local rank 0 empties it)."""
        if self.dist.local_rank == 0:
            for entry in os.scandir(self.root):
                shutil.rmtree(entry.path, ignore_errors=True)

    def choose(self, offer: Offer | None, claim: int | None) -> tuple[int, int] | None:
        """(step, samples) to load from memory, the same answer on every rank (`offer` is), or
        None. Memory wins when every rank can load the same step (`offer`), not older than
        `claim` (the step the claim would give; None: nothing). Ranks without it get it back
        from their peers' copies first (collective)."""
        if offer is None:
            return None
        if not wins(offer.step, claim):
            if self.dist.rank == 0:
                log.info(
                    "memory tier: the gang holds step %d, the claim step %s: loading from the "
                    "claim",
                    offer.step,
                    claim,
                )
            return None
        if offer.from_peers:
            self._restore(offer)
        self.held = offer.step
        if faults.at_step("memory_garbled", self.dist.rank):  # a test's rank that cannot load it
            _garble(os.path.join(self.rank_path(offer.step), ".metadata"))
        return offer.step, offer.samples

    def _restore(self, offer: Offer) -> None:
        """Collective: each rank of `offer.from_peers` gets its files of the step back from the
        rank that holds its copy; its node's seal then names them. A copy that does not arrive
        whole leaves the rank without them: its load fails, and `loaded` turns to the claim."""
        me, ws, g = self.dist.rank, self.dist.world_size, self.dist.ckpt_group
        holds_mine, mine_to = peercopy.ring(me, ws, self.local_world)
        final = self._step_dir(offer.step)
        outgoing: dict[int, torch.Tensor] = {}
        if mine_to in offer.from_peers:
            try:
                outgoing[mine_to] = peercopy.pack(self.copy_path(mine_to, offer.step))
            except OSError as exc:
                log.warning("memory tier: rank %d's copy unreadable: %s", mine_to, exc)
                outgoing[mine_to] = torch.empty(0, dtype=torch.uint8)
        wanted = [holds_mine] if me in offer.from_peers else []
        got = peercopy.swap(outgoing, wanted, g)
        if wanted:
            try:
                files = peercopy.unpack(got[holds_mine], self._rank_dir(final))
                log.info(
                    "memory tier: rank %d got its step %d back from rank %d's copy (%d bytes)",
                    me,
                    offer.step,
                    holds_mine,
                    sum(files.values()),
                )
            except (OSError, ValueError) as exc:
                log.warning("memory tier: rank %d's copy from rank %d: %s", me, holds_mine, exc)
        dist.barrier(group=g)
        node = me // self.local_world
        if self.dist.local_rank == 0 and any(
            r // self.local_world == node for r in offer.from_peers
        ):
            self._write_seal(
                final, self._seal_for(offer.step, samples=offer.samples, directory=final)
            )
        dist.barrier(group=g)

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


def _write_atomically(path: str, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(path))
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.rename(tmp, path)


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
    return MemoryTier(
        root,
        identity=identity,
        dist_info=dist_info,
        meters=meters,
        peer_copy=cfg.memory.peer_copy,
        limit=int(config_base.quantity(cfg.memory.size_limit)),
    )

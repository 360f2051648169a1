"""Each rank's flight record: where it is (phase, block, step), the collectives it entered and
completed, its memory; kept where it outlives the rank and told before the operator erases it.

The FSDP article's advice for a hang is to "compare the last completed collective or module
transition on each rank" and for an OOM to "locate the phase"; both clues die with the pods.
So a rank keeps:

- a live record in its pod's termination-message file (contract.RecordClass.LIVE), rewritten at
  every phase change: the kubelet reports it when the rank is killed without a word (a kernel
  OOM kill, SIGKILL), so `OOMKilled` comes with the phase, step and memory;
- a watchdog: when no step completed for `FSDP_HANG_SECONDS` (the job's progress deadline) it
  prints every thread's stack and one `FSDP_EVIDENCE {json}` line to its log, where the
  operator reads them before it deletes the pods, and writes both under the job's checkpoint
  root (`.evidence/attempt-<N>/rank-<R>.txt`, the newest EVIDENCE_ATTEMPTS attempts kept):
  evidence.py writes them;
- with restarts in place, a faster deadline measured in the rank's own steps
  (`FSDP_HANG_STEP_TIMES`, the job's `failurePolicy.hangStepTimes`; `fast_deadline`): once it has
  stepped a few times, a rank in a training phase whose collectives and steps all stop for that
  many times its median step (at least `FSDP_HANG_FLOOR_SECONDS`) waits on a peer that stopped, or
  has stopped itself, and ends itself as a Hang (after a restart in place, from its second step by
  its previous generation's median, prior.py, until its own steps suffice). Its keeper restarts
  the gang in place in seconds, where the job's progress deadline would wait minutes. Never in a
  save, a load, the start or a phase a kit loop names itself (`kit.phase(...)`), nor in the two
  steps after a checkpoint save to the claim (`hold_fast`: one rank's slow staging, or rank 0's
  metadata and marker, holds its peers in the next steps' collectives). A step's time is measured
  without the seconds it spent saving, so a memory tier saving every step arms it too.

Collectives are recorded by wrapping torch.distributed's functions (FSDP2 calls them through
the module, so its all-gathers and reduce-scatters are seen too). PyTorch's own flight
recorder (TORCH_FR_BUFFER_SIZE, which the operator sets; gloo and NCCL alike) is dumped beside
the evidence as JSON (`rank-<R>.fr.json`, its newest 200 entries) and its newest entry joins
the record.

Cheap by design: a phase change is a few attribute writes and, on each pod's first local
rank, one fixed-size pwrite; nothing here may raise into training.
"""

from __future__ import annotations

import collections
import functools
import json
import logging
import math
import os
import resource
import statistics
import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from typing import Any

from fsdp_worker import contract
from fsdp_worker.telemetry import evidence, prior, termination

log = logging.getLogger(__name__)

WATCH_SECONDS = 1.0
FAST_WATCH_SECONDS = 0.25  # the watchdog's period while the fast deadline is armed
LATE_SECONDS = 1.0
"""A watchdog that wakes this much later than its period was not running: nor was the rest of
its process (frozen, stopped, starved of CPU, or a pause holding the interpreter's lock such as
a long garbage collection). The fast deadline then counts from its waking: a process's own
pause is no peer's stop (`Recorder.tick`)."""
HANG_FLOOR_SECONDS = 10.0
"""The fast deadline is never shorter (FSDP_HANG_FLOOR_SECONDS, the job's
failurePolicy.hangFloorSeconds, says otherwise): a GC pause, a jittery step, a data loader's
workers starting an epoch again, a recompile or a busy host's scheduling delay of a rank with
sub-second steps is no hang."""
FAST_AFTER_STEPS = 5
"""Steps of its own (since its process started, a save's or a load's excluded) before a rank's
median step time arms the fast deadline: the first steps are slow and measure nothing."""
STEP_TIMES_KEPT = 32
MEMORY_EVERY_SECONDS = 0.5
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
_COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_single",  # FSDP2's all-gather since torch 2.1x
    "reduce_scatter",
    "reduce_scatter_tensor",
    "reduce_scatter_single",  # and its reduce-scatter
    "broadcast",
    "barrier",
    "all_to_all_single",
    "gather",
    "scatter",
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
)


class Phase:
    """What a rank is doing, in the article's words (docs/contract.md lists them)."""

    INIT = "initialization"
    LOAD = "checkpoint load"
    DATA = "data loading"
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer step"
    SYNC = "end-of-step sync"
    SAVE = "checkpoint save"
    EVAL = "evaluation"  # for a kit loop's own evaluation: no fast deadline in it
    DONE = "finished"


TRAINING_PHASES = frozenset(
    {Phase.DATA, Phase.FORWARD, Phase.BACKWARD, Phase.OPTIMIZER, Phase.SYNC}
)
"""The phases of a step, where every rank keeps meeting its peers: the only ones the fast
deadline judges."""
HELD_AFTER_SAVE_STEPS = 2


def fast_deadline(
    step_seconds: Collection[float],
    *,
    phase: str,
    held: bool,
    step_times: float,
    floor: float = HANG_FLOOR_SECONDS,
    earlier: float | None = None,
) -> float | None:
    """Seconds without a collective or a step that make a hang of this rank's gang, or None
    where only the job's progress deadline judges: `step_times` x the median step (`median`),
    at least `floor`, in a training phase, unless `held` (the steps after a save to the claim)."""
    if step_times <= 0 or phase not in TRAINING_PHASES or held:
        return None
    pace = median(step_seconds, earlier)
    return None if pace is None else max(step_times * pace, floor)


def median(step_seconds: Collection[float], earlier: float | None = None) -> float | None:
    """The median of a rank's recent step times once it has FAST_AFTER_STEPS of them; before,
    `earlier` (its previous generation's, prior.py), or None: nothing to judge by yet."""
    if len(step_seconds) >= FAST_AFTER_STEPS:
        return statistics.median(step_seconds)
    return earlier


def _cgroup_limit() -> int | None:
    for path in _CGROUP_LIMITS:
        try:
            with open(path) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < 1 << 60:
            return int(raw)
    return None


def _rss() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class Recorder:
    """One process's record. Written by the training thread (and FSDP's hooks, and a save's
    background thread for its collectives), read by the watchdog: every field is replaced
    whole, so a reader sees an old or a new value, never half of one."""

    def __init__(self, *, rank: int, local_rank: int, attempt: int) -> None:
        self.rank, self.local_rank, self.attempt = rank, local_rank, attempt
        self.step: int | None = None  # last completed step
        self.phase = Phase.INIT
        self.block: int | None = None
        self.phase_since = time.monotonic()
        self.last_step_at = time.monotonic()
        self.moved_at = self.last_step_at  # the last collective entered, issued or completed
        self.resumed_at = 0.0  # when the watchdog last woke late (LATE_SECONDS): a pause ended
        self.step_seconds: collections.deque[float] = collections.deque(maxlen=STEP_TIMES_KEPT)
        self.held_steps = 0  # steps the fast deadline waits out (hold_fast)
        self.aside = 0  # `during` blocks of phases that are not a step's own, open now
        self._saving = 0.0  # seconds of the current step in a save, left out of its time
        self.collective: dict[str, Any] | None = None
        self.collectives = 0
        # Seconds the training thread spent inside blocking collectives (FSDP's all-gathers and
        # reduce-scatters, the step's all-reduce): what it waited for its peers, for pace.py.
        self.collective_seconds = 0.0
        self.thread = threading.get_ident()
        self.memory: dict[str, int | None] = {}
        self._memory_at = 0.0
        self._limit = _cgroup_limit()
        self._device: Any = None
        self._live_fd: int | None = None
        self._lock = threading.Lock()
        self._evidence_root: str | None = None
        self._hang_seconds: float | None = None
        self._startup_seconds: float | None = None
        self._step_times = 0.0
        self._floor = HANG_FLOOR_SECONDS
        self._earlier: float | None = None  # the previous generation's median step (prior.py)
        self._kept_at = -math.inf  # when this rank last wrote its own for the next one
        self._reported_stall = False
        self._stop = threading.Event()
        self.ledger: dict[str, int] = {}  # the planned bytes per rank (ledger.planned)
        self._sums: Callable[[], dict[str, Any]] | None = None  # global rank 0's totals

    # --- the training thread's side -------------------------------------------------------
    def enter(self, phase: str, block: int | None = None) -> None:
        """The rank starts `phase` (of `block`): cheap, called many times a step."""
        if phase == self.phase and block == self.block:
            return
        now = time.monotonic()
        if self.phase == Phase.SAVE:
            self._saving += now - self.phase_since
        self.phase, self.block, self.phase_since = phase, block, now
        self._write_live()

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """`phase` for the duration of the block; the previous phase afterwards. A phase that
        is not a step's own (a save, a kit loop's evaluation) keeps the fast deadline off until
        it ends, though the forward hooks name the blocks its forward passes run."""
        before, block = self.phase, self.block
        aside = phase not in TRAINING_PHASES
        self.aside += aside
        self.enter(phase)
        try:
            yield
        finally:
            self.aside -= aside
            self.enter(before, block)

    def step_done(self, step: int) -> None:
        now = time.monotonic()
        if self.step is not None:  # not the step a rank resumed at: it measures nothing
            self.step_seconds.append(max(0.0, now - self.last_step_at - self._saving))
        self._saving = 0.0
        self.held_steps = max(0, self.held_steps - 1)
        self.step, self.last_step_at = step, now
        if self._reported_stall:
            self._reported_stall = False
            log.info(
                "rank %d stepping again (step %d) after its stall was reported", self.rank, step
            )

    def hold_fast(self, steps: int = HELD_AFTER_SAVE_STEPS) -> None:
        """The fast deadline waits out the next `steps` steps (module `hold_fast`)."""
        self.held_steps = max(self.held_steps, steps)

    def use_device(self, device: Any) -> None:
        """A CUDA device's allocator figures join the memory record."""
        self._device = device if getattr(device, "type", "") == "cuda" else None

    def _collective(self, op: str, state: str) -> None:
        if threading.get_ident() == self.thread:  # a save's thread keeps no step's rhythm
            self.moved_at = time.monotonic()
        self.collective = {
            "op": op,
            "seq": self.collectives,
            "state": state,
            "phase": self.phase,
            "block": self.block,
            "step": self.step,
        }

    # --- what it reports ------------------------------------------------------------------
    def _sample_memory(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._memory_at < MEMORY_EVERY_SECONDS:
            return
        self._memory_at = now
        mem: dict[str, int | None] = {
            "rssBytes": _rss(),
            "peakRssBytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "limitBytes": self._limit,
        }
        if self._device is not None:
            import torch  # only when a CUDA device is in use

            mem["cudaAllocatedBytes"] = int(torch.cuda.memory_allocated(self._device))
            mem["cudaPeakBytes"] = int(torch.cuda.max_memory_allocated(self._device))
            mem["cudaReservedBytes"] = int(torch.cuda.memory_reserved(self._device))
            mem["cudaTotalBytes"] = int(torch.cuda.get_device_properties(self._device).total_memory)
        self.memory = mem

    def where(self) -> str:
        """The phase in words: 'backward of block 7'."""
        return self.phase if self.block is None else f"{self.phase} of block {self.block}"

    def record(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "v": 1,
            "rank": self.rank,
            "localRank": self.local_rank,
            "attempt": self.attempt,
            "step": self.step,
            "phase": self.phase,
            "block": self.block,
            "where": self.where(),
            "phaseSeconds": round(now - self.phase_since, 3),
            "stalledSeconds": round(now - self.last_step_at, 3),
            "collective": self.collective,
            "collectives": self.collectives,
            "memory": self.memory,
        }

    def failure_fields(self) -> dict[str, Any]:
        """What a failure message adds (termination.write's `extra`): where the rank was, its
        memory now, and the ledger's plan (an OOM's allocator view is measured against it)."""
        self._sample_memory(force=True)
        fields: dict[str, Any] = {"phase": self.where(), "memory": self.memory}
        if self.ledger:
            fields["ledger"] = self.ledger
        if self._sums is not None:
            fields[contract.SUMS] = self._sums()
        return fields

    def sums_from(self, source: Callable[[], dict[str, Any]]) -> None:
        """Global rank 0's run totals (contract.sums, read from its metrics): in its live
        record at each rewrite and in its failure message."""
        self._sums = source

    def note_ledger(self, planned: dict[str, Any]) -> None:
        """Keep the ledger's persistent and gathered bytes per rank."""
        keys = ("persistentBytesPerRank", "largestGatheredBytes")
        self.ledger = {k: int(planned[k]) for k in keys if isinstance(planned.get(k), int)}

    # --- the live record in the termination-message file -----------------------------------
    def open_live(self) -> None:
        """Keep a live record in this pod's termination-message file (first local rank only:
        they share the file, and the ranks of a pod are in the same phase)."""
        if self.local_rank != 0:
            return
        target = termination.path()
        if target is None:
            return
        try:
            self._live_fd = os.open(target, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            log.warning("no live record in %s: %s", target, exc)
            return
        self._write_live()

    def _write_live(self) -> None:
        if self._live_fd is None:
            return
        self._sample_memory()
        doc = {
            "class": contract.RecordClass.LIVE,
            "rank": self.rank,
            "step": self.step,
            "exitCode": None,
            "message": "",
            "phase": self.where(),
            "memory": self.memory,
        }
        if self._sums is not None:
            doc[contract.SUMS] = contract.totals(self._sums())
        with self._lock:
            termination.write_live(self._live_fd, json.dumps(doc, separators=(",", ":")))

    def close_live(self, *, clear: bool) -> None:
        """Stop the live record; `clear`: the rank exits well, a Succeeded pod says nothing
        (unless a message of the run's end replaced the record)."""
        fd, self._live_fd = self._live_fd, None
        if fd is None:
            return
        with self._lock:
            if clear:
                termination.clear_live(fd)
            os.close(fd)

    # --- the watchdog ----------------------------------------------------------------------
    def watch(
        self,
        *,
        hang_seconds: float | None,
        evidence_root: str | None,
        startup_seconds: float | None = None,
        step_times: float = 0.0,
        floor: float = HANG_FLOOR_SECONDS,
    ) -> None:
        """Start the watchdog (no-op without a deadline): a stall is `hang_seconds` with no
        step, or before this process's first step, `startup_seconds` (default the same); with
        restarts in place and `step_times`, also `fast_deadline`'s."""
        self._hang_seconds, self._evidence_root = hang_seconds, evidence_root
        self._startup_seconds = startup_seconds or hang_seconds
        self._step_times = step_times if os.environ.get(contract.ENV_GANG) else 0.0
        self._floor = floor
        if self._step_times > 0:
            self._earlier = prior.read(self.local_rank)
        if evidence_root is not None and self.rank == 0:
            evidence.prune(evidence_root, keep=evidence.EVIDENCE_ATTEMPTS, current=self.attempt)
        if not hang_seconds:
            return
        threading.Thread(target=self._watch, name="fsdp-flight", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _watch(self) -> None:
        assert self._hang_seconds is not None
        period = FAST_WATCH_SECONDS if self._step_times > 0 else WATCH_SECONDS
        last = time.monotonic()
        while not self._stop.wait(period):
            last = self.tick(time.monotonic(), last=last, period=period)

    def tick(self, now: float, *, last: float, period: float) -> float:
        """One watchdog round at `now`, the last at `last`: a round that came LATE_SECONDS past
        its period ends a pause of this whole process, from which the fast deadline counts."""
        if now - last > period + LATE_SECONDS:
            self.resumed_at = now
        if self._reported_stall:
            return now
        try:
            self._check(now)
        except Exception:  # the watchdog must outlive its own faults: it is the deadline
            log.exception("the flight watchdog's check failed")
        return now

    def _check(self, now: float) -> None:
        self._keep_pace(now)
        stalled = now - self.last_step_at
        allowed = self._hang_seconds if self.step is not None else self._startup_seconds
        assert allowed is not None
        fast = self.fast_stall(now)
        if fast is not None:
            self._reported_stall = True
            self._report()
            self.end_hung(stalled, why=fast)
        if stalled >= allowed:
            self._reported_stall = True
            self._report()
            if os.environ.get(contract.ENV_GANG):
                self.end_hung(stalled)

    def _keep_pace(self, now: float) -> None:
        """Write this rank's median step for the next generation, now and then (prior.py)."""
        if self._step_times <= 0 or now - self._kept_at < prior.WRITE_EVERY_SECONDS:
            return
        pace = median(tuple(self.step_seconds))
        if pace is not None:
            prior.write(self.local_rank, pace)
            self._kept_at = now

    def fast_stall(self, now: float) -> str | None:
        """Why the gang hangs by `fast_deadline` (None: it does not, or the rule is off)."""
        if self._step_times <= 0:
            return None
        steps = tuple(self.step_seconds)  # appended by the training thread meanwhile
        # the previous generation's pace, from this process's second step (its first compiles)
        earlier = self._earlier if self.step is not None else None
        limit = fast_deadline(
            steps,
            phase=self.phase,
            held=self.held_steps > 0 or self.aside > 0,
            step_times=self._step_times,
            floor=self._floor,
            earlier=earlier,
        )
        quiet = now - max(self.moved_at, self.last_step_at, self.resumed_at)
        if limit is None or quiet < limit:
            return None
        pace = median(steps, earlier)
        whose = (
            "its median step"
            if len(steps) >= FAST_AFTER_STEPS
            else ("its previous generation's median step")
        )
        last = self.collective
        where = (
            f"its last collective {last['op']} #{last['seq']} {last['state']}"
            if last
            else "no collective yet"
        )
        return (
            f"no collective and no step for {quiet:.1f}s in {self.where()}, {where} "
            f"({self._step_times:g} x {whose} of {pace:.3f}s, at least "
            f"{self._floor:g}s: failurePolicy.hangStepTimes, hangFloorSeconds)"
        )

    def _report(self) -> None:
        try:
            self.report_stall()
        except Exception:  # evidence is advice: it never takes the rank down
            log.exception("could not report the stall")

    def end_hung(self, stalled: float, *, why: str | None = None) -> None:
        """With restarts in place (fsdp_worker.keeper.gang in front of torchrun), a rank past its
        own hang deadline, or the fast one (`why`), ends itself, saying so: its keeper restarts
        the gang's ranks in the same pods, before the operator's deadline would recreate them."""
        text = why or f"no step completed for {stalled:.0f}s (FSDP_HANG_SECONDS)"
        try:
            termination.write(
                failure_class=contract.FailureClass.HANG.value,
                rank=self.rank,
                step=self.step,
                exit_code=int(contract.ExitCode.RETRYABLE),
                text=f"{text}; restarting in place",
                extra=self.failure_fields(),
            )
        finally:
            os._exit(int(contract.ExitCode.RETRYABLE))

    def report_stall(self) -> dict[str, Any]:
        """Stacks and the record, to the log (one write) and the evidence file
        (evidence.report)."""
        self._sample_memory(force=True)
        path = evidence.file_path(self._evidence_root, attempt=self.attempt, rank=self.rank)
        return evidence.report(self.record(), rank=self.rank, path=path)


# --- the process's recorder, and the hooks that feed it ----------------------------------------
_current: Recorder | None = None


def current() -> Recorder | None:
    return _current


def start(*, rank: int, local_rank: int, attempt: int) -> Recorder:
    """This process's recorder: the live record opened, collectives wrapped."""
    global _current
    _current = Recorder(rank=rank, local_rank=local_rank, attempt=attempt)
    _current.open_live()
    _wrap_collectives()
    return _current


def collective_seconds() -> float:
    """The training thread's seconds in blocking collectives so far (0 without a recorder)."""
    return _current.collective_seconds if _current is not None else 0.0


def finish(*, clear: bool) -> None:
    global _current
    if _current is not None:
        _current.stop()
        _current.close_live(clear=clear)
    _current = None


def enter(phase: str, block: int | None = None) -> None:
    if _current is not None:
        _current.enter(phase, block)


@contextmanager
def during(phase: str) -> Iterator[None]:
    if _current is None:
        yield
        return
    with _current.during(phase):
        yield


def step_done(step: int) -> None:
    if _current is not None:
        _current.step_done(step)


def hold_fast(steps: int = HELD_AFTER_SAVE_STEPS) -> None:
    """A save to the claim: the fast hang deadline waits out the next `steps` steps, where its
    slowest rank's staging, metadata or marker still holds the others."""
    if _current is not None:
        _current.hold_fast(steps)


def _wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def recorded(*args: Any, **kwargs: Any) -> Any:
        rec = _current
        if rec is None:
            return fn(*args, **kwargs)
        rec.collectives += 1
        rec._collective(name, "entered")
        began = time.monotonic()
        result = fn(*args, **kwargs)
        if not kwargs.get("async_op") and threading.get_ident() == rec.thread:
            rec.collective_seconds += time.monotonic() - began  # a save's thread is not the step
        # An async op has only been issued; FSDP waits for it in the next phase it records.
        rec._collective(name, "issued" if kwargs.get("async_op") else "completed")
        return result

    recorded.__fsdp_flight__ = True  # type: ignore[attr-defined]
    return recorded


def _wrap_collectives() -> None:
    import torch.distributed as dist

    for name in _COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, "__fsdp_flight__", False):
            setattr(dist, name, _wrap(name, fn))


def watch_blocks(model: Any) -> int:
    """Record forward and backward of each FSDP-wrapped block of `model` (its `fully_shard`
    children, in module order; the root as plain forward); returns how many blocks are watched.
    The pre-hooks go first, so that FSDP's all-gather of a block is recorded as the block's."""
    from torch import nn
    from torch.distributed.fsdp import FSDPModule

    modules: list[nn.Module] = list(model.modules())
    blocks = [m for m in modules if isinstance(m, FSDPModule) and m is not model]
    model.register_forward_pre_hook(functools.partial(_forward_pre, None), prepend=True)
    for index, fsdp_block in enumerate(blocks):
        block: nn.Module = fsdp_block  # FSDPModule is a mixin of an nn.Module
        block.register_forward_pre_hook(functools.partial(_forward_pre, index), prepend=True)
        block.register_forward_hook(functools.partial(_forward_post, index))
    return len(blocks)


def _forward_pre(index: int | None, module: Any, args: Any) -> None:
    rec = _current
    if rec is None:
        return
    # activation checkpointing runs a block's forward again inside backward
    rec.enter(Phase.BACKWARD if rec.phase == Phase.BACKWARD else Phase.FORWARD, index)


def _forward_post(index: int, module: Any, args: Any, output: Any) -> None:
    rec = _current
    if rec is None or rec.phase == Phase.BACKWARD:
        return
    tensor = output[0] if isinstance(output, tuple) and output else output
    if getattr(tensor, "requires_grad", False):
        tensor.register_hook(functools.partial(_backward_of, index))


def _backward_of(index: int, grad: Any) -> None:
    enter(Phase.BACKWARD, index)

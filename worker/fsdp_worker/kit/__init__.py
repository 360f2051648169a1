"""The trainer kit: what a team's own training script needs to keep docs/contract.md, in one
import. It uses torch and this package; nothing of the operator. The built-in trainer
(fsdp_worker.train.main) is one user of it.

    import sys
    from fsdp_worker import kit

    def train(run: kit.Run) -> None:
        model = build_my_model()
        fully_shard(model, mesh=run.dist.mesh)   # or any FSDP2 / DCP-savable state
        optimizer = torch.optim.AdamW(model.parameters())
        state = {"app": kit.ModelState(model, optimizer)}
        point = run.resume(state)                # the checkpoint the operator chose, loaded
        step = point.step if point else 0
        while step < run.config.training.steps:
            ...                                  # one optimizer step
            step += 1
            run.after_step(step, samples=..., state=state, final=step == ...)

    if __name__ == "__main__":
        sys.exit(kit.main(train))

`main` joins the gang, serves rank 0's metrics, turns every exception into the documented
exit code and termination message, and cleans up. `Run.resume` chooses the checkpoint (the
path the operator names, or `auto` under its rules: lineage, job uid, config hash, the step it
expects) and loads it with DCP at any world size. `Run.after_step` reports progress, saves
sealed checkpoints (partial directory, fence, rename, then the marker) when due, and on SIGTERM
saves the same step on every rank and exits 143.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from fsdp_worker import contract
from fsdp_worker.checkpointing import checkpoint, export, memtier, resume, schedule, state
from fsdp_worker.contract import config, errors, objstore
from fsdp_worker.kit import environment
from fsdp_worker.runtime import distributed
from fsdp_worker.runtime.distributed import DistInfo
from fsdp_worker.telemetry import flight, metrics, termination

log = logging.getLogger("fsdp_worker")
EXIT_COPY_WAIT = 10.0
"""Seconds a failing rank waits for its last memory save's peer copies before it leaves (its
peers, on their way out too, finish theirs; one that is gone never answers)."""

# The failures a trainer raises to choose its exit code and class (docs/contract.md).
WorkerError = errors.WorkerError
ConfigError = errors.ConfigError
CheckpointError = errors.CheckpointError
Preempted = errors.Preempted
ResumePoint = resume.ResumePoint
# Where the rank is, for the evidence of a hang or an OOM (flight.py): `with kit.phase(...)`.
# A phase that is not a step's own (kit.Phase.EVAL, or any name of the loop's) is never
# judged by failurePolicy.hangStepTimes, only by the progress deadline.
Phase = flight.Phase
phase = flight.during
# What the operator gave this rank (environment.py).
Settings = environment.Settings
load_settings = environment.load_settings


class StopFlag:
    """Set by SIGTERM; read once per step."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def install(self) -> None:
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.event.set()

    def __call__(self) -> bool:
        return self.event.is_set()


class ModelState(Stateful):
    """A model and its optimizer as one DCP entry, through DCP's state-dict helpers: FSDP2
    shards are saved as such and resharded on load at another world size."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        self.model, self.optimizer = model, optimizer
        flight.watch_blocks(model)  # forward/backward of each fully_shard block, for evidence

    def state_dict(self) -> dict[str, Any]:
        optimizers = () if self.optimizer is None else self.optimizer
        model_sd, optim_sd = get_state_dict(self.model, optimizers)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        optimizers = () if self.optimizer is None else self.optimizer
        set_state_dict(
            self.model,
            optimizers,
            model_state_dict=state_dict["model"],
            optim_state_dict=state_dict["optim"],
        )


@dataclass
class Run:
    """One rank's run under the operator: its settings, its gang, its metrics and saves."""

    settings: Settings
    dist: DistInfo
    meters: metrics.Metrics
    stop_requested: Callable[[], bool]
    memory: memtier.MemoryTier | None = None
    memory_schedule: schedule.Schedule | None = None  # (before the field named `schedule`)
    manager: checkpoint.CheckpointManager | None = None
    schedule: schedule.Schedule | None = None
    point: ResumePoint | None = None
    tracked: state.TrainState | None = None  # the built-in trainer's state, for failure reports
    step: int | None = None  # the last step reported; the step a failure message names
    steps_run: int = 0
    step_seconds: float = 0.0
    blocked_seconds: float = 0.0
    _saved_step: int | None = None
    _last_mark: float = field(default_factory=time.monotonic)

    @property
    def config(self) -> config.WorkerConfig:
        """`spec.training` and `spec.checkpoint` of the job (checkpoint.root: this job's)."""
        return self.settings.cfg

    @property
    def identity(self) -> checkpoint.Identity:
        training = self.settings.cfg.training
        rules = self.settings.rules
        if self.point is not None and self.point.memory:  # the lineage of the attempt's start
            start = rules.resumed_from_step if rules is not None else None
        else:
            start = self.point.step if self.point else None
        return checkpoint.Identity(
            attempt=self.settings.attempt,
            resumed_from_step=start,
            config_hash=training.resume_hash(),
            global_batch_size=training.global_batch_size,
            job_uid=self.settings.job_uid,
            generation=self.settings.generation,
        )

    def choose(self) -> ResumePoint | None:
        """The checkpoint to resume from, the same on every rank; collective. A checkpoint
        that should exist and does not stops the run (ConfigError), never a fresh start."""
        s = self.settings
        flight.enter(flight.Phase.LOAD)
        self.memory = memtier.open_tier(
            s.cfg.checkpoint, identity=self.identity, dist_info=self.dist, meters=self.meters
        )
        # Memory's offer first: the claim's step is then hashed only when it is the one loaded.
        offer = (
            self.memory.offer()
            if self.memory is not None and s.resume == contract.RESUME_AUTO
            else None
        )
        claim = self._claim(memory_step=offer[0] if offer is not None else None)
        if self.memory is None:
            return claim
        held = self.memory.choose(offer, claim.step if claim is not None else None)
        if held is None:
            return claim
        step, samples = held
        peers = offer.from_peers if offer is not None else ()
        log.info(
            "resuming from step %d in memory%s (the claim offers %s)",
            step,
            f", ranks {list(peers)} from peers' copies" if peers else "",
            claim.step if claim else "nothing",
        )
        return ResumePoint(
            self.memory.rank_path(step),
            step,
            self.dist.world_size,
            samples,
            s.cfg.training.global_batch_size,
            memory=True,
        )

    def _claim(self, *, memory_step: int | None) -> ResumePoint | None:
        """The claim's step to resume from (resume.choose; collective), its set-aside steps
        told in metrics. `memory_step`: what memory offers, so a step not newer is not hashed."""
        s = self.settings
        choice = resume.choose(
            s.cfg,
            resume=s.resume,
            attempt=s.attempt,
            dist_info=self.dist,
            job_uid=s.job_uid,
            rules=s.rules,
            generation=s.generation,
            memory_step=memory_step,
        )
        newest = sorted(choice.quarantined)[-contract.QUARANTINED_SERIES :]
        for step in newest:  # the operator reads them from rank 0's metrics
            self.meters.quarantined.labels(step=str(step)).set(1)
        return choice.point

    def load(
        self, point: ResumePoint | None, load: Callable[[ResumePoint], object]
    ) -> ResumePoint | None:
        """Load `point` (from `choose`) with `load`; collective: what was loaded. When a rank
        cannot load memory's step, every rank drops it and loads the claim's step instead,
        verified as any claim load is (a restart in place would choose the same step again)."""
        if point is None:
            return None
        if not point.memory or self.memory is None:
            with flight.during(flight.Phase.LOAD):
                load(point)
            return point
        failed: errors.CheckpointError | None = None
        try:
            with flight.during(flight.Phase.LOAD):
                load(point)
        except errors.CheckpointError as exc:  # memory is loaded without collectives
            failed = exc
        if self.memory.loaded(point.step, ok=failed is None):
            return point
        log.warning(
            "could not load step %d from memory (%s): loading the claim's instead",
            point.step,
            failed or "another rank could not",
        )
        fallback = self._claim(memory_step=None)
        if fallback is not None:
            with flight.during(flight.Phase.LOAD):
                load(fallback)
        return fallback

    def resume(self, state_dict: dict[str, Any]) -> ResumePoint | None:
        """Choose, then load into `state_dict` in place (None: start fresh); collective.
        Call once, before the first step: it also opens this attempt's checkpoint directory."""
        point = self.load(
            self.choose(),
            lambda p: resume.read_into(p, lambda _keys: state_dict, dist_info=self.dist),
        )
        if point is not None:
            log.info("resumed from %s: step %d, samples %d", point.path, point.step, point.samples)
        self.opened(point)
        return point

    def opened(self, point: ResumePoint | None, *, start_step: int | None = None) -> None:
        """Resume is done: report it, fence the directory for this attempt, start the save
        schedule. `resume` calls it; a trainer that loads by itself calls it after `choose`."""
        self.point = point
        self.meters.loaded(
            point.step if point is not None else None, memory=point is not None and point.memory
        )
        self.manager = checkpoint.CheckpointManager(
            self.settings.cfg.checkpoint,
            identity=self.identity,
            dist_info=self.dist,
            meters=self.meters,
        )
        self.manager.remove_abandoned()
        first = start_step if start_step is not None else (point.step if point else 0)
        self.schedule, *memory = [
            schedule.Schedule.of(
                self.settings.cfg.checkpoint,
                start_step=first,
                reliability=self.settings.reliability,
                meters=self.meters,
                dist_info=self.dist,
                generation=self.settings.generation,
                memory=tier,
            )
            for tier in (False, *([True] if self.memory is not None else []))
        ]
        self.memory_schedule = memory[0] if memory else None
        self._last_mark = time.monotonic()
        flight.step_done(first)  # the watchdog counts from here, not from the imports
        flight.enter(flight.Phase.DATA)

    def progress(self, step: int, *, loss: float | None = None) -> None:
        """Step `step` is done: rank 0's metrics say so (hang detection reads them)."""
        now = time.monotonic()
        flight.step_done(step)
        self.step = step
        self.steps_run += 1
        self.step_seconds += now - self._last_mark
        self._last_mark = now
        m = self.meters
        m.steps_run.set(self.steps_run)
        m.step_seconds_sum.set(self.step_seconds)
        if self.steps_run == 1:
            m.reached(contract.Milestone.FIRST_STEP)
        m.step.set(step)
        m.last_step_time.set(time.time())
        if loss is not None:
            m.loss.set(loss)

    def agree_to_stop(self) -> bool:
        """Whether any rank got SIGTERM; every rank gets the same answer. Collective: call it
        on every rank once per step, so that all of them stop after the same step."""
        flag = torch.tensor(1.0 if self.stop_requested() else 0.0, device=self.dist.device)
        with flight.during(flight.Phase.SYNC):
            dist.all_reduce(flag)
        return bool(flag.item() > 0)

    def save(self, step: int, *, samples: int, state: dict[str, Any]) -> None:
        """A sealed checkpoint of `state` as `step`, `samples` its data cursor; collective."""
        if self.manager is None:
            raise errors.ConfigError(
                "the trainer saved before Run.resume (or Run.opened): resume first, so that a "
                "restart never trains from step 0 when a checkpoint exists"
            )
        began = time.monotonic()
        with flight.during(flight.Phase.SAVE):
            self.manager.save_state(step, samples=samples, make_state=lambda: state)
        blocking = time.monotonic() - began
        self.blocked_seconds += blocking
        self.meters.ckpt_blocked.set(self.blocked_seconds)
        self._saved_step = step
        self._last_mark += blocking  # a save is not step time
        assert self.schedule is not None
        self.schedule.saved(
            step, blocking=blocking, steps_run=self.steps_run, step_seconds=self.step_seconds
        )

    def save_memory_if_due(
        self,
        step: int,
        *,
        samples: int,
        make_state: Callable[[], dict[str, Any]],
        claimed: bool,
        totals: tuple[int, float] | None = None,
    ) -> float:
        """Seal `step` in the memory tier when its schedule says, or when the claim just saved
        it (so memory is never older than the claim); collective. Returns seconds blocked.
        `totals`: (steps run, their seconds) of a loop that does not report through this Run
        (the built-in trainer's); `auto` learns the step time from them."""
        if self.memory is None or self.memory_schedule is None:
            return 0.0
        if not (claimed or self.memory_schedule.due(step)):
            return 0.0
        with flight.during(flight.Phase.SAVE):
            blocking = self.memory.save(step, samples=samples, make_state=make_state)
        steps_run, step_seconds = totals or (self.steps_run, self.step_seconds)
        self.memory_schedule.saved(
            step, blocking=blocking, steps_run=steps_run, step_seconds=step_seconds
        )
        return blocking

    def after_step(
        self,
        step: int,
        *,
        samples: int,
        state: dict[str, Any],
        loss: float | None = None,
        final: bool = False,
    ) -> None:
        """Everything the contract asks after an optimizer step; collective. Reports progress,
        saves when the schedule says, at the `final` step, and on SIGTERM (then raises
        Preempted: exit 143 with the step saved)."""
        if self.manager is None:
            raise errors.ConfigError("call Run.resume(state) before the first step")
        self.progress(step, loss=loss)
        self.manager.poll()
        stop = self.agree_to_stop()
        assert self.schedule is not None
        claimed = stop or final or self.schedule.due(step)
        if claimed:
            self.save(step, samples=samples, state=state)
        if not (stop or final):
            blocking = self.save_memory_if_due(
                step, samples=samples, make_state=lambda: state, claimed=claimed
            )
            self.blocked_seconds += blocking
            self.meters.ckpt_blocked.set(self.blocked_seconds)
            self._last_mark += blocking
        if stop:
            self.manager.wait()
            raise errors.Preempted(f"SIGTERM: saved a complete checkpoint of step {step}")
        if final:
            self.manager.wait()
        flight.enter(flight.Phase.DATA)  # until the first block's forward, unless told

    def export(self, model: nn.Module) -> None:
        """On success, the model in the form `checkpoint.export` names (none when unset),
        under <root>/export/ (checkpointing/export.py); collective."""
        if self.config.checkpoint.export is None:
            return
        root, step = self.config.checkpoint.root, self.current_step or 0
        with flight.during(flight.Phase.SAVE):
            export.export(model, root=root, step=step)

    @property
    def current_step(self) -> int | None:
        return self.tracked.step if self.tracked is not None else self.step


def classify(exc: BaseException) -> tuple[int, str]:
    """An exception as the contract's exit code and failure class."""
    if isinstance(exc, errors.WorkerError):
        return int(exc.exit_code), str(exc.failure_class)
    if isinstance(exc, torch.OutOfMemoryError):
        return int(contract.ExitCode.RETRYABLE), str(contract.FailureClass.OOM)
    return int(contract.ExitCode.RETRYABLE), str(contract.FailureClass.RUNTIME)


def _memory_fields(run: Run | None) -> dict[str, Any]:
    """The step the memory tier holds: the operator's no-progress rule counts it as sealed."""
    held = run.memory.held if run is not None and run.memory is not None else None
    return {contract.MEMORY_STEP_KEY: held} if held is not None else {}


def _setup_logging(rank: int) -> None:
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"%(asctime)s rank{rank} %(levelname)s %(name)s: %(message)s",
    )


def main(
    train: Callable[[Run], None],
    *,
    before_rendezvous: Callable[[Settings], None] | None = None,
) -> int:
    """Run `train` as one rank under the operator; returns the exit code for `sys.exit`.

    `before_rendezvous` may refuse a config before the gang forms (raise ConfigError). Every
    exception becomes an exit code and, for the first failing rank of the pod, the JSON
    termination message; saves in flight are waited for only on success.
    """
    rank = distributed.env_rank()
    _setup_logging(rank)
    recorder = flight.start(
        rank=rank,
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        attempt=environment.int_env_or(contract.ENV_ATTEMPT, 0),
    )
    termination.register(rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", "0")))
    stop = StopFlag()
    stop.install()
    code = int(contract.ExitCode.SUCCESS)
    run: Run | None = None
    try:
        settings = environment.load_settings()
        if before_rendezvous is not None:
            before_rendezvous(settings)
        dist_info = distributed.init()
        remote = objstore.is_uri(settings.cfg.checkpoint.root)  # evidence stays on claims
        recorder.use_device(dist_info.device)
        recorder.watch(
            hang_seconds=environment.int_env(contract.ENV_HANG_SECONDS, 0) or None,
            startup_seconds=environment.int_env(contract.ENV_STARTUP_SECONDS, 0) or None,
            evidence_root=None if remote else settings.cfg.checkpoint.root,
            step_times=environment.hang_step_times(),
            floor=environment.int_env(contract.ENV_HANG_FLOOR_SECONDS, 0)
            or flight.HANG_FLOOR_SECONDS,
        )
        meters = metrics.Metrics()
        if dist_info.rank == 0:
            meters.serve(settings.metrics_port)
            recorder.sums_from(meters.sums)  # in its live record and its failure message
        meters.reached(contract.Milestone.RENDEZVOUS)
        if not remote:  # an object store's prefixes need no creating
            os.makedirs(settings.cfg.checkpoint.root, exist_ok=True)
        run = Run(settings, dist_info, meters, stop)
        train(run)
        flight.enter(flight.Phase.DONE)
        log.info("training complete")
        if dist_info.rank == 0:  # what an operator that reads no claim cannot see otherwise
            sealed = run.manager.sealed_step if run.manager is not None else None
            termination.write(
                failure_class=contract.RecordClass.COMPLETED,
                rank=0,
                step=run.current_step,
                exit_code=code,
                text=contract.completion_message(sealed_step=sealed),
                extra={contract.SUMS: meters.sums()},
            )
    except BaseException as exc:  # every failure becomes an exit code
        code, failure_class = classify(exc)
        step = run.current_step if run is not None else None
        log.error("exit %d (%s) at step %s: %s", code, failure_class, step, exc)
        if not isinstance(exc, errors.WorkerError | KeyboardInterrupt):
            log.error("%s", traceback.format_exc())
        blamed, text, extra = rank, str(exc), recorder.failure_fields()
        symptom = failure_class == contract.FailureClass.RUNTIME and contract.symptom_of(text)
        if symptom and (killed := termination.killed_sibling(rank=rank, symptom=text)):
            (blamed, local, text), failure_class = killed, str(contract.FailureClass.KILLED)
            if local == 0:  # the pod's first rank: its live record says where it was
                extra = {**extra, **termination.live_fields()}
        termination.write(
            failure_class=failure_class,
            rank=blamed,
            step=step,
            exit_code=code,
            text=text,
            extra={**extra, **_memory_fields(run)},
        )
    finally:
        termination.unregister(local_rank=int(os.environ.get("LOCAL_RANK", "0")))
        flight.finish(clear=code == contract.ExitCode.SUCCESS)
        if run is not None and run.manager is not None:
            run.manager.close(wait=code == contract.ExitCode.SUCCESS)
        if run is not None and run.memory is not None:  # the last save's copies land first
            run.memory.join_copies(None if code == contract.ExitCode.SUCCESS else EXIT_COPY_WAIT)
        distributed.destroy()
    return code

"""The training loop, and nothing else: forward, backward with accumulation, step, report,
checkpoint at the configured points, stop on request.

The loss of a micro batch is its token-summed cross entropy divided by the global batch's
token count, times the world size because FSDP averages gradients over ranks; the update is
the same global-batch mean at every world size. Construction, resume and exit codes belong
to main.py.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.fsdp import FSDPModule

from fsdp_worker import contract
from fsdp_worker.checkpointing import checkpoint, schedule, state
from fsdp_worker.contract import batch, config, errors
from fsdp_worker.runtime import faults
from fsdp_worker.runtime.distributed import DistInfo
from fsdp_worker.telemetry import flight, metrics, pace
from fsdp_worker.train import data, ledger

log = logging.getLogger(__name__)
LEDGER_AFTER_STEPS = 2


@dataclass(kw_only=True)
class Loop:
    cfg: config.TrainingConfig
    schedule: schedule.Schedule
    st: state.TrainState
    source: data.Source
    plan: batch.Plan
    ckpt: checkpoint.CheckpointManager
    meters: metrics.Metrics
    dist: DistInfo
    stop_requested: Callable[[], bool]
    # The memory tier (kit.Run.save_memory_if_due): (step, the claim saved it, steps run, their
    # seconds) -> seconds blocked
    save_memory: Callable[[int, bool, int, float], float] | None = None
    pace: pace.Pace | None = None  # per-rank compute and wait; rank 0 names a slow rank
    steps_run: int = 0  # this process's totals, for goodput (metrics) and the schedule
    step_seconds: float = 0.0
    blocked_seconds: float = 0.0  # training waited on checkpoint saves
    last_blocking: float = 0.0  # of the latest save call


def _forward_backward(loop: Loop, accum_index: int) -> torch.Tensor:
    cfg, model = loop.cfg, loop.st.model
    step, rank = loop.st.step + 1, loop.dist.rank
    flight.enter(flight.Phase.DATA)
    faults.stall_if("data", rank=rank, step=step)
    inputs, targets = data.micro_batch(
        loop.source, plan=loop.plan, cursor=loop.st.samples, accum_index=accum_index
    )
    inputs, targets = inputs.to(loop.dist.device), targets.to(loop.dist.device)
    logits = model(inputs)  # flight records each block's forward and backward
    tokens = cfg.global_batch_size * cfg.model.seq_len
    loss = (
        F.cross_entropy(
            logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum"
        )
        / tokens
    )
    (loss * loop.dist.world_size).backward()  # type: ignore[no-untyped-call]
    faults.exhaust_memory_if("backward", rank=rank, step=step)
    faults.raise_oom_if("backward", rank=rank, step=step)
    faults.raise_if("backward", rank=rank, step=step)
    return loss.detach()


def _one_step(loop: Loop) -> tuple[float, bool]:
    """One optimizer step over the global batch; returns (global loss, stop agreed)."""
    model, accumulation = loop.st.model, loop.plan.accumulation
    local = torch.zeros((), device=loop.dist.device)
    for a in range(accumulation):
        if isinstance(model, FSDPModule):
            model.set_requires_gradient_sync(a == accumulation - 1)
        local += _forward_backward(loop, a)
    flight.enter(flight.Phase.OPTIMIZER)
    grad_clip = loop.cfg.optimizer.grad_clip
    if grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip, foreach=True)
    waited = time.monotonic()
    loop.ckpt.before_optimizer_step()  # an async save still copying: blocked, not stepping
    loop.blocked_seconds += time.monotonic() - waited
    loop.st.optimizer.step()
    loop.st.scheduler.step()
    loop.st.optimizer.zero_grad(set_to_none=True)
    loop.st.step += 1
    loop.st.samples += loop.cfg.global_batch_size
    # One collective per step carries both the loss and every rank's stop request, so all
    # ranks stop after the same step.
    flag = 1.0 if loop.stop_requested() else 0.0
    _slow_faults(loop)
    packed = torch.stack([local, torch.tensor(flag, device=loop.dist.device)])
    flight.enter(flight.Phase.SYNC)
    faults.stall_if("sync", rank=loop.dist.rank, step=loop.st.step)
    dist.all_reduce(packed)
    return float(packed[0]), bool(packed[1] > 0)


def _slow_faults(loop: Loop) -> None:
    """The tests' slow rank and jittery steps (faults.py), inside the step's local compute."""
    if faults.FAULTS and loop.pace is not None:
        faults.jitter(rank=loop.dist.rank, step=loop.st.step)
        faults.slow_down(rank=loop.dist.rank, compute=loop.pace.compute_so_far())


def _paced(loop: Loop, *, saving: float) -> None:
    """The step is done for the straggler measure (less `saving`, seconds blocked on an async
    save still copying: a slow save is not a slow rank); at a window's end rank 0 reports."""
    if loop.pace is None:
        return
    verdict = loop.pace.end(loop.st.step, excluded=saving)
    if verdict is not None and loop.dist.rank == 0:
        verdict.export(loop.meters)
        log.info("pace %s", json.dumps(verdict.summary()))


def _report(loop: Loop, *, loss: float, seconds: float) -> None:
    m, st = loop.meters, loop.st
    flight.step_done(st.step)
    loop.steps_run += 1
    loop.step_seconds += seconds
    m.steps_run.set(loop.steps_run)
    m.step_seconds_sum.set(loop.step_seconds)
    if loop.steps_run == 1:
        m.reached(contract.Milestone.FIRST_STEP)
    tokens = loop.cfg.global_batch_size * loop.cfg.model.seq_len
    m.step.set(st.step)
    m.last_step_time.set(time.time())
    m.loss.set(loss)
    m.step_seconds.set(seconds)
    m.tokens_per_second.set(tokens / seconds if seconds > 0 else 0.0)
    peak = ledger.peak_memory_bytes(loop.dist.device)
    m.peak_memory.set(peak)
    if loop.dist.rank == 0:
        log.info(
            "step %s", json.dumps({"step": st.step, "loss": loss, "seconds": round(seconds, 4)})
        )
        if st.step == LEDGER_AFTER_STEPS:
            log.info("ledger %s", json.dumps({"measuredPeakBytesRank0": peak}))


def _save(loop: Loop) -> None:
    began = time.monotonic()
    with flight.during(flight.Phase.SAVE):
        faults.exhaust_memory_if("save", rank=loop.dist.rank, step=loop.st.step)
        loop.ckpt.save(loop.st)
    loop.last_blocking = time.monotonic() - began
    loop.blocked_seconds += loop.last_blocking
    loop.meters.ckpt_blocked.set(loop.blocked_seconds)


def run(loop: Loop) -> None:
    """Train from loop.st.step to cfg.steps; raises errors.Preempted after saving on SIGTERM."""
    loop.st.model.train()
    while loop.st.step < loop.cfg.steps:
        started, blocked = time.monotonic(), loop.blocked_seconds
        if loop.pace is not None:
            loop.pace.begin()
        loss, stop = _one_step(loop)
        waited = loop.blocked_seconds - blocked
        _paced(loop, saving=waited)
        _report(loop, loss=loss, seconds=time.monotonic() - started - waited)
        loop.ckpt.poll()
        step = loop.st.step
        claimed = stop or loop.schedule.due(step) or step == loop.cfg.steps
        if claimed:
            _save(loop)
            if not stop and step < loop.cfg.steps:
                loop.schedule.saved(
                    step,
                    blocking=loop.last_blocking,
                    steps_run=loop.steps_run,
                    step_seconds=loop.step_seconds,
                )
        if loop.save_memory is not None and not stop and step < loop.cfg.steps:
            loop.blocked_seconds += loop.save_memory(
                step, claimed, loop.steps_run, loop.step_seconds
            )
            loop.meters.ckpt_blocked.set(loop.blocked_seconds)
        if stop:
            loop.ckpt.wait()
            raise errors.Preempted(f"SIGTERM: saved a complete checkpoint of step {step}")
        if faults.at_step("crash_after", step):
            loop.ckpt.wait()
            raise errors.WorkerError(f"injected crash after step {step}")
        faults.step_sleep()
    loop.ckpt.wait()

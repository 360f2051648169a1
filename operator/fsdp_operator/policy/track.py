"""Keep what happened before anything is decided: the newest checkpoint (and the corrupt ones to
set aside), rank 0's step, the checkpoint pods that chose their own say they loaded, rank 0's
report (restarts in place, its own figures, the rank it names slow: slowness.py) and whether
its progress can be read at all.

Every later policy reads the status this leaves: a step seen now is progress when a failure is
judged in the same pass. Pure: the draft in, the draft changed.
"""

from __future__ import annotations

import dataclasses

from fsdp_operator.policy import accounting, conditions, decision, inplace, slowness
from fsdp_operator.types import observed, status
from fsdp_worker import contract
from fsdp_worker.contract import catalog

QUARANTINE_LIMIT = 64  # paths status.quarantined keeps


def track(d: decision.Draft, obs: observed.Observed) -> None:
    """Record the newest checkpoint and rank 0's step; queue corrupt checkpoints."""
    s, ck, prog = d.status, obs.checkpoint, obs.progress
    _checkpoints(d, obs)
    sealed_and_resumed(d, obs)
    # A rank 0 that has not loaded its checkpoint yet may report step 0: the job is not back
    # there (seen: a Succeeded job showing step 0 after a last attempt that resumed at the end).
    behind = prog is not None and prog.step is not None and prog.step < (s.resumed_from_step or 0)
    if prog is not None and prog.step is not None and prog.step != s.step and not behind:
        s.step, s.last_progress_time = prog.step, obs.now
    if prog is not None:
        inplace.seen(d, obs, prog)
        accounting.worker_report(d, prog, obs.now)
        s.memory_tier = prog.memory or s.memory_tier  # checkpoint.memory's interval and save
        _quarantined_by_pods(d, prog, obs.checkpoint_dir)
    conditions.progress_observed(d, obs)
    slowness.judge(d, obs)
    ours = ck is not None and (ck.attempt == s.attempt or ck.attempt is None)
    if ck is not None and ours and (s.step is None or ck.step > s.step):
        # A checkpoint proves its step even when the last scrape missed it, and that the gang
        # met and trains: progress (seen in CI: a rank 0 on a loaded node whose metrics missed
        # every 1 s scrape for 32 s while it sealed step 25 was judged a gang that never met).
        s.step, s.last_progress_time = ck.step, obs.now


def _checkpoints(d: decision.Draft, obs: observed.Observed) -> None:
    """Corrupt checkpoints go to quarantine once; a new newest one is said in an Event."""
    s, ck = d.status, obs.checkpoint
    for path in obs.corrupt_checkpoints:
        if path not in s.quarantined:
            d.quarantine.append(path)
            s.quarantined = [*s.quarantined, path][-QUARANTINE_LIMIT:]
            d.emit("CheckpointQuarantined", f"{path} failed verification", warning=True)
    if ck is not None and (s.last_checkpoint is None or ck.step != s.last_checkpoint.step):
        s.last_checkpoint = ck
        by = f"attempt {ck.attempt}" if ck.attempt is not None else "DCP .metadata, no marker"
        d.emit("CheckpointComplete", f"step {ck.step} at {ck.path} ({by})")


def _quarantined_by_pods(d: decision.Draft, prog: observed.Progress, directory: str) -> None:
    """Steps rank 0 set aside when it chose its checkpoint (the operator could not read them):
    kept in status.quarantined and said in an Event, as when the operator does it."""
    s = d.status
    for step in prog.quarantined:
        path = f"{directory}/{catalog.step_dir_name(step)}"
        if path not in s.quarantined:
            s.quarantined = [*s.quarantined, path][-QUARANTINE_LIMIT:]
            msg = f"{path} failed verification; attempt {s.attempt}'s rank 0 set it aside"
            d.emit("CheckpointQuarantined", msg, warning=True)


def sealed_and_resumed(d: decision.Draft, obs: observed.Observed) -> None:
    """The newest step sealed, from the checkpoint read or rank 0's report; and, for pods that
    chose their own checkpoint, which one they loaded."""
    s, ck, prog = d.status, obs.checkpoint, obs.progress
    steps = [s.sealed_step, ck.step if ck else None, prog.checkpoint_step if prog else None]
    known = [step for step in steps if step is not None]
    if known:
        s.sealed_step = max(known)
    reported = prog.checkpoint_step if prog else None
    last = s.last_checkpoint
    if (
        not obs.checkpoints_visible
        and reported is not None
        and (last is None or reported > last.step)
    ):
        # What the operator cannot read, rank 0 reports: the newest step its attempt sealed.
        path = f"{obs.checkpoint_dir}/{catalog.step_dir_name(reported)}"
        s.last_checkpoint = status.CheckpointRef(
            step=reported, path=path, attempt=s.attempt, world_size=s.world_size or 0, time=obs.now
        )
        d.emit("CheckpointComplete", f"step {reported} at {path} (attempt {s.attempt}, reported)")
    if prog is None or prog.resumed_from is None or s.resume_path != contract.RESUME_AUTO:
        return
    if s.resumed_from_step is None and prog.resumed_from >= 0:
        s.resumed_from_step = prog.resumed_from
        entry = decision.current_entry(s)
        if entry is not None:
            entry.resumed_from_step = prog.resumed_from
        d.emit("Resumed", f"attempt {s.attempt}: its pods resumed from step {prog.resumed_from}")
        expected = obs.resume_rules.expect_step if obs.resume_rules is not None else None
        _correct_steps_lost(s, prog.resumed_from, expected)
        _resumed_behind(d, prog.resumed_from, expected)


def _resumed_behind(d: decision.Draft, resumed: int, expected: int | None) -> None:
    """Pods that resumed from an older step than the one sealed before the restart (it was
    deleted or damaged since: its lineage's newest proof is older) say so: the steps between
    are trained again, and the user should know why."""
    if expected is None or resumed >= expected:
        return
    d.emit(
        "ResumedBehind",
        f"attempt {d.status.attempt}: step {expected} was sealed before the restart and is no "
        f"longer a checkpoint this attempt may load (deleted, damaged or set aside: see the "
        f"pods' log); it resumed from step {resumed}, the newest its lineage still proves, and "
        f"trains steps {resumed + 1}-{expected} again",
        warning=True,
    )


def _correct_steps_lost(s: status.FSDPJobStatus, resumed: int, expected: int | None) -> None:
    """The ending attempt's steps lost were counted at launch from the newest step the operator
    knew sealed (the pods were sent to find it, `expectStep`). Pods that found a newer one, a
    save rank 0 sealed on SIGTERM just after its last scrape, lost that much less (seen: a
    preempted job shown with 2 steps lost that resumed from the very step it stopped at), and
    pods that had to go back further (the expected step was gone) lost that much more."""
    before = next((e for e in s.history if e.attempt == s.attempt - 1), None)
    if expected is None or before is None or before.steps_lost is None:
        return
    # Behind (the expected step was gone, ResumedBehind): the steps between are lost too.
    before.steps_lost = max(0, before.steps_lost - (resumed - expected))


def completion_report(
    d: decision.Draft, obs: observed.Observed, pods: list[observed.PodView]
) -> None:
    """Rank 0's last word on success (contract.RecordClass.COMPLETED): the step it trained to
    and the newest step it sealed. The last scrape may be steps behind, and a blind operator
    reads no checkpoint: without this a finished job would show where it was a scrape
    interval ago."""
    rank0 = next((p for p in pods if p.rank == 0), None)
    said = rank0.termination if rank0 is not None else observed.Termination()
    if said.kind != contract.RecordClass.COMPLETED:
        return
    s = d.status
    if said.step is not None and (s.step is None or said.step > s.step):
        s.step = said.step
    if said.sealed_step is not None or said.resumed_from is not None:
        # (an attempt of seconds on a busy machine: no scrape saw it load, its last word did)
        final = observed.Progress(
            step=said.step,
            checkpoint_step=said.sealed_step,
            resumed_from=said.resumed_from,
            resumed_from_memory=said.from_memory,
        )
        sealed_and_resumed(d, dataclasses.replace(obs, progress=final))

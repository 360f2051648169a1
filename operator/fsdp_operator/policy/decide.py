"""The reconcile decision: `decide(observed) -> Decision`. The operator's brain, and pure.

One pass: keep what happened (checkpoints, progress), then either finish, fail, suspend, tear
down and restart, launch, or wait. The result carries the whole new status (written in one
patch), the pods to delete and create, the Events, and when to look again. No I/O, no clock
reads, no kopf: tests drive it as a truth table.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Mapping
from typing import Any

from fsdp_operator.policy import detect, explain, goodput, restarts
from fsdp_operator.types import names, observed, queueing, status
from fsdp_worker import contract
from fsdp_worker.contract import catalog, interval
from fsdp_worker.contract.config import AUTO

# A running job is woken by its pods' and nodes' watch events, by rank 0's progress (scraped
# beside the passes, probe.py) and at its own deadlines below; this is only the safety net.
RESYNC_SECONDS = 300.0
# Pods this operator created are expected in its watch this soon; only then are missing ones
# created again (each early retry is GETs, 409s and a GET on a busy API server). 10 s was too
# short for a saturated API server: at 1,000 jobs on 2 cores the watch lagged 20-80 s and about
# 1,080 of a bring-up's 15,500 requests were such repeats, 220 at 60 s (docs/operator.md,
# "Fleet"). client-go waits 5 minutes; the pods' own watch events wake the job when seen.
EXPECT_SECONDS = 60.0
CONFLICT_POLL_SECONDS = 2.0  # a job waiting on someone else's objects looks again this often
QUEUED = "Queued"  # condition: the attempt's pods wait for Kueue's admission (queueing.py)
CONFLICT = "Conflict"  # condition: objects with this job's names/labels that it does not own
RECONCILE_ERROR = "ReconcileError"  # condition: the operator's last pass failed (reconcile.py)
PROGRESS_OBSERVED = "ProgressObserved"  # condition: whether rank 0's metrics answer the operator
GOODPUT_REFRESH_SECONDS = 30.0  # goodput alone changes every pass: write it at most this often
# ends that are not failures
PLANNED = frozenset({status.Cause.RESIZE, status.Cause.SUSPENDED, status.Cause.PREEMPTED})


class EventType(enum.StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclasses.dataclass(frozen=True)
class Event:
    type: EventType
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class PodDelete:
    name: str
    force: bool = False  # grace 0: the node is gone, nobody will confirm the kill
    grace: int | None = None  # seconds; None: the pod's own terminationGracePeriodSeconds

    @property
    def grace_seconds(self) -> int | None:
        return 0 if self.force else self.grace


@dataclasses.dataclass(frozen=True)
class Launch:
    """Create every pod of `attempt` that does not exist yet (idempotent)."""

    attempt: int
    replicas: int
    resume_path: str
    excluded_nodes: tuple[str, ...] = ()
    reliability: str = ""  # FSDP_RELIABILITY (intervalSteps: auto), the same for every pod
    resume_rules: str = ""  # FSDP_RESUME_RULES, with resume_path "auto"
    queue: queueing.Queue | None = None  # the pods form a Kueue pod group
    pod_group: str = ""  # its name


@dataclasses.dataclass(frozen=True)
class Collect:
    """Before the failed attempt's pods are deleted: read each one's log tail and the ranks'
    evidence in it, compare them, keep both (reconcile.py does the I/O)."""

    attempt: int
    pods: tuple[tuple[int, str, str | None], ...]  # (node rank, pod, node) of those still there
    nproc_per_node: int
    world_size: int
    hang: bool  # compare the ranks' stall records (the others only keep logs)
    drop: tuple[int, ...] = ()  # older attempts whose evidence goes (the newest few are kept)
    unreadable: tuple[int, ...] = ()  # pods on a node that is gone or none: no log to ask for


@dataclasses.dataclass(frozen=True)
class Takeover:
    """Spare pod `spare` (number `index`) takes lost pod `lost`'s node rank: reconcile asks
    the gang's coordinator (`coordinator`, host:port) to `replace` it, then relabels the spare
    and force-deletes the lost pod; if the coordinator refuses, the gang is recreated.

    Node rank 0's place (its keeper was the coordinator, its ranks hosted the store): the
    spare's keeper is told to `promote` itself (`coordinator` is the spare's, `master` its
    store's host:port, `generation` the restarts in place counted so far), then every other
    gang pod's keeper (`followers`) to `follow` it. Another node rank's: the spare's keeper
    (at `spare_at`) is first told to `follow` node rank 0's coordinator and store (`master`),
    which may be another spare's since a takeover of node rank 0, not its template's."""

    spare: str
    index: int
    node_rank: int
    lost: str
    coordinator: str
    failure: dict[str, Any]
    master: str = ""
    followers: tuple[str, ...] = ()
    generation: int = 0
    spare_at: str = ""


@dataclasses.dataclass
class Decision:
    delete: list[PodDelete] = dataclasses.field(default_factory=list)
    launch: Launch | None = None
    events: list[Event] = dataclasses.field(default_factory=list)
    quarantine: list[str] = dataclasses.field(default_factory=list)
    delete_job: bool = False
    release: list[str] = dataclasses.field(default_factory=list)  # Kueue Workloads to delete
    requeue_after: float | None = None
    failure: status.Failure | None = None  # detected in this pass (for metrics)
    collect: Collect | None = None  # the failed attempt's evidence, before its pods go
    recovered: status.HistoryEntry | None = None  # an attempt launched after a failure
    resumed: status.HistoryEntry | None = None  # an attempt whose timeline completed in this pass
    in_place: list[status.InPlaceRestart] = dataclasses.field(default_factory=list)  # new ones
    stop: tuple[status.Cause, str] | None = None  # a restart in place spent a budget
    spares: list[int] = dataclasses.field(default_factory=list)  # spare pods to create (numbers)
    takeover: Takeover | None = None  # a spare takes a lost node's place (reconcile.py)
    # Last, and keyword-only: a field named like the status module hides it from the
    # annotations after it.
    status: status.FSDPJobStatus = dataclasses.field(kw_only=True)

    def emit(self, reason: str, message: str, *, warning: bool = False) -> None:
        kind = EventType.WARNING if warning else EventType.NORMAL
        self.events.append(Event(kind, reason, message))

    def again(self, seconds: float) -> None:
        seconds = max(0.0, seconds)
        self.requeue_after = (
            seconds if self.requeue_after is None else min(self.requeue_after, seconds)
        )


def stamp(now: float) -> str:
    return datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _set_condition(
    d: Decision, obs: observed.Observed, *, kind: str, true: bool, reason: str, msg: str
) -> None:
    value = "True" if true else "False"
    conds = [c for c in d.status.conditions if c.type != kind]
    old = next((c for c in d.status.conditions if c.type == kind), None)
    when = old.last_transition_time if old and old.status == value else stamp(obs.now)
    conds.append(
        status.Condition(
            type=kind,
            status=value,
            reason=reason,
            message=msg,
            last_transition_time=when,
            observed_generation=obs.generation,
        )
    )
    d.status.conditions = sorted(conds, key=lambda c: c.type)


def _phase(
    d: Decision, obs: observed.Observed, phase: status.Phase, reason: str, msg: str = ""
) -> None:
    s = d.status
    s.phase, s.reason, s.message = phase, reason, msg
    progressing = phase in (
        status.Phase.PENDING,
        status.Phase.QUEUED,
        status.Phase.RUNNING,
        status.Phase.RESTARTING,
    )
    _set_condition(d, obs, kind="Progressing", true=progressing, reason=reason, msg=msg)
    _set_condition(
        d, obs, kind="Suspended", true=phase is status.Phase.SUSPENDED, reason=reason, msg=msg
    )
    _set_condition(
        d, obs, kind="Complete", true=phase is status.Phase.SUCCEEDED, reason=reason, msg=msg
    )
    _set_condition(d, obs, kind="Failed", true=phase is status.Phase.FAILED, reason=reason, msg=msg)


def _track(d: Decision, obs: observed.Observed) -> None:
    """Record the newest checkpoint and rank 0's step; queue corrupt checkpoints."""
    s, ck = d.status, obs.checkpoint
    for path in obs.corrupt_checkpoints:
        if path not in s.quarantined:
            d.quarantine.append(path)
            s.quarantined = [*s.quarantined, path][-64:]
            d.emit("CheckpointQuarantined", f"{path} failed verification", warning=True)
    if ck is not None and (s.last_checkpoint is None or ck.step != s.last_checkpoint.step):
        s.last_checkpoint = ck
        by = f"attempt {ck.attempt}" if ck.attempt is not None else "DCP .metadata, no marker"
        d.emit("CheckpointComplete", f"step {ck.step} at {ck.path} ({by})")
    prog = obs.progress
    _sealed_and_resumed(d, obs)
    # A rank 0 that has not loaded its checkpoint yet may report step 0: the job is not back
    # there (seen: a Succeeded job showing step 0 after a last attempt that resumed at the end).
    behind = prog is not None and prog.step is not None and prog.step < (s.resumed_from_step or 0)
    if prog is not None and prog.step is not None and prog.step != s.step and not behind:
        s.step, s.last_progress_time = prog.step, obs.now
    if prog is not None:
        _restarts_in_place(d, obs, prog)
        _worker_report(d, prog, obs.now)
        s.memory_tier = prog.memory or s.memory_tier  # checkpoint.memory's interval and save
        _quarantined_by_pods(d, prog, obs.checkpoint_dir)
    _progress_observed(d, obs)
    ours = ck is not None and (ck.attempt == s.attempt or ck.attempt is None)
    if ck is not None and ours and (s.step is None or ck.step > s.step):
        s.step = ck.step  # a checkpoint proves its step even when the last scrape missed it


def _progress_observed(d: Decision, obs: observed.Observed) -> None:
    """Say whether the operator reads rank 0's progress. When it cannot (a NetworkPolicy that
    blocks its scrape is the common cause), step, goodput and time to resume stop moving, and
    a hang is judged on rank 0's readiness probe alone (detect._hung): never on the silence."""
    scrape = obs.scrape
    if scrape is None or 0 < scrape.failures < observed.BLIND_AFTER:
        return  # no running rank 0 to read, or one miss that may be a blip
    if not scrape.blind and not scrape.answered:
        return  # rank 0 reached but serving nothing yet: its own state (detect._hung)
    old = next((c for c in d.status.conditions if c.type == PROGRESS_OBSERVED), None)
    if not scrape.blind:
        if old is None or old.status != "True":
            msg = f"the operator's scrapes reach rank 0's metrics port at {scrape.address}"
            _set_condition(d, obs, kind=PROGRESS_OBSERVED, true=True, reason="Scraped", msg=msg)
        return
    msg = (
        f"the operator's scrapes do not reach rank 0's metrics port at {scrape.address} "
        f"({scrape.failures} in a row; last: {scrape.error}). Step and goodput are not "
        "updated; a hang is judged on rank 0's readiness probe (is a NetworkPolicy blocking "
        f'the operator? docs/install.md, "Network policies")'
    )
    if old is None or old.status != "False":
        d.emit("ProgressUnobserved", msg, warning=True)
    if old is None or old.status != "False" or old.message.split(" (")[0] != msg.split(" (")[0]:
        _set_condition(d, obs, kind=PROGRESS_OBSERVED, true=False, reason="ScrapeFailing", msg=msg)


def _completion_report(d: Decision, obs: observed.Observed, pods: list[observed.PodView]) -> None:
    """Rank 0's last word on success (contract.COMPLETED): the step it trained to and the
    newest step it sealed. The last scrape may be steps behind, and a blind operator reads no
    checkpoint: without this a finished job would show where it was a scrape interval ago."""
    rank0 = next((p for p in pods if p.rank == 0), None)
    doc = rank0.worker_cause() if rank0 is not None else {}
    if doc.get("class") != contract.COMPLETED:
        return
    step = doc.get("step") if isinstance(doc.get("step"), int) else None
    sealed = contract.completion_sealed_step(doc.get("message"))
    s = d.status
    if step is not None and (s.step is None or step > s.step):
        s.step = step
    if sealed is not None:
        final = observed.Progress(step=step, checkpoint_step=sealed)
        _sealed_and_resumed(d, dataclasses.replace(obs, progress=final))


def _final_sums(d: Decision, obs: observed.Observed) -> None:
    """Rank 0's totals from its termination message or live record (contract.SUMS) once its
    pod has ended: the steps it ran after the operator's last scrape count (without them an
    attempt's last seconds of training, up to a scrape interval, were goodput's `Other`).

    Also for an attempt already closed: when this operator tears a gang down (another rank
    failed, a node was lost, a resize, a preemption), rank 0's SIGTERM message arrives after
    its attempt's entry ended. Such an entry takes the steps and their seconds but keeps its
    scraped save time: a save after the stop is the recovery's time, which is counted there."""
    ended = (observed.PodPhase.SUCCEEDED, observed.PodPhase.FAILED)
    entries = {entry.attempt: entry for entry in d.status.history}
    for pod in obs.pods:
        entry = entries.get(pod.attempt)
        if pod.rank != 0 or pod.phase not in ended or entry is None:
            continue
        _final_milestones(entry, pod.worker_cause())
        found = contract.parse_sums(pod.worker_cause())
        if found is None or (entry.steps_run is not None and found[0] < entry.steps_run):
            continue
        closed = entry.ended is not None
        entry.steps_run = found[0]
        entry.train_seconds = round(found[1], 3)
        if not closed:
            entry.blocked_seconds = round(found[2], 3)


def _final_milestones(entry: status.HistoryEntry, doc: dict[str, object]) -> None:
    """The attempt's resume milestones that no scrape saw, from rank 0's final message (an
    attempt of seconds on a busy machine: its time to resume had no first step). Its process
    is the attempt's last generation, so only an attempt without restarts in place takes them."""
    tl = entry.timeline
    if tl is None or entry.restarts_in_place:
        return
    reached = contract.parse_milestones(doc)
    for name in ("rendezvous", "loaded", "first_step"):
        at = reached.get(name)
        if at is not None and getattr(tl, name) is None:
            setattr(tl, name, at)


def _quarantined_by_pods(d: Decision, prog: observed.Progress, directory: str) -> None:
    """Steps rank 0 set aside when it chose its checkpoint (the operator could not read them):
    kept in status.quarantined and said in an Event, as when the operator does it."""
    s = d.status
    for step in prog.quarantined:
        path = f"{directory}/{catalog.step_dir_name(step)}"
        if path not in s.quarantined:
            s.quarantined = [*s.quarantined, path][-64:]
            msg = f"{path} failed verification; attempt {s.attempt}'s rank 0 set it aside"
            d.emit("CheckpointQuarantined", msg, warning=True)


def _sealed_and_resumed(d: Decision, obs: observed.Observed) -> None:
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
        entry = _current(s)
        if entry is not None:
            entry.resumed_from_step = prog.resumed_from
        d.emit("Resumed", f"attempt {s.attempt}: its pods resumed from step {prog.resumed_from}")
        _correct_steps_lost(s, prog.resumed_from)
        _resumed_behind(d, prog.resumed_from)


def _resumed_behind(d: Decision, resumed: int) -> None:
    """Pods that resumed from an older step than the one sealed before the restart (it was
    deleted or damaged since: its lineage's newest proof is older) say so: the steps between
    are trained again, and the user should know why."""
    s = d.status
    rules = contract.ResumeRules.parse(s.resume_rules) if s.resume_rules else None
    expected = rules.expect_step if rules is not None else None
    if expected is None or resumed >= expected:
        return
    d.emit(
        "ResumedBehind",
        f"attempt {s.attempt}: step {expected} was sealed before the restart and is no longer "
        f"a checkpoint this attempt may load (deleted, damaged or set aside: see the pods' "
        f"log); it resumed from step {resumed}, the newest its lineage still proves, and "
        f"trains steps {resumed + 1}-{expected} again",
        warning=True,
    )


def _correct_steps_lost(s: status.FSDPJobStatus, resumed: int) -> None:
    """The ending attempt's steps lost were counted at launch from the newest step the operator
    knew sealed (the pods were sent to find it, `expectStep`). Pods that found a newer one, a
    save rank 0 sealed on SIGTERM just after its last scrape, lost that much less (seen: a
    preempted job shown with 2 steps lost that resumed from the very step it stopped at), and
    pods that had to go back further (the expected step was gone) lost that much more."""
    rules = contract.ResumeRules.parse(s.resume_rules) if s.resume_rules else None
    expected = rules.expect_step if rules is not None else None
    before = next((e for e in s.history if e.attempt == s.attempt - 1), None)
    if expected is None or before is None or before.steps_lost is None:
        return
    # Behind (the expected step was gone, ResumedBehind): the steps between are lost too.
    before.steps_lost = max(0, before.steps_lost - (resumed - expected))


def _current(s: status.FSDPJobStatus) -> status.HistoryEntry | None:
    entry = s.history[-1] if s.history else None
    return entry if entry is not None and entry.attempt == s.attempt else None


def _restarts_in_place(d: Decision, obs: observed.Observed, prog: observed.Progress) -> None:
    """Rank failures the attempt's pods restarted from in place (their keepers' records, as
    rank 0 of a later generation serves them): each is charged, counted and kept like a restart
    of the gang; one that spends a budget stops the job (`d.stop`)."""
    s = d.status
    entry = _current(s)
    if entry is None or entry.ended is not None or not prog.restarts_in_place:
        return
    known = {r.generation for r in entry.restarts_in_place}
    for record in prog.restarts_in_place:
        generation = int(record["generation"])
        if generation in known or generation >= prog.generation:
            continue
        failure = detect.in_place_failure(obs, record)
        d.failure, s.last_failure = failure, failure
        counters = restarts.charge(s.restarts, failure.cause)
        app = status.budget_of(failure.cause) is status.Budget.APPLICATION
        before = entry.restarts_in_place[-1] if entry.restarts_in_place else None
        since = before.resumed_from_step if before is not None else s.resumed_from_step
        sealed = _newest_seal(s.sealed_step, record)
        stalled = app and (sealed is None or (since is not None and sealed <= since))
        counters.without_progress = counters.without_progress + 1 if stalled else 0
        s.restarts = counters
        rel = s.reliability
        s.reliability = rel.model_copy(update={"failures": rel.failures + 1})
        steps, train, blocked = _in_place_sums(entry)  # the failed generation's: the rest
        entry.restarts_in_place = [
            *entry.restarts_in_place,
            status.InPlaceRestart(
                generation=generation,
                failure=brief(failure),
                detected=_number(record.get("detected")),
                steps_run=max(0, (entry.steps_run or 0) - steps),
                train_seconds=max(0.0, (entry.train_seconds or 0.0) - train),
                blocked_seconds=max(0.0, (entry.blocked_seconds or 0.0) - blocked),
            ),
        ][-status.IN_PLACE_LIMIT :]
        d.in_place.append(entry.restarts_in_place[-1])
        where = f"rank {failure.rank} pod {failure.pod}" if failure.pod else "a rank"
        d.emit(
            "RestartedInPlace",
            f"{failure.cause.value}: {where} {failure.message}; generation {generation + 1} of "
            f"attempt {s.attempt} resumed in the same pods",
            warning=True,
        )
        stop = restarts.stop_reason(spec=obs.spec, restarts=counters, cause=failure.cause)
        if stop is not None and d.stop is None:
            d.stop = stop


def _in_place_sums(entry: status.HistoryEntry) -> tuple[int, float, float]:
    """Steps, train and blocked seconds of the generations before the current one."""
    done = entry.restarts_in_place
    return (
        sum(r.steps_run for r in done),
        sum(r.train_seconds for r in done),
        sum(r.blocked_seconds for r in done),
    )


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _newest_seal(claim: int | None, record: Mapping[str, Any]) -> int | None:
    """The newest step sealed before a failure in place: the claim's, or the memory tier's
    that the failing rank reported (`memoryStep`); a restart from memory makes progress too."""
    memory = record.get(contract.MEMORY_STEP_KEY)
    if not isinstance(memory, int) or isinstance(memory, bool) or memory < 0:
        return claim
    return memory if claim is None else max(claim, memory)


def _in_place_report(entry: status.HistoryEntry, prog: observed.Progress) -> None:
    """A later generation's first step, the step it loaded, and the steps it trains again."""
    last = entry.restarts_in_place[-1] if entry.restarts_in_place else None
    if last is None or last.generation != prog.generation - 1:
        return
    if last.resumed_from_step is None and prog.resumed_from is not None:
        last.resumed_from_step = prog.resumed_from
        last.from_memory = prog.resumed_from_memory
        failed_at = last.failure.step
        if failed_at is not None:
            last.steps_lost = max(0, failed_at - max(0, prog.resumed_from))
    since = last.failure.time or 0.0
    for phase in ("rendezvous", "loaded"):  # the next generation's, for the phases
        at = prog.milestones.get(phase)
        if getattr(last, phase) is None and at is not None and at >= since:
            setattr(last, phase, at)
    first = prog.milestones.get("first_step")
    if last.resumed is None and first is not None and first >= since:
        last.resumed = first


def _worker_report(d: Decision, prog: observed.Progress, now: float) -> None:
    """Rank 0's own figures: its milestones, step and save seconds, and checkpoint interval.
    After restarts in place its counters start again at 0: the earlier generations' sums are
    added."""
    s = d.status
    entry = _current(s)
    if entry is not None and entry.ended is None:
        steps, train, blocked = _in_place_sums(entry) if prog.generation else (0, 0.0, 0.0)
        if prog.steps_run is not None:
            entry.steps_run = steps + prog.steps_run
        if prog.train_seconds is not None:
            entry.train_seconds = round(train + prog.train_seconds, 3)
        if prog.blocked_seconds is not None:
            entry.blocked_seconds = round(blocked + prog.blocked_seconds, 3)
        if prog.generation:
            _in_place_report(entry, prog)
        tl = entry.timeline
        if tl is not None:  # fills only what generation 0 was not seen to report
            for name in ("rendezvous", "loaded", "first_step"):
                at = prog.milestones.get(name)
                if at is not None and getattr(tl, name) is None:
                    setattr(tl, name, at)
            if tl.first_step is None and (prog.steps_run or 0) > 0:
                tl.first_step = now  # a worker that reports no milestones: seen by this pass
    new = prog.interval
    if new is None or new == s.checkpoint_interval:
        return
    old = s.checkpoint_interval
    s.checkpoint_interval = new
    if new.auto and (old is None or old.steps != new.steps):
        d.emit("CheckpointInterval", _interval_message(new))


def _interval_message(c: status.CheckpointInterval) -> str:
    def secs(v: float | None) -> str:
        return "unmeasured" if v is None else f"{v:.3g}s"

    mtbf = "-" if c.mtbf_seconds is None else f"{c.mtbf_seconds / 3600:.2f}h"
    return (
        f"checkpoint every {c.steps} steps (auto, Young/Daly): blocking save {secs(c.save_seconds)}"
        f", step {secs(c.step_seconds)}, MTBF {mtbf} from {c.failures or 0} failure(s) and the "
        "prior"
    )


def _milestones(d: Decision, obs: observed.Observed) -> None:
    """Teardown and start milestones the operator sees on pods: gang gone, bound, running."""
    s = d.status
    older = [p for p in obs.pods if p.attempt < s.attempt]
    pending = s.next_timeline
    if pending is not None and pending.gang_gone is None and not obs.pods:
        pending.gang_gone = obs.now  # before the next launch: every pod is an old one
    entry = _current(s)
    tl = entry.timeline if entry is not None else None
    if tl is None or entry is None or entry.ended is not None:
        return
    if tl.failed is not None and tl.gang_gone is None and not older:
        tl.gang_gone = obs.now
    pods = obs.attempt_pods(s.attempt)
    complete = s.pods_created and len(pods) >= (s.replicas or 0) > 0
    if complete and tl.scheduled is None and all(p.node for p in pods):
        tl.scheduled = obs.now
    if complete and tl.running is None and all(p.phase is observed.PodPhase.RUNNING for p in pods):
        tl.running = obs.now


def _delete_all(
    d: Decision, obs: observed.Observed, *, keep_finished: bool = False, grace: int | None = None
) -> None:
    """Delete the gang; force pods whose node is gone. Exited pods of a failed job stay (logs)."""
    for pod in [*obs.pods, *obs.spares]:
        if pod.deleting and not _node_gone(obs, pod):
            continue
        if keep_finished and pod.phase in (observed.PodPhase.SUCCEEDED, observed.PodPhase.FAILED):
            continue
        d.delete.append(PodDelete(pod.name, force=_node_gone(obs, pod), grace=grace))


def _node_gone(obs: observed.Observed, pod: observed.PodView) -> bool:
    node = obs.node(pod.node) if pod.node else None
    return bool(pod.node) and (node is None or not node.usable)


def _close_history(
    d: Decision, obs: observed.Observed, cause: status.Cause, detect_s: float | None
) -> None:
    """End the current attempt's entry; count its uptime (and a failure unless planned); start
    the timeline of the attempt that will follow it."""
    s = d.status
    last = _current(s)
    if last is None or last.ended is not None:
        return
    last.ended, last.cause, last.detect_seconds = obs.now, cause, detect_s
    if d.failure is not None:  # detected in this pass: the failure that ended it
        last.failure = brief(d.failure)
    failed = obs.now - (detect_s or 0.0)
    rel = s.reliability
    s.reliability = status.Reliability(
        failures=rel.failures + (cause not in PLANNED),
        gang_failures=rel.gang_failures + (cause not in PLANNED),
        uptime_seconds=round(rel.uptime_seconds + max(0.0, failed - (last.started or failed)), 3),
    )
    s.next_timeline = status.Timeline(cause=cause, failed=failed, detected=obs.now)


def brief(failure: status.Failure) -> status.Failure:
    """The failure as a history entry keeps it: its words shortened, so 20 entries stay small."""
    return failure.model_copy(
        update={"message": failure.message[:300], "evidence": failure.evidence[:600]}
    )


def _finish(d: Decision, obs: observed.Observed, cause: status.Cause | None, msg: str) -> Decision:
    s = d.status
    s.finished = obs.now
    if cause is None:
        _phase(d, obs, status.Phase.SUCCEEDED, "Succeeded", msg)
        d.emit("Succeeded", msg)
        _delete_spares(d, obs)
    else:
        _close_history(d, obs, cause, None)
        _phase(d, obs, status.Phase.FAILED, cause.value, msg)
        d.emit(cause.value, msg, warning=True)
        _delete_all(d, obs, keep_finished=True)
        if s.queue is not None:  # its exited pods stay (logs); its quota goes
            d.release.append(s.queue.pod_group)
    ttl = obs.spec.ttl_seconds_after_finished
    if ttl is not None:
        d.again(ttl)
    return d


def _delete_spares(d: Decision, obs: observed.Observed) -> None:
    """A finished job's spares: they would wait for a node's place forever."""
    d.delete += [PodDelete(p.name, force=_node_gone(obs, p)) for p in obs.spares if not p.deleting]


def _finished(d: Decision, obs: observed.Observed) -> Decision:
    _delete_spares(d, obs)  # stragglers of a pass that stopped half-way
    ttl = obs.spec.ttl_seconds_after_finished
    done = d.status.finished or obs.now
    if ttl is not None and obs.now >= done + ttl:
        d.delete_job = True
        d.emit("Deleted", f"ttlSecondsAfterFinished={ttl} passed")
    elif ttl is not None:
        d.again(done + ttl - obs.now)
    return d


def _on_failure(
    d: Decision, obs: observed.Observed, failure: status.Failure, tun: restarts.Tunables
) -> Decision:
    s = d.status
    d.failure, s.last_failure = failure, failure
    if failure.step is not None and (s.step is None or failure.step > s.step):
        s.step = failure.step  # the rank's own report beats the last scrape
    detect_s = max(0.0, obs.now - failure.time)
    where = f" rank {failure.rank} pod {failure.pod} node {failure.node}" if failure.pod else ""
    d.emit("FailureDetected", f"{failure.cause.value}:{where} {failure.message}", warning=True)
    d.collect = _collect(obs, failure)
    for entry in s.history:  # their ConfigMaps go in this pass (reconcile.py)
        if d.collect and entry.attempt in d.collect.drop and entry.failure is not None:
            entry.failure.evidence_ref = None
    if _same_oom_again(obs.status.last_failure, failure):
        why = f"OOMKilled twice in {explain.phase_kind(failure.phase)}"
        return _finish(d, obs, status.Cause.OOM, f"{why}: {failure.diagnosis or failure.message}")
    counters = restarts.charge(s.restarts, failure.cause)
    app = status.budget_of(failure.cause) is status.Budget.APPLICATION
    # Blind to the storage, the operator knows new checkpoints from rank 0's reports.
    newest = obs.checkpoint if obs.checkpoints_visible else s.last_checkpoint
    stalled = app and not restarts.made_progress(s, newest)
    counters.without_progress = counters.without_progress + 1 if stalled else 0
    stop = restarts.stop_reason(spec=obs.spec, restarts=counters, cause=failure.cause)
    if stop is not None:
        cause, why = stop
        if cause is failure.cause and failure.message:  # not retryable: say what the rank said
            why = f"{why}: {failure.message}"
        return _finish(d, obs, cause, why)
    s.restarts = counters
    _close_history(d, obs, failure.cause, detect_s)
    blame = failure.node if failure.cause is status.Cause.NODE_LOST else None
    s.excluded_nodes = restarts.active_exclusions(s, now=obs.now, blame=blame, tun=tun)
    if blame:
        d.emit("NodeExcluded", f"node {blame} excluded for {tun.node_exclusion_seconds:.0f}s")
    delay = restarts.backoff_seconds(obs.spec, counters)
    # Under Kueue the next attempt's pods may replace these in the same pod group: Kueue
    # would count pods still running as the group's and delete the newest as excess.
    s.next_attempt_at, s.failure_observed = obs.now + delay, obs.now
    s.drain = s.queue is not None
    _phase(d, obs, status.Phase.RESTARTING, failure.cause.value, failure.message)
    d.emit("Restarting", f"tearing down attempt {s.attempt}; next attempt in {delay:.0f}s")
    # A gang with a failed rank cannot finish a collective save: a short grace frees its
    # accelerators for the next attempt instead of holding them for the full save window.
    _delete_all(d, obs, grace=tun.failure_grace_seconds)
    return _launch(d, obs, tun, cause=failure.cause)


def _same_oom_again(before: status.Failure | None, now: status.Failure) -> bool:
    """An OOM in the phase of the previous failure's OOM: a restart would only repeat it."""
    oom = status.Cause.OOM
    return (
        before is not None
        and before.cause is oom
        and now.cause is oom
        and now.phase is not None
        and explain.phase_kind(before.phase) == explain.phase_kind(now.phase)
    )


def _collect(obs: observed.Observed, failure: status.Failure) -> Collect | None:
    """What to read from the failed attempt's pods before they are deleted."""
    s = obs.status
    pods = tuple(
        sorted((p.rank, p.name, p.node) for p in obs.attempt_pods(s.attempt) if p.rank is not None)
    )
    if not pods:
        return None
    # A lost node's kubelet would keep the read waiting for its timeout, delaying the restart.
    unreadable = tuple(
        sorted(p.rank for p in obs.attempt_pods(s.attempt)
               if p.rank is not None and (not p.node or _node_gone(obs, p)))
    )  # fmt: skip
    kept = [h.attempt for h in s.history if h.failure is not None and h.failure.evidence_ref]
    drop = tuple(sorted({*kept, s.attempt})[: -explain.EVIDENCE_ATTEMPTS])
    return Collect(
        attempt=s.attempt,
        pods=pods,
        nproc_per_node=obs.spec.nproc_per_node,
        world_size=s.world_size or len(pods) * obs.spec.nproc_per_node,
        hang=failure.cause is status.Cause.HANG,
        drop=drop,
        unreadable=unreadable,
    )


def _planned_stop(d: Decision, obs: observed.Observed, cause: status.Cause, msg: str) -> Decision:
    """Tear down gracefully: workers save a checkpoint on SIGTERM before they exit."""
    s = d.status
    _close_history(d, obs, cause, None)
    s.failure_observed, s.drain, s.next_attempt_at = obs.now, True, obs.now
    phase = status.Phase.SUSPENDED if cause is status.Cause.SUSPENDED else status.Phase.RESTARTING
    _phase(d, obs, phase, cause.value, msg)
    d.emit(cause.value, msg)
    _delete_all(d, obs)
    d.again(1.0)
    return d


def _conflicts(d: Decision, obs: observed.Observed) -> None:
    """Say in a condition (and once in an Event) what the job will not adopt, or that it is over.

    The objects are never touched: they are not the job's to delete.
    """
    old = next((c for c in d.status.conditions if c.type == CONFLICT), None)
    if not obs.conflicts:
        if old is not None and old.status == "True":
            _set_condition(d, obs, kind=CONFLICT, true=False, reason="Resolved", msg="")
        return
    first = obs.conflicts[0]
    more = f" (and {len(obs.conflicts) - 1} more)" if len(obs.conflicts) > 1 else ""
    msg = f"{first.describe()}{more}; the job does not adopt it and waits until it is gone"
    if first.kind is observed.ConflictKind.CHECKPOINTS:
        msg = (
            f"{first.describe()}; set spec.checkpoint.resumeFromPreviousJobs: true to resume from"
            " it, or remove those checkpoints or use another checkpoint.root"
        )
    if old is None or old.status != "True" or old.message != msg:
        d.emit(first.kind.value, msg, warning=True)
    _set_condition(d, obs, kind=CONFLICT, true=True, reason=first.kind.value, msg=msg)


def _blocked(d: Decision, obs: observed.Observed) -> bool:
    """No pods are created while anything conflicts; look again soon."""
    if obs.conflicts:
        d.again(CONFLICT_POLL_SECONDS)
    return bool(obs.conflicts)


GROW_RETRY_SECONDS = 300.0
"""After a resize whose attempt came out no larger than the one it stopped (the capacity
estimate counts requests, selectors and taints, not affinity terms or other schedulers), how
long this attempt trains before growing is tried again: an unbudgeted Resize must not loop.
Seen in e2e: two jobs kept off a node by their affinity grew and relaunched at the same size
every 2-3 s, 180 attempts in 8 minutes."""


def _grow_came_to_nothing(s: status.FSDPJobStatus, now: float) -> bool:
    if len(s.history) < 2 or s.attempt_started is None or s.world_size is None:
        return False
    before = s.history[-2]
    return (
        before.cause is status.Cause.RESIZE
        and s.world_size <= before.world_size
        and now - s.attempt_started < GROW_RETRY_SECONDS
    )


def _launch(
    d: Decision, obs: observed.Observed, tun: restarts.Tunables, *, cause: status.Cause | None
) -> Decision:
    """Start the next attempt when backoff and draining allow; otherwise say when to look."""
    s = d.status
    if _blocked(d, obs):
        return d
    if s.next_attempt_at is not None and obs.now < s.next_attempt_at:
        d.again(s.next_attempt_at - obs.now)
        return d
    exited = (observed.PodPhase.SUCCEEDED, observed.PodPhase.FAILED)
    draining = [
        p
        for p in obs.pods
        if p.attempt <= s.attempt and not _node_gone(obs, p) and p.phase not in exited
    ]
    if (
        s.drain
        and draining
        and obs.now - (s.failure_observed or obs.now) < tun.drain_timeout_seconds
    ):
        d.again(1.0)  # old pods are saving their checkpoint; resume from it, not before it
        return d
    excluded = [e.node for e in s.excluded_nodes if e.until > obs.now]
    replicas = restarts.world_size(obs=obs, excluded=excluded, cause=cause, current=s.replicas)
    ck = obs.checkpoint
    if s.history and s.history[-1].attempt == s.attempt and s.step is not None:
        # known only now: the step reached versus the step the next attempt resumes from
        # (pods that choose their own are sent to find the newest step sealed)
        s.history[-1].steps_lost = max(0, s.step - (ck.step if ck else (s.sealed_step or 0)))
    rules = _resume_rules(obs, s) if ck is None else None  # the ending attempt's lineage
    before = s.replicas
    ending = _current(s)  # a planned stop (a preemption) has a cause but no failure
    ended_by = ending.cause if ending is not None and ending.cause is not None else cause
    s.attempt += 1
    s.replicas, s.world_size = replicas, replicas * obs.spec.nproc_per_node
    s.pods_created, s.drain, s.next_attempt_at = False, False, None
    if s.spares is not None or obs.spec.spares:
        done = s.spares.takeovers if s.spares is not None else 0
        s.spares = status.Spares(wanted=obs.spec.spares, takeovers=done)
    s.attempt_started, s.last_progress_time = obs.now, None
    _pod_group(d, obs, cause=ended_by, replicas=replicas, before=before)
    s.resumed_from_step = ck.step if ck else None
    s.resume_path = ck.path if ck else (contract.RESUME_AUTO if rules else None)
    s.resume_rules = rules.to_json() if rules else None
    s.step = ck.step if ck else None
    timeline = (s.next_timeline or status.Timeline()).model_copy(update={"launched": obs.now})
    if timeline.failed is not None and timeline.gang_gone is None and not obs.pods:
        timeline.gang_gone = obs.now
    s.next_timeline = None
    entry = status.HistoryEntry(
        attempt=s.attempt,
        started=obs.now,
        resumed_from_step=s.resumed_from_step,
        world_size=s.world_size,
        timeline=timeline,
    )
    history = [*s.history, entry]
    dropped = history[: -status.HISTORY_LIMIT]
    s.goodput = goodput.fold(s.goodput, dropped, now=obs.now)
    s.history = history[-status.HISTORY_LIMIT :]
    d.launch = Launch(
        s.attempt,
        replicas,
        s.resume_path or "",
        tuple(excluded),
        reliability=_reliability(obs, s),
        resume_rules=s.resume_rules or "",
        queue=obs.queue,
        pod_group=s.queue.pod_group if s.queue else "",
    )
    origin = f"checkpoint step {ck.step}" if ck else "scratch"
    if rules is not None:
        expect = f", expecting step {rules.expect_step}" if rules.expect_step is not None else ""
        origin = f"the checkpoint its pods choose (the operator cannot read them{expect})"
    d.emit("AttemptStarted", f"attempt {s.attempt}: {replicas} pods from {origin}")
    d.again(1.0)
    return d


def _resume_rules(obs: observed.Observed, s: status.FSDPJobStatus) -> contract.ResumeRules | None:
    """With no checkpoint to name, whether the next attempt's pods choose one themselves
    (``auto``), under which lineage, and which step they must find; None: start fresh.

    They choose when this operator cannot read the job's checkpoints (their claim is mounted in
    the pods, not here), and when a step was sealed that it cannot find: then the pods either
    find it or stop saying why, and the job never trains again from step 0 unasked. A first
    attempt the operator cannot read for chooses too (rules of attempt 0): another job's
    checkpoints in its directory then stop it naming the cause, or are resumed from with
    ``resumeFromPreviousJobs``, as when the operator reads them. ``s`` is the status of the
    attempt that ended (attempt 0: none yet).
    """
    if s.attempt == 0:
        visible = obs.checkpoints_visible
        return None if visible else contract.ResumeRules(attempt=0, resumed_from_step=None)
    if obs.checkpoints_visible and s.sealed_step is None:
        return None
    resumed = s.resumed_from_step
    if resumed is None and s.resume_rules:
        # That attempt chose for itself and did not say from where before it ended: at most
        # the step it was sent to find.
        resumed = contract.ResumeRules.parse(s.resume_rules).expect_step
    return contract.ResumeRules(
        attempt=s.attempt, resumed_from_step=resumed, expect_step=s.sealed_step
    )


def _reliability(obs: observed.Observed, s: status.FSDPJobStatus) -> str:
    """FSDP_RELIABILITY for `intervalSteps: auto` ("" otherwise): the failure record and the
    last measured costs, so the new attempt's first interval is already the informed one."""
    if obs.spec.checkpoint.interval_steps != AUTO:
        return ""
    ci = s.checkpoint_interval
    return interval.Reliability(
        failures=s.reliability.failures,
        gang_failures=s.reliability.gang_failures,
        uptime_seconds=s.reliability.uptime_seconds,
        save_seconds=ci.save_seconds if ci else None,
        step_seconds=ci.step_seconds if ci else None,
    ).to_json()


def _complete_creation(d: Decision, obs: observed.Observed, pods: list[observed.PodView]) -> None:
    """Every pod of the attempt seen once; or create the missing ones (the operator may have
    stopped between the status write and the creates), unless someone else holds a name, or
    this operator just created them and its watch has not shown them yet."""
    s = d.status
    if len(pods) >= (s.replicas or 0):
        s.pods_created = True
    elif obs.created_at is not None and obs.now - obs.created_at < EXPECT_SECONDS:
        d.again(EXPECT_SECONDS - (obs.now - obs.created_at))  # their watch events wake it sooner
    elif not _blocked(d, obs):
        d.launch = current_launch(obs, s)


def current_launch(obs: observed.Observed, s: status.FSDPJobStatus) -> Launch:
    """The running attempt's launch again: for pods made after its first pass (the missing
    ones, and spares)."""
    live = tuple(e.node for e in s.excluded_nodes if e.until > obs.now)
    return Launch(
        s.attempt,
        s.replicas or 0,
        s.resume_path or "",
        live,
        reliability=_reliability(obs, s),
        resume_rules=s.resume_rules or "",
        queue=obs.queue if s.queue is not None else None,
        pod_group=s.queue.pod_group if s.queue is not None else "",
    )


def _pod_group(
    d: Decision,
    obs: observed.Observed,
    *,
    cause: status.Cause | None,
    replicas: int,
    before: int | None,
) -> None:
    """The new attempt's Kueue pod group: the previous one's when its pods can simply be
    replaced (queueing.KEEPS_GROUP, same size, same queue), else a new one, and the previous
    group's Workload is released."""
    s, q, old = d.status, obs.queue, d.status.queue
    keep = (
        q is not None
        and old is not None
        and old.name == q.name
        and before == replicas
        and cause is not None
        and cause.value in queueing.KEEPS_GROUP
    )
    if old is not None and not keep:
        d.release.append(old.pod_group)
    if q is None:
        s.queue = None
    elif keep and old is not None:
        s.queue = status.QueueStatus(name=q.name, pod_group=old.pod_group)
    else:
        s.queue = status.QueueStatus(name=q.name, pod_group=q.group(s.attempt))


def _queued(d: Decision, obs: observed.Observed, pods: list[observed.PodView]) -> None:
    """Under Kueue: while any pod of the attempt is gated the job is Queued, with Kueue's
    reason; the moment every pod is seen ungated it was admitted (the pending timeout counts
    from then)."""
    s = d.status
    q = s.queue
    if q is None or not pods or q.admitted is not None:
        return
    said = obs.admission
    if any(p.gated for p in pods):
        why = said.message if said is not None and said.message else "waiting for Kueue"
        msg = f"LocalQueue {q.name}, pod group {q.pod_group}: {why}"
        reason = said.reason if said is not None and said.reason else "WaitingForAdmission"
        if s.phase is not status.Phase.QUEUED:
            d.emit("Queued", msg)
        _phase(d, obs, status.Phase.QUEUED, reason, msg)
        _set_condition(d, obs, kind=QUEUED, true=True, reason=reason, msg=msg)
        return
    if len(pods) < (s.replicas or 0):
        return
    waited = round(obs.now - (s.attempt_started or obs.now), 3)
    q.admitted, q.queued_seconds = obs.now, waited
    entry = _current(s)
    if entry is not None and entry.timeline is not None:  # goodput leaves the wait out
        entry.timeline.admitted = obs.now
    by = f" by ClusterQueue {said.cluster_queue}" if said is not None and said.cluster_queue else ""
    msg = f"admitted{by} after {waited:.1f}s in LocalQueue {q.name}"
    _phase(d, obs, status.Phase.PENDING, "Admitted", msg)
    _set_condition(d, obs, kind=QUEUED, true=False, reason="Admitted", msg=msg)
    d.emit("Admitted", msg)


EXITED = (observed.PodPhase.SUCCEEDED, observed.PodPhase.FAILED)
SPARE_EXPECT_SECONDS = 5.0
"""Spares made this long ago and not seen yet are not made again (a surplus one is deleted)."""


def _takeover_target(
    obs: observed.Observed, failure: status.Failure, pods: list[observed.PodView]
) -> tuple[observed.PodView, contract.FailureClass, str] | None:
    """The gang pod whose node rank a spare can take for this failure, the class the gang
    records it under, and why: a lost node's pod; for a hang, the one pod whose keeper the
    coordinator reports silent (observed.GangHealth: the pod frozen, its ranks unable to restart
    in place), not when several or none are (a hang of the ranks themselves restarts in place);
    node rank 0's running pod when the coordinator, its keeper, does not answer at all."""
    if failure.cause is status.Cause.NODE_LOST:
        lost = next((p for p in pods if p.name == failure.pod), None)
        why = f"NodeLost: node {failure.node} ({failure.message})"
        return (lost, contract.FailureClass.NODE_LOST, why) if lost is not None else None
    gang = obs.gang
    if failure.cause is not status.Cause.HANG or gang is None or gang.final:
        return None
    progress = failure.message.split("; not restarted in place")[0]
    if not gang.answered:
        frozen = next((p for p in pods if p.rank == 0 and p.phase is observed.PodPhase.RUNNING
                       and not _node_gone(obs, p)), None)  # fmt: skip
        if frozen is None:
            return None
        why = (f"Hang: {progress}; node rank 0's keeper, the gang's coordinator, did not answer "
               f"({gang.error}; pod {frozen.name})")  # fmt: skip
        return frozen, contract.FailureClass.HANG, why
    if len(gang.silent) != 1:
        return None
    ((node, quiet),) = gang.silent.items()
    frozen = next((p for p in pods if p.rank == node), None)
    if frozen is None:
        return None
    why = f"Hang: {progress}; node rank {node}'s keeper silent for {quiet:.0f}s (pod {frozen.name})"
    return frozen, contract.FailureClass.HANG, why


def _take_over(
    d: Decision, obs: observed.Observed, failure: status.Failure, tun: restarts.Tunables
) -> bool:
    """A lost node, or a pod frozen whole, whose place a running spare takes in a restart in
    place (spec.spares): only that pod goes; nothing is scheduled, no image starts. Node rank
    0's too (it hosted the gang's coordinator and torchrun's store): the spare becomes both,
    and the other pods' keepers follow it. Not past inPlaceRestarts, not a pod whose takeover
    was refused. True: this pass's failure is handled (or already was)."""
    s, spec, sp = d.status, obs.spec, d.status.spares
    if sp is None or not spec.spares:
        return False
    if failure.cause not in (status.Cause.NODE_LOST, status.Cause.HANG):
        return False
    pods = obs.attempt_pods(s.attempt)
    target = _takeover_target(obs, failure, pods)
    if failure.pod in sp.replaced or (target is not None and target[0].name in sp.replaced):
        d.again(1.0)  # taken over in an earlier pass; its deletion is under way
        return True
    if target is None:
        return False
    lost, cls, why = target
    rank0 = next((p for p in pods if p.rank == 0 and p.phase is observed.PodPhase.RUNNING), None)
    spare = next((p for p in sorted(obs.spares, key=lambda p: p.spare or 0)
                  if p.attempt == s.attempt and p.phase is observed.PodPhase.RUNNING
                  and not p.deleting and p.node not in (None, lost.node)
                  and not _node_gone(obs, p)), None)  # fmt: skip
    entry = _current(s)
    used = len(entry.restarts_in_place) if entry is not None else 0
    others = [p for p in pods if p.name not in (lost.name, *sp.replaced) and not p.deleting]
    reachable = True
    if lost.rank == 0:  # the spare is the coordinator now; the others' keepers follow it
        rank0 = spare
        reachable = {p.rank for p in others} == set(range(1, s.replicas or len(pods))) and all(
            p.ip and p.phase is observed.PodPhase.RUNNING for p in others
        )
    if (
        lost.rank is None
        or spare is None
        or spare.spare is None
        or rank0 is None
        or rank0.ip is None
        or spare.ip is None
        or not reachable
        or sp.refused == lost.name
        or used >= spec.failure_policy.in_place_restarts
    ):
        return False
    node0 = lost.rank == 0
    d.takeover = Takeover(
        spare=spare.name,
        index=spare.spare,
        node_rank=lost.rank,
        lost=lost.name,
        coordinator=f"{rank0.ip}:{names.GANG_PORT}",
        master=f"{rank0.ip}:{names.RENDEZVOUS_PORT}",
        followers=tuple(f"{p.ip}:{names.GANG_PORT}" for p in others) if node0 else (),
        generation=used,
        spare_at=f"{spare.ip}:{names.GANG_PORT}",
        failure={
            "class": cls.value,
            "message": failure.message if cls is contract.FailureClass.NODE_LOST else why,
            "time": failure.time,
            "rank": lost.rank * spec.nproc_per_node,
            "pod": lost.name,
            "nodeName": lost.node,
            "detected": obs.now,
        },
    )
    sp.takeovers += 1
    sp.replaced = [*sp.replaced, lost.name][-8:]
    if cls is contract.FailureClass.NODE_LOST:  # a frozen pod's node is not to blame
        s.excluded_nodes = restarts.active_exclusions(s, now=obs.now, blame=lost.node, tun=tun)
    d.emit(
        "SpareTakeover",
        f"{why}; spare pod {spare.name} (on {spare.node}) takes node rank {lost.rank}'s place "
        "in a restart in place",
        warning=True,
    )
    d.again(1.0)
    return True


def _keep_spares(d: Decision, obs: observed.Observed) -> None:
    """spec.spares running beside the attempt, once every pod of the gang has its node: a spare
    that ended or lost its node goes, a new one is made behind each that went or took a node's
    place. Not under Kueue (its pod group is the gang)."""
    s, sp = d.status, d.status.spares
    if sp is None or not s.pods_created or s.queue is not None:
        return
    if not all(p.node for p in obs.attempt_pods(s.attempt)):
        return  # a spare placed first could keep a gang pod off the node it needs
    live = []
    for p in obs.spares:
        gone = _node_gone(obs, p)
        if p.attempt == s.attempt and p.phase not in EXITED and not gone and not p.deleting:
            live.append(p)
        elif not p.deleting or gone:
            d.delete.append(PodDelete(p.name, force=gone))
    sp.running = sum(p.phase is observed.PodPhase.RUNNING for p in live)
    sp.pending = len(live) - sp.running
    surplus = sorted(live, key=lambda p: p.spare or 0)[obs.spec.spares :]
    d.delete += [PodDelete(p.name) for p in surplus]  # one made twice (a slow watch)
    made = sp.last_created is not None and obs.now - sp.last_created < SPARE_EXPECT_SECONDS
    missing = obs.spec.spares - len(live)
    if missing > 0 and not made and not _blocked(d, obs):
        d.spares = list(range(sp.next_index, sp.next_index + missing))
        sp.next_index += missing
        sp.last_created = obs.now
        sp.pending += missing


def _delete_stale(d: Decision, obs: observed.Observed) -> None:
    """Pods of earlier attempts still there: delete them (force where their node is gone)."""
    for pod in obs.pods:
        if pod.attempt != d.status.attempt and (not pod.deleting or _node_gone(obs, pod)):
            d.delete.append(PodDelete(pod.name, force=_node_gone(obs, pod)))


def _running(d: Decision, obs: observed.Observed, tun: restarts.Tunables) -> Decision:
    s = d.status
    pods = obs.attempt_pods(s.attempt)
    if not s.pods_created:
        _complete_creation(d, obs, pods)
        if obs.conflicts and not s.pods_created:
            # A name someone else holds: the gang waits whole (the pods a create made before it
            # met the name are being deleted again by this operator: not a failure).
            return d
    _queued(d, obs, pods)
    evicted = next((p for p in pods if p.queue_evicted), None)
    if evicted is not None:  # Kueue preempted the group: not a failure; requeue, resume
        msg = f"Kueue evicted pod group {s.queue.pod_group if s.queue else '?'} "
        msg += f"({evicted.queue_evicted}); waiting for re-admission"
        return _planned_stop(d, obs, status.Cause.PREEMPTED, msg)
    now_seen = dataclasses.replace(obs, status=s)  # progress tracked in this pass counts
    failure = detect.detect(now_seen)
    if failure is not None and _take_over(d, obs, failure, tun):
        return d
    if failure is not None:
        return _on_failure(d, obs, failure, tun)
    if detect.succeeded(now_seen):
        _completion_report(d, obs, pods)
        return _finish(d, obs, None, f"all {s.replicas} pods of attempt {s.attempt} exited 0")
    _delete_stale(d, obs)
    _keep_spares(d, obs)
    if pods and all(p.phase is observed.PodPhase.RUNNING for p in pods) and s.pods_created:
        if s.phase is not status.Phase.RUNNING:
            _phase(d, obs, status.Phase.RUNNING, "AllPodsRunning", f"attempt {s.attempt}")
            if s.failure_observed is not None and s.history:
                s.history[-1].recover_seconds = obs.now - s.failure_observed
                d.recovered = s.history[-1]
            s.failure_observed = None
        excluded = [e.node for e in s.excluded_nodes if e.until > obs.now]
        # Past the last step the pods are only sealing the final checkpoint: a resize now
        # would start an attempt that trains nothing.
        trained = s.step is not None and s.step >= obs.spec.training.steps
        stay = trained or _grow_came_to_nothing(s, obs.now)
        target = None if stay else restarts.grow_target(obs, excluded)
        if target is not None:
            return _planned_stop(
                d, obs, status.Cause.RESIZE, f"resizing from {s.replicas} to {target} pods"
            )
    d.again(RESYNC_SECONDS)
    wake = detect.next_deadline(now_seen)
    if wake is not None:
        d.again(wake - obs.now + 0.05)  # a node's grace or a deadline ends before the next poll
    return d


def decide(obs: observed.Observed, tun: restarts.Tunables | None = None) -> Decision:
    """What to do about one FSDPJob, given everything observed in this pass."""
    d = _decide(obs, tun or restarts.Tunables())
    _account(d, obs)
    return d


def _account(d: Decision, obs: observed.Observed) -> None:
    """Goodput, and the attempt whose time to resume became known in this pass."""
    s, before = d.status, obs.status
    entry = _current(s)
    old = _current(before)
    if (
        entry is not None
        and entry.timeline is not None
        and status.complete(entry.timeline)
        and (old is None or old.timeline is None or not status.complete(old.timeline))
    ):
        d.resumed = entry
        if entry.timeline.failed is not None:
            d.emit("TrainingResumed", _resumed_message(entry))
    fresh = goodput.account(s, now=obs.now)
    kept = s.goodput
    unchanged = s.model_dump(exclude={"goodput"}) == before.model_dump(exclude={"goodput"})
    stale = (
        kept is None
        or fresh is None
        or (fresh.wall_seconds - kept.wall_seconds >= GOODPUT_REFRESH_SECONDS)
    )
    if not unchanged or stale or s.phase in status.TERMINAL_PHASES:
        s.goodput = fresh


def _resumed_message(entry: status.HistoryEntry) -> str:
    assert entry.timeline is not None
    tl = entry.timeline
    parts = ", ".join(
        f"{phase} {secs:.1f}s" for phase, secs in status.breakdown(tl) if secs is not None
    )
    total = status.time_to_resume(tl) or 0.0
    cause = tl.cause.value if tl.cause else "-"
    return f"attempt {entry.attempt} training {total:.1f}s after {cause} ({parts})"


def _decide(obs: observed.Observed, tun: restarts.Tunables) -> Decision:
    d = Decision(status=obs.status.model_copy(deep=True))
    s = d.status
    s.observed_generation = obs.generation
    s.conditions = [c for c in s.conditions if c.type != RECONCILE_ERROR]  # this pass works
    _track(d, obs)
    if s.phase in status.TERMINAL_PHASES:
        return _finished(d, obs)
    _milestones(d, obs)
    if obs.validated_generation is not None:
        s.validated_generation = obs.validated_generation
    _conflicts(d, obs)
    if obs.spec_error:
        return _finish(d, obs, status.Cause.INVALID_SPEC, obs.spec_error)
    if s.started is None or (s.phase is status.Phase.SUSPENDED and not obs.spec.suspend):
        s.started = obs.now  # the active deadline counts from (re)start, like a Job's
    if obs.spec.suspend:
        return _suspend(d, obs)
    deadline = obs.spec.active_deadline_seconds
    if deadline is not None and obs.now - s.started >= deadline:
        return _finish(d, obs, status.Cause.DEADLINE, f"activeDeadlineSeconds={deadline} passed")
    if deadline is not None:
        d.again(s.started + deadline - obs.now)
    if s.phase is status.Phase.SUSPENDED:
        _phase(d, obs, status.Phase.PENDING, "Resumed", "spec.suspend cleared")
        d.emit("Resumed", "spec.suspend cleared; starting from the newest checkpoint")
        return _launch(d, obs, tun, cause=None)
    _final_sums(d, obs)
    if s.attempt == 0 or (s.phase is status.Phase.RESTARTING and s.next_attempt_at is not None):
        if s.attempt == 0:
            _phase(d, obs, status.Phase.PENDING, "Created", "")
        return _launch(d, obs, tun, cause=s.last_failure.cause if s.last_failure else None)
    return _stopped_in_place(d, obs) or _running(d, obs, tun)


def _stopped_in_place(d: Decision, obs: observed.Observed) -> Decision | None:
    """A restart in place that spent a budget ends the job as a gang restart would."""
    if d.stop is None:
        return None
    cause, why = d.stop
    failure = d.status.last_failure
    if failure is not None and cause is failure.cause and failure.message:
        why = f"{why}: {failure.message}"
    return _finish(d, obs, cause, why)


def _suspend(d: Decision, obs: observed.Observed) -> Decision:
    s = d.status
    if s.phase is status.Phase.SUSPENDED:
        _delete_all(d, obs)  # stragglers from a pass that stopped half-way
        if d.delete:
            d.again(1.0)
        return d
    return _planned_stop(d, obs, status.Cause.SUSPENDED, "spec.suspend set; pods stop after a save")

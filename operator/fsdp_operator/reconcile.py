"""One reconcile pass for one FSDPJob: observe -> decide -> apply, with one status write.

Blocking (the handlers run it in a thread). The order of side effects is what makes the operator
restart-safe: the status (the operator's memory) is written first, then pods are deleted and
created, so a pass cut short anywhere is finished by the next one without duplicate pods.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from typing import Any

import pydantic

from fsdp_operator import cache, metrics, names, observe, probe, templates
from fsdp_operator import decide as dc
from fsdp_operator import kube as k8s
from fsdp_operator import observed as ob
from fsdp_operator import settings as cfg
from fsdp_operator import spec as api
from fsdp_operator import status as st
from fsdp_worker import catalog

log = logging.getLogger(__name__)
IDLE_SECONDS = 3600.0  # a job with nothing to wait for is looked at this often (and on events)
_QUARANTINE = {
    catalog.RejectReason.BAD_MARKER,
    catalog.RejectReason.MANIFEST_MISMATCH,
    catalog.RejectReason.CHECKSUM_MISMATCH,
}


@dataclasses.dataclass(frozen=True)
class Context:
    kube: k8s.Kube
    settings: cfg.Settings


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the loop does after a pass."""

    delay: float
    """Seconds until the next pass, unless an event comes first."""
    probe: probe.Target | None = None
    """Rank 0's endpoint to scrape for this job, and how often."""
    wants_nodes: bool = False
    """Node changes anywhere may matter (the job waits for room, or runs smaller than asked)."""


def check_spec(body: dict[str, Any], job: names.JobRef) -> tuple[api.FSDPJobSpec | None, str]:
    """Parse the spec and dry-run templating: what the CRD cannot catch becomes a reason."""
    try:
        spec = api.FSDPJobSpec.model_validate(body.get("spec") or {})
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        return None, f"spec{where}: {first['msg']}"
    try:
        templates.worker_pod(
            job=job, spec=spec, attempt=1, node_rank=0, replicas=spec.replicas,
            resume_path="", excluded_nodes=(),
        )  # fmt: skip
    except ValueError as exc:
        return spec, str(exc)
    return spec, ""


def storage_for(job: names.JobRef, spec: api.FSDPJobSpec, settings: cfg.Settings) -> str | None:
    """Local directory where the operator sees this job's checkpoints, if it can."""
    claim = spec.checkpoint.claim_name
    if not settings.storage_template or not claim:
        return None
    volume = settings.storage_template.format(namespace=job.namespace, claim=claim)
    return names.checkpoint_dir(volume, job.name)


def _writer(cand: catalog.Candidate) -> str:
    uid = cand.marker.job_uid if cand.marker else None
    return f"FSDPJob uid {uid}" if uid else "an FSDPJob that recorded no uid (an older version)"


@dataclasses.dataclass(frozen=True)
class _Catalog:
    newest: st.CheckpointRef | None = None
    corrupt: tuple[str, ...] = ()
    conflicts: tuple[ob.Conflict, ...] = ()


def _checkpoints(
    job: names.JobRef, spec: api.FSDPJobSpec, status: st.FSDPJobStatus, base: str | None,
    *, deep: bool,
) -> _Catalog:  # fmt: skip
    if base is None or not os.path.isdir(base):
        return _Catalog()
    storage = catalog.LocalStorage(base)
    lineage = catalog.Lineage(
        attempt=status.attempt, resumed_from_step=status.resumed_from_step, job_uid=job.uid,
        other_jobs=spec.checkpoint.resume_from_previous_jobs,
    )  # fmt: skip
    chosen, rejected = catalog.select(
        storage, ".", config_hash=spec.training.resume_hash(), lineage=lineage, deep=deep
    )
    for cand in rejected:
        log.debug("%s/%s: checkpoint %s rejected: %s %s",
                  job.namespace, job.name, cand.path, cand.reason, cand.detail)  # fmt: skip
    corrupt = tuple(c.path for c in rejected if c.reason in _QUARANTINE)
    others = [c for c in rejected if c.reason == catalog.RejectReason.OTHER_JOB]
    # Before the first attempt, another job's checkpoints mean the user re-used a name (or a
    # directory): starting fresh there would mix two runs' steps, resuming would be a guess.
    conflicts = tuple(
        ob.Conflict(ob.ConflictKind.CHECKPOINTS, f"checkpoint {c.path}", _writer(c))
        for c in others[:1]
        if status.attempt == 0
    )
    if chosen is None or chosen.marker is None:
        return _Catalog(None, corrupt, conflicts)
    m = chosen.marker
    in_pod = (
        f"{names.checkpoint_dir(spec.checkpoint.root, job.name)}/{catalog.step_dir_name(m.step)}"
    )
    ref = st.CheckpointRef(
        step=m.step, path=in_pod, attempt=m.attempt, world_size=m.world_size, time=m.time
    )
    return _Catalog(ref, corrupt, conflicts)


def _rank0(pods: list[ob.PodView], status: st.FSDPJobStatus) -> ob.PodView | None:
    """Rank 0 of the current attempt while its endpoint is worth reading (running, no pod of
    the attempt failing: a failure is being handled, its progress is history)."""
    current = [p for p in pods if p.attempt == status.attempt]
    if any(p.phase is ob.PodPhase.FAILED or p.deleting for p in current):
        return None
    rank0 = next((p for p in current if p.rank == 0), None)
    if rank0 is None or rank0.phase is not ob.PodPhase.RUNNING or not rank0.ip:
        return None
    return rank0


def _progress(
    pods: list[ob.PodView], status: st.FSDPJobStatus, view: cache.View
) -> ob.Progress | None:
    rank0 = _rank0(pods, status)
    if rank0 is None or view.progress_pod != rank0.name:
        return None
    return view.progress


# The pod's fields that come straight from the FSDPJob, so a refusal names the job's field.
_POD_TO_JOB_FIELDS = (
    ("spec.containers[0].resources", "spec.resources"),
    ("spec.affinity", "spec.template.spec.affinity"),
    ("spec.tolerations", "spec.template.spec.tolerations"),
    ("spec.nodeSelector", "spec.template.spec.nodeSelector"),
    ("spec.priorityClassName", "spec.template.spec.priorityClassName"),
    ("spec.schedulerName", "spec.template.spec.schedulerName"),
)


def _dry_run(ctx: Context, job: names.JobRef, spec: api.FSDPJobSpec, attempt: int) -> str:
    """What the API server says of rank 0's pod ("" when it would admit it).

    Admission knows what the CRD cannot: Pod Security, admission policies, LimitRanges, the
    pod's own validation. A refusal there is the spec's fault; a full quota is not.
    """
    pod = templates.worker_pod(
        job=job, spec=spec, attempt=max(1, attempt), node_rank=0, replicas=spec.replicas,
        resume_path="", excluded_nodes=(), worker_module=ctx.settings.worker_module,
    )  # fmt: skip
    meta = pod["metadata"]
    meta["generateName"] = f"{meta.pop('name')}-dryrun-"
    refused = ctx.kube.dry_run_pod(pod)
    if refused is None:
        return ""
    code, message = refused
    if code in (400, 403, 422) and "exceeded quota" not in message:
        for pod_field, job_field in _POD_TO_JOB_FIELDS:
            message = message.replace(pod_field, job_field)
        return f"the API server refuses the worker pod ({code}): {message}"
    raise RuntimeError(f"dry run of the worker pod failed ({code}): {message}")


def _owned_pods(
    ctx: Context, job: names.JobRef, status: st.FSDPJobStatus, raw: list[dict[str, Any]],
    *, just_created: bool = False,
) -> tuple[list[ob.PodView], list[ob.Conflict]]:  # fmt: skip
    """This job's pods (by controller uid), and what carries its labels or names but is not.

    While an attempt's pods are being created, a pod or Service name it needs that is held by
    someone else is a conflict too (a hand-made `<job>-a1-0`, or the pods of a deleted job of
    the same name that the garbage collector has not removed yet).
    """
    ours = [p for p in raw if observe.owned_by(p, job)]
    conflicts = [observe.conflict({**p, "kind": "Pod"}, job) for p in raw if p not in ours]
    if status.attempt > 0 and not status.pods_created and not just_created:
        # (not for names this process has just created: their creates said who holds them)
        taken = {p["metadata"]["name"] for p in raw}
        wanted = [("Service", names.service_name(job.name))] + [
            ("Pod", names.pod_name(job.name, attempt=status.attempt, node_rank=rank))
            for rank in range(status.replicas or 0)
        ]
        for kind, name in wanted:
            found = None if name in taken else ctx.kube.get(kind, job.namespace, name)
            if found is not None and not observe.owned_by(found, job):
                conflicts.append(observe.conflict(found, job))
    pods = [v for p in ours if (v := observe.pod_view(p)) is not None]
    return pods, conflicts


def gather(ctx: Context, body: dict[str, Any], now: float, view: cache.View) -> ob.Observed:
    """The pass's observation: the job as just read, its pods and the nodes from the watches'
    caches (`view`), its checkpoints from storage. No LIST call."""
    meta = body["metadata"]
    job = names.JobRef.of(body)
    status = observe.status_of(body.get("status"))
    generation = meta.get("generation", 0)
    spec, error = check_spec(body, job)
    if spec is None:  # no spec to reason about: fail with the reason, touch nothing
        spec = api.FSDPJobSpec(replicas=1, image="invalid")
        return ob.Observed(spec=spec, status=status, generation=generation,
                           now=now, spec_error=error)  # fmt: skip
    validated = status.validated_generation
    if not error and validated != generation and status.phase not in st.TERMINAL_PHASES:
        error = _dry_run(ctx, job, spec, status.attempt)
        validated = None if error else generation
    created_at = _created_at.get((job.uid, status.attempt))
    just = created_at is not None and now - created_at < dc.EXPECT_SECONDS
    pods, conflicts = _owned_pods(ctx, job, status, view.pods, just_created=just)
    own = [p for p in view.pods if observe.owned_by(p, job)]
    nodes = observe.node_views(view.nodes, spec=spec, used=cache.without(view.used, own))
    base = storage_for(job, spec, ctx.settings)
    found = _checkpoints(job, spec, status, base, deep=ctx.settings.deep_verify)
    return ob.Observed(
        spec=spec,
        status=status,
        generation=generation,
        now=now,
        pods=pods,
        nodes=nodes,
        checkpoint=found.newest,
        corrupt_checkpoints=found.corrupt,
        progress=_progress(pods, status, view),
        spec_error=error,
        created=observe.ts(meta.get("creationTimestamp")),
        conflicts=[*conflicts, *found.conflicts],
        validated_generation=validated,
        created_at=created_at,
    )


def apply(ctx: Context, body: dict[str, Any], obs: ob.Observed, d: dc.Decision) -> None:
    job = names.JobRef.of(body)
    kube = ctx.kube
    status = d.status.model_dump(mode="json", by_alias=True)
    if status != obs.status.model_dump(mode="json", by_alias=True):  # write only what changed
        written = kube.patch_status(job.namespace, job.name, status)
        if written:
            own_writes[(job.namespace, job.name)] = written
    base = storage_for(job, obs.spec, ctx.settings)
    for path in d.quarantine:
        if base is not None:
            step = int(path.rsplit("-", 1)[-1])
            try:
                catalog.quarantine(catalog.LocalStorage(base), ".", step)
            except catalog.CatalogError as exc:
                log.warning("quarantine of %s failed: %s", path, exc)
    list(_WRITERS.map(lambda rm: kube.delete_pod(job.namespace, rm.name, grace=rm.grace_seconds),
                      d.delete))  # fmt: skip
    if d.launch is not None:
        _create_gang(ctx, job, obs.spec, d.launch)
    for ev in d.events:
        kube.event(job, type_=ev.type.value, reason=ev.reason, message=ev.message)
    metrics.record(job=job, obs=obs, decision=d)
    if d.delete_job:
        kube.delete_job(job.namespace, job.name)


def _create_gang(ctx: Context, job: names.JobRef, spec: api.FSDPJobSpec, launch: dc.Launch) -> None:
    """The Service, then the attempt's pods, all at once (a 64-node gang is up in about the time
    of one create); none if the Service's name is someone else's.

    A 409 is success only when the object there is controlled by this job's uid. Otherwise it
    is never adopted: the next pass sees the conflict, creates nothing more and says so in a
    condition (the pods already created wait, as those before a taken name always did).
    """
    pods = templates.worker_pods(
        job=job, spec=spec, attempt=launch.attempt, replicas=launch.replicas,
        resume_path=launch.resume_path, excluded_nodes=launch.excluded_nodes,
        worker_module=ctx.settings.worker_module, reliability=launch.reliability,
    )  # fmt: skip
    if not _created(ctx, job, templates.service(job=job, spec=spec)):
        return
    if not all(list(_WRITERS.map(lambda pod: _created(ctx, job, pod), pods))):
        return  # a name is someone else's: the next pass looks it up and reports it
    with _created_lock:
        now = time.time()
        for key in [k for k, t in _created_at.items() if now - t > 2 * dc.EXPECT_SECONDS]:
            del _created_at[key]
        _created_at[(job.uid, launch.attempt)] = now


def _created(ctx: Context, job: names.JobRef, obj: dict[str, Any]) -> bool:
    existing = ctx.kube.create(obj)
    if existing is not None and not observe.owned_by(existing, job):
        log.warning("%s: not creating the gang: %s", job.name,
                    observe.conflict(existing, job).describe())  # fmt: skip
        return False
    return True


own_writes: dict[tuple[str, str], str] = {}
"""(namespace, job) -> the resourceVersion this process's last status write produced: the watch
event it causes wakes nobody (the pass that wrote it already said when to look again)."""
_created_at: dict[tuple[str, int], float] = {}
"""(job uid, attempt) -> when this process created that attempt's pods (in memory only: after a
restart the operator creates what it does not see, and a 409 tells it they exist)."""
_created_lock = threading.Lock()
_WRITERS = concurrent.futures.ThreadPoolExecutor(16, thread_name_prefix="fsdpop-write")
"""Deletes and creates of one pass go out together (urllib3's pool holds 32 connections)."""


_ERROR_EVENT_SECONDS = 60.0
_last_error_event: dict[str, float] = {}


def _report_error(ctx: Context, body: dict[str, Any], exc: Exception) -> None:
    """A pass that raised: a Warning Event (at most one a minute) and a condition saying why."""
    job = names.JobRef.of(body)
    now = time.time()
    message = k8s.describe_error(exc)
    if now - _last_error_event.get(job.uid, 0.0) >= _ERROR_EVENT_SECONDS:
        _last_error_event[job.uid] = now
        ctx.kube.event(job, type_="Warning", reason=dc.RECONCILE_ERROR, message=message)
    status = observe.status_of(body.get("status"))
    if any(c.type == dc.RECONCILE_ERROR and c.message == message for c in status.conditions):
        return
    cond = st.Condition(type=dc.RECONCILE_ERROR, status="True", reason=type(exc).__name__,
                        message=message, last_transition_time=dc.stamp(now))  # fmt: skip
    conditions = [c for c in status.conditions if c.type != dc.RECONCILE_ERROR] + [cond]
    patch = {"conditions": [c.model_dump(mode="json", by_alias=True) for c in conditions]}
    ctx.kube.patch_status(job.namespace, job.name, patch)


def _probe_target(ctx: Context, obs: ob.Observed, d: dc.Decision) -> probe.Target | None:
    rank0 = _rank0(list(obs.pods), d.status)
    if rank0 is None or rank0.ip is None or d.status.phase in st.TERMINAL_PHASES:
        return None
    entry = d.status.history[-1] if d.status.history else None
    starting = entry is not None and entry.timeline is not None and not st.complete(entry.timeline)
    every = probe.interval_for(
        obs.spec.failure_policy.progress_deadline_seconds, ctx.settings.scrape_max_interval_seconds
    )
    return probe.Target(pod=rank0.name, ip=rank0.ip, every=every, starting=starting)


def _wants_nodes(obs: ob.Observed, d: dc.Decision) -> bool:
    s = d.status
    if s.phase in st.TERMINAL_PHASES or s.phase is st.Phase.SUSPENDED:
        return False
    return s.phase is not st.Phase.RUNNING or (s.replicas or 0) < obs.spec.replicas


def run_pass(ctx: Context, namespace: str, name: str, view: cache.View) -> Outcome | None:
    """One pass; returns what to do next (None: the job is gone)."""
    body = ctx.kube.get_job(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    metrics.PASSES.inc()
    try:
        obs = gather(ctx, body, time.time(), view)
        decision = dc.decide(obs, ctx.settings.tunables)
        apply(ctx, body, obs, decision)
    except k8s.NotLeader:
        raise  # not this job's failure: nothing to report (and no right to write it)
    except Exception as exc:
        try:
            _report_error(ctx, body, exc)
        except Exception:  # the report is advice; the pass's own error is what gets raised
            log.exception("could not report the failed pass of %s", body["metadata"]["name"])
        raise
    _last_error_event.pop(body["metadata"]["uid"], None)
    if decision.delete_job:
        return None
    # Nothing scheduled (a finished job without a TTL): keep the loop, and with it the job's
    # metrics (goodput, checkpoint age), until the job is deleted; events still wake it.
    delay = decision.requeue_after if decision.requeue_after is not None else IDLE_SECONDS
    return Outcome(delay, _probe_target(ctx, obs, decision), _wants_nodes(obs, decision))

"""One reconcile pass for one FSDPJob: observe -> decide -> apply, with one status write.

Blocking (loops.py runs it in a thread). The order of side effects is what makes the operator
restart-safe: the status (the operator's memory) is written first, then pods are deleted and
created, so a pass cut short anywhere is finished by the next one without duplicate pods. What
a pass must ask before it writes (a failed gang's logs, a spare takeover's keepers) is asked
first, and its answer goes out in that one status write (failure.explained, spares.refused).

`Reconciler` owns what the passes of one process share: the API access, the settings, the
writer pool, this process's own status writes, when it created each gang and when it last said
that a job's pass failed. Nothing is kept in module globals: two Reconcilers share nothing.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pydantic

from fsdp_operator.io import cache, checkpoints, kube, metrics, observe, probe, reports
from fsdp_operator.policy import decide, detect, failure, spares
from fsdp_operator.render import templates
from fsdp_operator.run import evidence, recording, settings
from fsdp_operator.types import api, names, observed, queueing, status
from fsdp_worker.contract import catalog, keeper

log = logging.getLogger(__name__)
TAKEOVER_TIMEOUT = 2.0  # seconds for a keeper to answer a spare takeover's word
GANG_ASK_TIMEOUT = 1.0  # seconds for it to answer, in a hang's grace, whether it restarts
IDLE_SECONDS = 3600.0  # a job with nothing to wait for is looked at this often (and on events)
ERROR_EVENT_SECONDS = 60.0  # a failing pass says so in a Warning Event at most this often
Key = tuple[str, str]


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the loop does after a pass."""

    delay: float
    """Seconds until the next pass, unless an event comes first."""
    probe: probe.Target | None = None
    """Rank 0's endpoint to scrape for this job, and how often."""
    wants_nodes: bool = False
    """Node changes anywhere may matter (the job waits for room, or runs smaller than asked)."""


def first_launch(spec: api.FSDPJobSpec, attempt: int = 1) -> decide.Launch:
    """The launch templating is tried with before any attempt exists (validation, dry run)."""
    return decide.Launch(attempt=max(1, attempt), replicas=spec.replicas, resume_path="")


ProfileOf = Callable[[str], api.RuntimeProfileSpec | None]
"""A runtime profile's spec by name; None when there is none of that name."""


def check_spec(
    body: dict[str, Any], job: names.JobRef, profile_of: ProfileOf = lambda name: None
) -> tuple[api.FSDPJobSpec | None, str, api.RuntimeProfileSpec | None]:
    """Parse the spec, read its runtime profile and dry-run templating: what the CRD cannot
    catch becomes a reason."""
    try:
        spec = api.FSDPJobSpec.model_validate(body.get("spec") or {})
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        return None, f"spec{where}: {first['msg']}", None
    profile = None
    try:
        if spec.runtime_profile is not None:
            profile = profile_of(spec.runtime_profile)
        templates.worker_pod(job, spec, first_launch(spec), node_rank=0, profile=profile)
    except ValueError as exc:
        return spec, str(exc), profile
    return spec, "", profile


def _rank0(
    pods: list[observed.PodView], job_status: status.FSDPJobStatus
) -> observed.PodView | None:
    """Rank 0 of the current attempt while its endpoint is worth reading (running, no pod of
    the attempt failing: a failure is being handled, its progress is history)."""
    current = [p for p in pods if p.attempt == job_status.attempt]
    if any(p.phase is observed.PodPhase.FAILED or p.deleting for p in current):
        return None
    rank0 = next((p for p in current if p.rank == 0), None)
    if rank0 is None or rank0.phase is not observed.PodPhase.RUNNING or not rank0.ip:
        return None
    return rank0


def _progress(
    pods: list[observed.PodView], job_status: status.FSDPJobStatus, view: cache.View
) -> observed.Progress | None:
    rank0 = _rank0(pods, job_status)
    if rank0 is None or view.progress_pod != rank0.name:
        return None
    return view.progress


def _scrape(
    pods: list[observed.PodView], job_status: status.FSDPJobStatus, view: cache.View
) -> observed.ScrapeHealth | None:
    rank0 = _rank0(pods, job_status)
    if rank0 is None or view.scrape is None or view.scrape.pod != rank0.name:
        return None
    return view.scrape


# Refusals of a worker pod's dry run that a fixed cluster clears: the spec is not at fault, so
# the pass fails (and is retried, backing off) instead of failing the job as InvalidSpec. A
# ResourceQuota that is full; the operator's own RBAC missing a verb; a namespace being deleted.
_NOT_THE_SPECS_FAULT = ("exceeded quota", "cannot create resource", "being terminated")

# The pod's fields that come straight from the FSDPJob, so a refusal names the job's field.
_POD_TO_JOB_FIELDS = (
    ("spec.containers[0].resources", "spec.resources"),
    ("spec.affinity", "spec.template.spec.affinity"),
    ("spec.tolerations", "spec.template.spec.tolerations"),
    ("spec.nodeSelector", "spec.template.spec.nodeSelector"),
    ("spec.priorityClassName", "spec.template.spec.priorityClassName"),
    ("spec.schedulerName", "spec.template.spec.schedulerName"),
)


def _probe_target(
    obs: observed.Observed, d: decide.Decision, *, max_interval: float
) -> probe.Target | None:
    rank0 = _rank0(list(obs.pods), d.status)
    if rank0 is None or rank0.ip is None or d.status.phase in status.TERMINAL_PHASES:
        return None
    entry = d.status.history[-1] if d.status.history else None
    starting = (
        entry is not None and entry.timeline is not None and not status.complete(entry.timeline)
    )
    every = probe.interval_for(obs.spec.failure_policy.progress_deadline_seconds, max_interval)
    if any((n := obs.node(p.node)) is not None and n.lease_quiet for p in obs.pods if p.node):
        # A node of the gang missed a Lease renewal: whether training goes on decides if it is
        # lost (detect.py), so rank 0's step is read now and every second.
        every = probe.SUSPECT_INTERVAL
    return probe.Target(pod=rank0.name, ip=rank0.ip, every=every, starting=starting)


def _gang_health(ip: str) -> observed.GangHealth:
    """Ask the in-place gang's coordinator whether its keepers are all there (a hang's grace
    waits for their restart in place only then)."""
    try:
        answer = keeper.ask(
            (ip, names.GANG_PORT), {"op": keeper.Op.STATE}, timeout=GANG_ASK_TIMEOUT
        )
    except (OSError, ValueError) as exc:
        return observed.GangHealth(answered=False, error=f"{ip}:{names.GANG_PORT}: {exc}")
    return observed.GangHealth.of(answer)


def _tell(address: str, doc: dict[str, Any]) -> str:
    """One word to a keeper at host:port: "" when it took it, else why not."""
    host, _, port = address.rpartition(":")
    try:
        answer = keeper.ask((host, int(port)), doc, timeout=TAKEOVER_TIMEOUT)
    except (OSError, ValueError) as exc:
        return f"the keeper at {address} did not answer: {exc}"
    return str(answer.get("refused") or "")


def _replace(t: decide.Takeover) -> str:
    """A non-zero node rank's place: the spare is told where node rank 0's coordinator and
    store are now (its template names the attempt's first node 0, which a spare may have
    replaced since), then that coordinator gives it the place."""
    refused = _tell(
        t.spare_at, {"op": keeper.Op.FOLLOW, "coordinator": t.coordinator, "master": t.master}
    )
    if refused:
        return refused
    doc = {"op": keeper.Op.REPLACE, "node": t.node_rank, "spare": t.index, "failure": t.failure}
    return _tell(t.coordinator, doc)


def _promote(t: decide.Takeover) -> str:
    """Node rank 0's place: the spare's keeper becomes the gang's coordinator, its ranks host
    the store, and every other node's keeper is told to follow it (side by side: at scale one
    after another would add a timeout per silent pod). A keeper that did not take it leaves
    the promoted coordinator waiting for it: it is told to give up (`final`), and the gang is
    recreated."""
    promote = {
        "op": keeper.Op.PROMOTE,
        "master": t.master,
        "failure": t.failure,
        "generation": t.generation,
    }
    refused = _tell(t.coordinator, promote)
    if refused or not t.followers:
        return refused
    doc = {"op": keeper.Op.FOLLOW, "coordinator": t.coordinator, "master": t.master}
    with concurrent.futures.ThreadPoolExecutor(max_workers=min(32, len(t.followers))) as pool:
        answers = list(pool.map(lambda a: _tell(a, doc), t.followers))
    missed = [f"{a}: {why}" for a, why in zip(t.followers, answers, strict=True) if why]
    if not missed:
        return ""
    _tell(t.coordinator, {"op": keeper.Op.FAIL, "final": True})
    return f"{len(missed)} of {len(t.followers)} keepers did not follow: {missed[0]}"


def _wants_nodes(obs: observed.Observed, d: decide.Decision) -> bool:
    s = d.status
    if s.phase in status.TERMINAL_PHASES or s.phase is status.Phase.SUSPENDED:
        return False
    return s.phase is not status.Phase.RUNNING or (s.replicas or 0) < obs.spec.replicas


class Reconciler:
    """Runs passes (from any thread; what they share is locked or written whole)."""

    def __init__(
        self,
        api_access: kube.Kube,
        config: settings.Settings,
        *,
        writers: int = 16,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """`writers`: deletes and creates of one pass go out together on this many threads
        (urllib3's pool holds 32 connections)."""
        self.kube = api_access
        self.settings = config
        self._clock = clock
        self._writers = concurrent.futures.ThreadPoolExecutor(
            writers, thread_name_prefix="fsdpop-write"
        )
        self._own_writes: dict[Key, str] = {}
        """(namespace, job) -> the resourceVersion this process's last status write produced:
        the watch event it causes wakes nobody (the pass that wrote it said when to look)."""
        self._created_at: dict[tuple[str, int], float] = {}
        """(job uid, attempt) -> when this process created that attempt's pods (in memory only:
        after a restart the operator creates what it does not see; a 409 says they exist)."""
        self._created_lock = threading.Lock()
        self._error_events: dict[Key, float] = {}
        """(namespace, job) -> when a failed pass of it last posted a Warning Event."""
        self._written: dict[Key, status.FSDPJobStatus] = {}
        """(namespace, job) -> the status the pass under way wrote (until it ends): a failure
        after that write is reported on top of it, not of the status the pass read."""

    # --- what the loops call ----------------------------------------------------------------
    def run_pass(self, namespace: str, name: str, view: cache.View) -> Outcome | None:
        """One pass; returns what to do next (None: the job is gone)."""
        body = self.kube.get_job(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        metrics.PASSES.inc()
        self._written.pop((namespace, name), None)  # a pass that ended NotLeader left its own
        try:
            obs = self.gather(body, self._clock(), view)
            decision = self.apply(body, obs, decide.decide(obs, self.settings.tunables))
        except kube.NotLeader:
            raise  # not this job's failure: nothing to report (and no right to write it)
        except Exception as exc:
            metrics.RECONCILE_ERRORS.labels(type(exc).__name__).inc()
            try:
                self._report_error(body, exc, written=self._written.pop((namespace, name), None))
            except Exception:  # the report is advice; the pass's own error is what is raised
                log.exception("could not report the failed pass of %s/%s", namespace, name)
            raise
        self._written.pop((namespace, name), None)
        self._error_events.pop((namespace, name), None)
        if decision.delete_job:
            return None
        # Nothing scheduled (a finished job without a TTL): keep the loop, and with it the
        # job's metrics (goodput, checkpoint age), until the job is deleted; events wake it.
        delay = decision.requeue_after if decision.requeue_after is not None else IDLE_SECONDS
        target = _probe_target(
            obs, decision, max_interval=self.settings.scrape_max_interval_seconds
        )
        return Outcome(delay, target, _wants_nodes(obs, decision))

    def is_echo(self, namespace: str, name: str, version: str | None) -> bool:
        """Whether a MODIFIED event of the job is the echo of this process's own status write
        (it is then forgotten: the next event of that version is someone else's)."""
        key = (namespace, name)
        if not version or self._own_writes.get(key) != version:
            return False
        self._own_writes.pop(key, None)
        return True

    def forget(self, namespace: str, name: str) -> None:
        """The job's loop ended: drop what this process kept of it."""
        self._own_writes.pop((namespace, name), None)
        self._error_events.pop((namespace, name), None)

    def close(self) -> None:
        self._writers.shutdown(wait=False, cancel_futures=True)

    # --- observe --------------------------------------------------------------------------------
    def gather(self, body: dict[str, Any], now: float, view: cache.View) -> observed.Observed:
        """The pass's observation: the job as just read, its pods and the nodes from the
        watches' caches (`view`), its checkpoints from storage. No LIST call."""
        meta = body["metadata"]
        job = names.JobRef.of(body)
        job_status = observe.status_of(body.get("status"))
        generation = meta.get("generation", 0)
        spec, error, profile = check_spec(body, job, self._profile)
        if spec is None:  # no spec to reason about: fail with the reason, touch nothing
            spec = api.FSDPJobSpec(replicas=1, image="invalid")
            return observed.Observed(
                spec=spec, status=job_status, generation=generation, now=now, spec_error=error
            )
        validated = job_status.validated_generation
        if not error and validated != generation and job_status.phase not in status.TERMINAL_PHASES:
            error = self._dry_run(job, spec, job_status.attempt, profile)
            validated = None if error else generation
        with self._created_lock:
            created_at = self._created_at.get((job.uid, job_status.attempt))
        just = created_at is not None and now - created_at < decide.EXPECT_SECONDS
        pods, conflicts = self._owned_pods(job, job_status, view.pods, just_created=just)
        spare_pods = [p for p in pods if p.spare is not None]
        pods = [p for p in pods if p.spare is None]
        own = [p for p in view.pods if observe.owned_by(p, job)]
        nodes = observe.node_views(
            view.nodes,
            spec=spec,
            used=cache.without(view.used, own),
            lease_lost=view.lease_lost,
            lease_quiet=view.lease_quiet,
        )
        base = checkpoints.storage_for(job, spec, self.settings.storage_template)
        found = checkpoints.newest(job, spec, job_status, base, deep=self.settings.deep_verify)
        queue = queueing.Queue.of(
            job.name,
            meta.get("labels"),
            spec.template.metadata.labels,
            annotations=meta.get("annotations"),
        )
        if queue is not None and not error:
            error = queueing.spares_refusal(queue, spec.spares)
        obs = observed.Observed(
            spec=spec,
            status=job_status,
            generation=generation,
            now=now,
            pods=pods,
            nodes=nodes,
            checkpoint=found.newest,
            corrupt_checkpoints=found.corrupt,
            checkpoints_visible=found.visible,
            checkpoint_dir=names.checkpoint_dir(spec.checkpoint.root, job.name),
            progress=_progress(pods, job_status, view),
            scrape=_scrape(pods, job_status, view),
            spec_error=error,
            created=observe.ts(meta.get("creationTimestamp")),
            conflicts=[*conflicts, *found.conflicts],
            validated_generation=validated,
            created_at=created_at,
            profile=profile,
            queue=queue,
            admission=self._admission(job, job_status, pods),
            spares=spare_pods,
            resume_rules=reports.resume_rules(job_status.resume_rules),
        )
        coordinator = detect.asks_the_gang(obs)
        if coordinator is None:
            return obs
        return dataclasses.replace(obs, gang=_gang_health(coordinator))

    def _admission(
        self, job: names.JobRef, s: status.FSDPJobStatus, pods: list[observed.PodView]
    ) -> queueing.Admission | None:
        """Kueue's Workload of the attempt's pod group, read (one GET) only while a pod of it
        is gated or its admission was not yet seen: the reason a queued job waits."""
        q = s.queue
        current = [p for p in pods if p.attempt == s.attempt]
        if q is None or q.admitted is not None or not current:
            return None
        return queueing.admission_of(self.kube.get_workload(job.namespace, q.pod_group))

    def _profile(self, name: str) -> api.RuntimeProfileSpec | None:
        """The runtime profile's spec as the API server has it now (one GET; profile jobs
        only). A revoked grant shows at the next pass, and the job fails naming it."""
        found = self.kube.get_profile(name)
        if found is None:
            return None
        try:
            return api.FSDPRuntimeProfile.model_validate({"spec": found.get("spec") or {}}).spec
        except pydantic.ValidationError as exc:
            raise ValueError(
                f"spec.runtimeProfile={name!r}: the profile is invalid: {exc}"
            ) from exc

    def _dry_run(
        self,
        job: names.JobRef,
        spec: api.FSDPJobSpec,
        attempt: int,
        profile: api.RuntimeProfileSpec | None,
    ) -> str:
        """What the API server says of rank 0's pod ("" when it would admit it).

        Admission knows what the CRD cannot: Pod Security, admission policies, LimitRanges,
        the pod's own validation. A refusal there is the spec's fault; a full quota is not.
        """
        pod = templates.worker_pod(
            job,
            spec,
            first_launch(spec, attempt),
            node_rank=0,
            worker_module=self.settings.worker_module,
            profile=profile,
        )
        meta = pod["metadata"]
        meta["generateName"] = f"{meta.pop('name')}-dryrun-"
        refused = self.kube.dry_run_pod(pod)
        if refused is None:
            return ""
        code, message = refused
        if code in (400, 403, 422) and not any(n in message for n in _NOT_THE_SPECS_FAULT):
            for pod_field, job_field in _POD_TO_JOB_FIELDS:
                message = message.replace(pod_field, job_field)
            return f"the API server refuses the worker pod ({code}): {message}"
        raise RuntimeError(f"dry run of the worker pod failed ({code}): {message}")

    def _owned_pods(
        self,
        job: names.JobRef,
        job_status: status.FSDPJobStatus,
        raw: list[dict[str, Any]],
        *,
        just_created: bool = False,
    ) -> tuple[list[observed.PodView], list[observed.Conflict]]:
        """This job's pods (by controller uid), and what carries its labels or names but is not.

        While an attempt's pods are being created, a pod or Service name it needs that is held
        by someone else is a conflict too (a hand-made `<job>-a1-0`, or the pods of a deleted
        job of the same name that the garbage collector has not removed yet).
        """
        ours = [p for p in raw if observe.owned_by(p, job)]
        conflicts = [observe.conflict({**p, "kind": "Pod"}, job) for p in raw if p not in ours]
        if job_status.attempt > 0 and not job_status.pods_created and not just_created:
            # (not for names this process has just created: their creates said who holds them)
            taken = {p["metadata"]["name"] for p in raw}
            wanted = [("Service", names.service_name(job.name))] + [
                ("Pod", names.pod_name(job.name, attempt=job_status.attempt, node_rank=rank))
                for rank in range(job_status.replicas or 0)
            ]
            for kind, name in wanted:
                found = None if name in taken else self.kube.get(kind, job.namespace, name)
                if found is not None and not observe.owned_by(found, job):
                    conflicts.append(observe.conflict(found, job))
        pods = [v for p in ours if (v := observe.pod_view(p)) is not None]
        return pods, conflicts

    # --- apply ----------------------------------------------------------------------------------
    def apply(
        self, body: dict[str, Any], obs: observed.Observed, d: decide.Decision
    ) -> decide.Decision:
        """The decision's side effects, in the order that makes a pass cut short anywhere safe
        to finish by the next: what must be asked first, status, quarantine, deletes, creates,
        Events. Returns the decision as carried out (with what was asked)."""
        job = names.JobRef.of(body)
        d = self._ask(job, d)
        self._write_status(job, obs, d)
        base = checkpoints.storage_for(job, obs.spec, self.settings.storage_template)
        for path in d.quarantine:
            if base is not None:
                step = int(path.rsplit("-", 1)[-1])
                try:
                    catalog.quarantine(catalog.LocalStorage(base), ".", step)
                except catalog.CatalogError as exc:
                    log.warning("quarantine of %s failed: %s", path, exc)
        list(
            self._writers.map(
                lambda rm: self.kube.delete_pod(job.namespace, rm.name, grace=rm.grace_seconds),
                d.delete,
            )
        )
        for group in d.release:
            self.kube.delete_workload(job.namespace, group)
        if d.launch is not None:
            self._create_gang(job, obs.spec, d.launch, obs.profile)
        self._spares(job, obs, d)
        for ev in d.events:
            self.kube.event(job, type_=ev.type.value, reason=ev.reason, message=ev.message)
        recording.record(job=job, obs=obs, decision=d)
        if d.delete_job:
            self.kube.delete_job(job.namespace, job.name)
        return d

    def _ask(self, job: names.JobRef, d: decide.Decision) -> decide.Decision:
        """Before the status is written: the failed attempt's evidence, read before its pods
        are deleted; and the keepers' word on a spare takeover. A pass cut short after the
        keepers took it and before the write is repeated by the next pass, whose word they
        refuse (the spare already holds the place): the gang is then recreated, as when
        refused now."""
        if d.collect is not None and d.status.last_failure is not None:
            better = evidence.collect_and_keep(
                self.kube, job, d.collect, d.status.last_failure, self._writers
            )
            d = failure.explained(d, better)
        t = d.takeover
        if t is not None:
            refused = _promote(t) if t.node_rank == 0 else _replace(t)
            if refused:
                log.warning("%s: spare takeover of %s refused: %s", job.name, t.lost, refused)
                d = spares.refused(d, refused)
        return d

    def _write_status(self, job: names.JobRef, obs: observed.Observed, d: decide.Decision) -> None:
        """The pass's one status write, and only when it changed anything."""
        new_status = d.status.model_dump(mode="json", by_alias=True)
        if new_status == obs.status.model_dump(mode="json", by_alias=True):
            return
        written = self.kube.patch_status(job.namespace, job.name, new_status)
        self._written[(job.namespace, job.name)] = d.status
        if written:
            self._own_writes[(job.namespace, job.name)] = written

    def _create_gang(
        self,
        job: names.JobRef,
        spec: api.FSDPJobSpec,
        launch: decide.Launch,
        profile: api.RuntimeProfileSpec | None,
    ) -> None:
        """The Service, then the attempt's pods, all at once (a 64-node gang is up in about the
        time of one create); none if a name is someone else's.

        A 409 is success only when the object there is controlled by this job's uid. Otherwise
        it is never adopted, and the pods this call did create are deleted again: no pod of the
        job waits while someone else holds one of its names. The next pass sees the conflict,
        creates nothing and says so in a condition.
        """
        pods = templates.worker_pods(
            job, spec, launch, worker_module=self.settings.worker_module, profile=profile
        )
        if self._held_by_another(job, templates.service(job=job, spec=spec)):
            return
        held = list(self._writers.map(lambda pod: self._held_by_another(job, pod), pods))
        if any(held):
            made = [pod for pod, h in zip(pods, held, strict=True) if h is None]
            list(
                self._writers.map(
                    lambda pod: self.kube.delete_pod(
                        job.namespace, pod["metadata"]["name"], grace=0
                    ),
                    made,
                )
            )
            return  # a name is someone else's: the next pass looks it up and reports it
        with self._created_lock:
            now = self._clock()
            stale = [k for k, t in self._created_at.items() if now - t > 2 * decide.EXPECT_SECONDS]
            for key in stale:
                del self._created_at[key]
            self._created_at[(job.uid, launch.attempt)] = now

    def _spares(self, job: names.JobRef, obs: observed.Observed, d: decide.Decision) -> None:
        """spec.spares' new pods (a name someone else holds is skipped: the next pass makes
        another number), and a spare's takeover of a lost node's place."""
        if d.takeover is not None:
            self._hand_over(job, d.takeover)
        if not d.spares or d.spare_launch is None:
            return
        launch = d.spare_launch
        pods = [
            templates.spare_pod(
                job,
                obs.spec,
                launch,
                index=i,
                worker_module=self.settings.worker_module,
                profile=obs.profile,
            )
            for i in d.spares
        ]
        list(self._writers.map(lambda pod: self._held_by_another(job, pod), pods))

    def _hand_over(self, job: names.JobRef, t: decide.Takeover) -> None:
        """The keepers took the takeover (_ask): the spare carries the lost pod's node rank
        from now on, and the lost pod goes."""
        labels: dict[str, str | None] = {
            names.Label.NODE_RANK.value: str(t.node_rank),
            names.Label.SPARE.value: None,
        }
        self.kube.label_pod(job.namespace, t.spare, labels)
        self.kube.delete_pod(job.namespace, t.lost, grace=0)

    def _held_by_another(self, job: names.JobRef, obj: dict[str, Any]) -> bool | None:
        """Create `obj`: None when this call created it, False when the job already had it (a
        409 on its own object), True when someone else holds the name."""
        existing = self.kube.create(obj)
        if existing is None:
            return None
        if observe.owned_by(existing, job):
            return False
        log.warning(
            "%s: not creating the gang: %s", job.name, observe.conflict(existing, job).describe()
        )
        return True

    def _report_error(
        self, body: dict[str, Any], exc: Exception, *, written: status.FSDPJobStatus | None
    ) -> None:
        """A pass that raised: a Warning Event (at most one a minute) and a condition saying
        why, added to the conditions the job has now (`written`: what this pass wrote before it
        failed; else what it read)."""
        job = names.JobRef.of(body)
        now = self._clock()
        message = kube.describe_error(exc)
        key = (job.namespace, job.name)
        if now - self._error_events.get(key, float("-inf")) >= ERROR_EVENT_SECONDS:
            self._error_events[key] = now
            self.kube.event(job, type_="Warning", reason=decide.RECONCILE_ERROR, message=message)
        job_status = written if written is not None else observe.status_of(body.get("status"))
        if any(
            c.type == decide.RECONCILE_ERROR and c.message == message for c in job_status.conditions
        ):
            return
        cond = status.Condition(
            type=decide.RECONCILE_ERROR,
            status="True",
            reason=type(exc).__name__,
            message=message,
            last_transition_time=decide.stamp(now),
            observed_generation=body["metadata"].get("generation"),
        )
        conditions = [c for c in job_status.conditions if c.type != decide.RECONCILE_ERROR]
        patch = {
            "conditions": [c.model_dump(mode="json", by_alias=True) for c in [*conditions, cond]]
        }
        self.kube.patch_status(job.namespace, job.name, patch)

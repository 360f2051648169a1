"""A pass's observation of one job: everything decide() reads, gathered from the job as just
read, the watches' caches (pods, nodes, rank 0's progress), checkpoint storage and, only when
the answer matters, a few GETs (a runtime profile, a name someone else may hold, Kueue's
Workload) and a word with the gang's coordinator.

No LIST call: a pass of a 64-node gang must cost the API server next to nothing. Reads only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from fsdp_operator.io import cache, checkpoints, gang, kube, observe, reports
from fsdp_operator.policy import deadlines, decide
from fsdp_operator.run import keepers, settings, specs
from fsdp_operator.types import api, names, observed, queueing, status

CreatedAt = Callable[[str, int], float | None]
"""When this process created a job's (uid) attempt's pods; None if it did not (lately)."""


def rank0(
    pods: list[observed.PodView], job_status: status.FSDPJobStatus
) -> observed.PodView | None:
    """Rank 0 of the current attempt while its endpoint is worth reading (running, no pod of
    the attempt failing: a failure is being handled, its progress is history)."""
    current = [p for p in pods if p.attempt == job_status.attempt]
    if any(p.phase is observed.PodPhase.FAILED or p.deleting for p in current):
        return None
    first = next((p for p in current if p.rank == 0), None)
    if first is None or first.phase is not observed.PodPhase.RUNNING or not first.ip:
        return None
    return first


def _progress(
    pods: list[observed.PodView], job_status: status.FSDPJobStatus, view: cache.View
) -> observed.Progress | None:
    """The progress the scraper read, only if it is this rank 0's (not a replaced pod's)."""
    first = rank0(pods, job_status)
    if first is None or view.progress_pod != first.name:
        return None
    return view.progress


def _scrape(
    pods: list[observed.PodView], job_status: status.FSDPJobStatus, view: cache.View
) -> observed.ScrapeHealth | None:
    """How the scrapes of this rank 0 went (not a replaced pod's)."""
    first = rank0(pods, job_status)
    if first is None or view.scrape is None or view.scrape.pod != first.name:
        return None
    return view.scrape


class Gatherer:
    """Makes a pass's `Observed` (any thread; it keeps nothing between passes but how long each
    gang coordinator has been late, keepers.Lateness)."""

    def __init__(
        self,
        api_access: kube.Kube,
        config: settings.Settings,
        *,
        created_at: CreatedAt,
        gang_client: gang.GangClient,
    ) -> None:
        self.kube = api_access
        self.gang_client = gang_client
        self.lateness = keepers.Lateness()
        self.settings = config
        self._created_at = created_at

    def gather(self, body: dict[str, Any], now: float, view: cache.View) -> observed.Observed:
        """The pass's observation: the job as just read, its pods and the nodes from the
        watches' caches (`view`), its checkpoints from storage. No LIST call."""
        meta = body["metadata"]
        job = names.JobRef.of(body)
        job_status = observe.status_of(body.get("status"))
        generation = meta.get("generation", 0)
        spec, error, profile = specs.check_spec(body, job, self._profile)
        if spec is None:  # no spec to reason about: fail with the reason, touch nothing
            return _unparsed(job_status, generation=generation, now=now, error=error)
        error, validated = self._validated(
            job,
            spec=spec,
            job_status=job_status,
            generation=generation,
            error=error,
            profile=profile,
        )
        created_at = self._created_at(job.uid, job_status.attempt)
        just = created_at is not None and now - created_at < decide.EXPECT_SECONDS
        pods, conflicts = self._owned_pods(job, job_status, view.pods, just_created=just)
        base = checkpoints.storage_for(job, spec, self.settings.storage_template)
        found = checkpoints.newest(job, spec, job_status, base, deep=self.settings.deep_verify)
        queue, error = _queue(job, meta, spec=spec, error=error)
        workers = [p for p in pods if p.spare is None]
        obs = observed.Observed(
            spec=spec,
            status=job_status,
            generation=generation,
            now=now,
            pods=workers,
            nodes=_nodes(job, spec, view),
            checkpoint=found.newest,
            corrupt_checkpoints=found.corrupt,
            checkpoints_visible=found.visible,
            checkpoint_dir=names.checkpoint_dir(spec.checkpoint.location, job.name),
            progress=_progress(workers, job_status, view),
            scrape=_scrape(workers, job_status, view),
            spec_error=error,
            created=observe.ts(meta.get("creationTimestamp")),
            conflicts=[*conflicts, *found.conflicts],
            validated_generation=validated,
            created_at=created_at,
            profile=profile,
            queue=queue,
            admission=self._admission(job, job_status, workers),
            spares=[p for p in pods if p.spare is not None],
            resume_rules=reports.resume_rules(job_status.resume_rules),
            claim=self._claim(job, spec, _current(workers, job_status)),
        )
        asker = keepers.Asker(self.gang_client, job.uid, job_status.attempt)
        return _with_gang(obs, asker, self.lateness)

    def _validated(
        self,
        job: names.JobRef,
        *,
        spec: api.FSDPJobSpec,
        job_status: status.FSDPJobStatus,
        generation: int,
        error: str,
        profile: api.RuntimeProfileSpec | None,
    ) -> tuple[str, int | None]:
        """The spec's error, and the generation the API server's dry run admitted: asked once
        per generation of the spec (a refusal leaves it unadmitted, so the next pass asks
        again), never for a finished job."""
        validated = job_status.validated_generation
        if not error and validated != generation and job_status.phase not in status.TERMINAL_PHASES:
            error = specs.dry_run(
                self.kube,
                job,
                spec=spec,
                attempt=job_status.attempt,
                profile=profile,
                worker_module=self.settings.worker_module,
            )
            validated = None if error else generation
        return error, validated

    def _profile(self, name: str) -> api.RuntimeProfileSpec | None:
        """specs.check_spec's way to read a runtime profile: from the API server, now."""
        return specs.profile_of(self.kube, name)

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

    def _claim(
        self, job: names.JobRef, spec: api.FSDPJobSpec, pods: list[observed.PodView]
    ) -> observed.ClaimView | None:
        """checkpoint.claimName's claim, read (one GET) only while pods of a multi-pod gang
        wait on their nodes: a claim not ReadWriteMany cannot be attached on all of them."""
        name = spec.checkpoint.claim_name
        waiting = [p for p in pods if p.node and p.phase is observed.PodPhase.PENDING]
        if name is None or len(pods) < 2 or not waiting:
            return None
        return observe.claim_view(name, self.kube.get_claim(job.namespace, name))

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


def _current(pods: list[observed.PodView], s: status.FSDPJobStatus) -> list[observed.PodView]:
    """The current attempt's pods."""
    return [p for p in pods if p.attempt == s.attempt]


def _nodes(job: names.JobRef, spec: api.FSDPJobSpec, view: cache.View) -> observed.NodeIndex:
    """The nodes as this job sees them: what other pods use of them is taken, its own is not
    (its pods' room is its own to reuse)."""
    own = [p for p in view.pods if observe.owned_by(p, job)]
    return observe.node_views(
        view.nodes,
        spec=spec,
        used=cache.without(view.used, own),
        lease_lost=view.lease_lost,
        lease_quiet=view.lease_quiet,
        lease_renewed=view.lease_renewed,
    )


def _queue(
    job: names.JobRef, meta: dict[str, Any], *, spec: api.FSDPJobSpec, error: str
) -> tuple[queueing.Queue | None, str]:
    """The Kueue queue the job names, if any, and the spec's error: a queued job may not ask
    for spares (Kueue admits the attempt's pod group, and a spare is not in it)."""
    queue = queueing.Queue.of(
        job.name,
        meta.get("labels"),
        spec.template.metadata.labels,
        annotations=meta.get("annotations"),
    )
    if queue is not None and not error:
        error = queueing.spares_refusal(queue, spec.spares)
    return queue, error


def _unparsed(
    job_status: status.FSDPJobStatus, *, generation: int, now: float, error: str
) -> observed.Observed:
    """What a pass knows of a job whose spec does not parse: only why (the job fails saying
    so), with a stand-in spec so that decide() has one to read."""
    spec = api.FSDPJobSpec(replicas=1, image="invalid")
    return observed.Observed(
        spec=spec, status=job_status, generation=generation, now=now, spec_error=error
    )


def _with_gang(
    obs: observed.Observed, asker: keepers.Asker, lateness: keepers.Lateness
) -> observed.Observed:
    """The observation with the gang coordinator's answer, asked only when a hang's grace
    depends on it (deadlines.asks_the_gang): a pass does not talk to keepers otherwise."""
    coordinator = deadlines.asks_the_gang(obs)
    if coordinator is None:
        return obs
    health = keepers.gang_health(asker, coordinator, lateness=lateness, now=obs.now)
    return dataclasses.replace(obs, gang=health)

"""One reconcile pass for one FSDPJob: observe -> decide -> apply, with one status write.

Blocking (loops.py runs it in a thread). The order of side effects is what makes the operator
restart-safe: the status (the operator's memory) is written first, then pods are deleted and
created, so a pass cut short anywhere is finished by the next one without duplicate pods. What
a pass must ask before it writes (a failed gang's logs, a spare takeover's keepers) is asked
first, and its answer goes out in that one status write (failure.explained, spares.refused).

`Reconciler` owns what the passes of one process share: the API access, the settings, the
writer pool, this process's own status writes, when it created each gang and when it last said
that a job's pass failed. Nothing is kept in module globals: two Reconcilers share nothing.
Beside it, each part of a pass in its own module: the observation (gather.py, with specs.py
for whether the spec can run), the keepers' word (keepers.py), a failed gang's evidence
(evidence.py), the object writes after the status write (objects.py) and the metrics
(recording.py). This module keeps the order they run in, the status write and error reports.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import time
from collections.abc import Callable
from typing import Any

from fsdp_operator.io import cache, gang, kube, metrics, observe, probe
from fsdp_operator.policy import decide, failure, spares
from fsdp_operator.run import evidence, gather, keepers, objects, recording, settings
from fsdp_operator.types import names, observed, status

log = logging.getLogger(__name__)
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


def _probe_target(
    obs: observed.Observed, d: decide.Decision, *, max_interval: float, job_uid: str | None
) -> probe.Target | None:
    """Rank 0's endpoint for the scraper, and how often: none for a finished job or while no
    rank 0 is worth reading."""
    rank0 = gather.rank0(list(obs.pods), d.status)
    if rank0 is None or rank0.ip is None or d.status.phase in status.TERMINAL_PHASES:
        return None
    entry = d.status.history[-1] if d.status.history else None
    starting = (
        entry is not None and entry.timeline is not None and not status.complete(entry.timeline)
    )
    policy = obs.spec.failure_policy
    every = probe.interval_for(policy.progress_deadline_seconds, max_interval)
    if policy.swap_slow_nodes and obs.spec.spares:
        every = min(every, probe.SWAP_WATCH_INTERVAL)  # rank 0's slow-rank verdicts, promptly
    if any((n := obs.node(p.node)) is not None and n.lease_quiet for p in obs.pods if p.node):
        # A node of the gang missed a Lease renewal: whether training goes on decides if it is
        # lost (detect.py), so rank 0's step is read now and every second.
        every = probe.SUSPECT_INTERVAL
    uid = str(job_uid or "")
    in_place = obs.spec.failure_policy.in_place_restarts > 0 and uid
    gang = probe.Gang(uid, d.status.attempt) if in_place else None
    return probe.Target(pod=rank0.name, ip=rank0.ip, every=every, starting=starting, gang=gang)


def _wants_nodes(obs: observed.Observed, d: decide.Decision) -> bool:
    """Whether node changes anywhere may let the job start, or grow back to its replicas."""
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
        gang_client: gang.GangClient | None = None,
    ) -> None:
        """`writers`: deletes and creates of one pass go out together on this many threads
        (urllib3's pool holds 32 connections). `gang_client`: what the keepers are asked
        with (None: unsigned, as keepers without a key file accept)."""
        self.kube = api_access
        self.gang_client = gang_client if gang_client is not None else gang.GangClient(None)
        self.settings = config
        self._clock = clock
        self._writers = concurrent.futures.ThreadPoolExecutor(
            writers, thread_name_prefix="fsdpop-write"
        )
        self._own_writes: dict[Key, str] = {}
        """(namespace, job) -> the resourceVersion this process's last status write produced:
        the watch event it causes wakes nobody (the pass that wrote it said when to look)."""
        self._gang_times = objects.GangTimes(clock)
        """When this process created each gang: written by its creates, read by the passes
        after (a name it has just created is its own, not a conflict)."""
        self._gatherer = gather.Gatherer(
            api_access, config, created_at=self._gang_times.of, gang_client=self.gang_client
        )
        self._objects = objects.ObjectWriter(
            api_access,
            config,
            pool=self._writers,
            gang_times=self._gang_times,
            gang_client=self.gang_client,
        )
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
            obs,
            decision,
            max_interval=self.settings.scrape_max_interval_seconds,
            job_uid=body["metadata"].get("uid"),
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
        """The pass's observation (gather.py): no LIST call, and no write."""
        return self._gatherer.gather(body, now, view)

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
        self._objects.write(job, obs, d)
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
        if d.collect is not None and d.collect.told is not None:  # not the job's failure
            evidence.collect_and_keep(self.kube, job, d.collect, d.collect.told, self._writers)
        elif d.collect is not None and d.status.last_failure is not None:
            better = evidence.collect_and_keep(
                self.kube, job, d.collect, d.status.last_failure, self._writers
            )
            d = failure.explained(d, better)
        t = d.takeover
        if t is not None:
            asker = keepers.Asker(self.gang_client, job.uid, d.status.attempt)
            refused = keepers.take_over(asker, t)
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

"""A decision's object writes, after its status write: checkpoints quarantined, pods deleted,
Kueue Workloads released, the gang and its spares created, a spare's takeover handed over.

In this order, so a pass cut short anywhere is finished by the next without duplicate pods.
Deletes and creates of one pass go out together on the Reconciler's writer pool (a 64-node gang
is up in about the time of one create). Nothing here asks before it writes: what a write
depends on was asked, and written in the status, before (reconcile.py).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from fsdp_operator.io import checkpoints, gang, kube, observe, podgroups
from fsdp_operator.policy import decide
from fsdp_operator.policy import podgroups as podgroup_plan
from fsdp_operator.render import netpol, podgroup, templates
from fsdp_operator.run import settings
from fsdp_operator.types import api, names, observed, spec_gang
from fsdp_worker.contract import catalog

log = logging.getLogger(__name__)
T = TypeVar("T")


class GangTimes:
    """When this process created each attempt's pods, so the next passes know a name it just
    created is its own (in memory only: after a restart the operator creates what it does not
    see; a 409 says they exist). Written from the writer threads, read by passes: locked."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._at: dict[tuple[str, int], float] = {}
        """(job uid, attempt) -> when this process created that attempt's pods."""
        self._lock = threading.Lock()

    def of(self, uid: str, attempt: int) -> float | None:
        """When this process created the attempt's pods; None if it did not (lately)."""
        with self._lock:
            return self._at.get((uid, attempt))

    def mark(self, uid: str, attempt: int) -> None:
        """The attempt's pods were created now; times too old to matter are dropped, so the
        map holds only the gangs still being waited for."""
        with self._lock:
            now = self._clock()
            stale = [k for k, t in self._at.items() if now - t > 2 * decide.EXPECT_SECONDS]
            for key in stale:
                del self._at[key]
            self._at[(uid, attempt)] = now


class ObjectWriter:
    """The object writes of a Decision (any thread; the pool and GangTimes are shared)."""

    def __init__(
        self,
        api_access: kube.Kube,
        config: settings.Settings,
        *,
        pool: concurrent.futures.ThreadPoolExecutor,
        gang_times: GangTimes,
        gang_client: gang.GangClient,
    ) -> None:
        self.kube = api_access
        self.settings = config
        self._pool = pool
        self._gang_times = gang_times
        self._gang_client = gang_client

    def write(self, job: names.JobRef, obs: observed.Observed, d: decide.Decision) -> None:
        """Everything the decision changes but the status and its Events, in the safe order."""
        self._quarantine(job, obs.spec, d.quarantine)
        self._each(
            lambda rm: self.kube.delete_pod(job.namespace, rm.name, grace=rm.grace_seconds),
            d.delete,
        )
        for group in d.release:
            self.kube.delete_workload(job.namespace, group)
        if d.launch is not None:
            self._create_gang(job, obs.spec, d.launch, obs.profile)
        self._spares(job, obs, d)

    def _each(self, write: Callable[[T], object], items: Iterable[T]) -> None:
        """`write` each item together on the pool; returns when all are done."""
        list(self._pool.map(write, items))

    def _quarantine(self, job: names.JobRef, spec: api.FSDPJobSpec, paths: Iterable[str]) -> None:
        """Corrupt checkpoints set aside where the operator sees them (a failure is logged: the
        resume already skips them)."""
        base = checkpoints.storage_for(job, spec, self.settings.storage_template)
        for path in paths:
            if base is not None:
                step = int(path.rsplit("-", 1)[-1])
                try:
                    catalog.quarantine(catalog.LocalStorage(base), ".", step)
                except catalog.CatalogError as exc:
                    log.warning("quarantine of %s failed: %s", path, exc)

    def _create_gang(
        self,
        job: names.JobRef,
        spec: api.FSDPJobSpec,
        launch: decide.Launch,
        profile: api.RuntimeProfileSpec | None,
    ) -> None:
        """The Service, then the attempt's pods, all at once; none if a name is someone else's.

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
        self._guard_ports(job, pods[0]["metadata"]["labels"])
        self._create_gang_key(job, spec, launch.attempt)
        self._pod_group(job, spec, launch, profile)
        held = list(self._pool.map(lambda pod: self._held_by_another(job, pod), pods))
        if any(held):
            made = [pod for pod, h in zip(pods, held, strict=True) if h is None]
            self._each(
                lambda pod: self.kube.delete_pod(job.namespace, pod["metadata"]["name"], grace=0),
                made,
            )
            return  # a name is someone else's: the next pass looks it up and reports it
        self._gang_times.mark(job.uid, launch.attempt)

    def _guard_ports(self, job: names.JobRef, labels: Mapping[str, str]) -> None:
        """The job's NetworkPolicy over its gang's ports, before its pods (with the setting on).

        Whether the namespace's own policies already isolate the job's pods is judged again at
        each attempt's gang, and the job's policy brought in line (a tenant's default deny
        added since closes what the job's policy had left open). Unlike a Service's, a name
        someone else holds here does not stop the gang: policies only add, so a squatter's
        policy could have allowed the ports under any name anyway; the keepers' own
        authentication still holds. It is said in the log."""
        if not self.settings.network_policy:
            return
        operator = netpol.OperatorPeer(
            namespace=self.settings.operator_namespace, labels=self.settings.operator_pod_labels
        )
        others = self.kube.network_policies(job.namespace)
        isolated = netpol.isolated_by_others(job, others, labels)
        policy = netpol.network_policy(job, operator=operator, isolated=isolated)
        existing = self.kube.create(policy)
        if existing is None:
            return
        if not observe.owned_by(existing, job):
            why = observe.conflict(existing, job).describe()
            log.warning("%s: no NetworkPolicy of its own over its gang's ports: %s", job.name, why)
        elif existing.get("spec") != policy["spec"]:
            name = policy["metadata"]["name"]
            self.kube.patch_network_policy_spec(job.namespace, name, policy["spec"])

    def _create_gang_key(self, job: names.JobRef, spec: api.FSDPJobSpec, attempt: int) -> None:
        """With restarts in place: the attempt's gang key Secret, before its pods (they mount
        it). A 409 is taken as this job's own (a pass done again: the key is derived, the
        same): the operator may not read Secrets in a job's namespace to look. One made by
        someone else first (they can write Secrets there, and read ours anyway) leaves the
        keepers with a key the operator does not know: its takeovers are refused, and the
        gang is recreated, as without restarts in place."""
        key = self._gang_client.attempt_key(job.uid, attempt)
        if spec.failure_policy.in_place_restarts and key is not None:
            self.kube.create(
                templates.gang_key_secret(job=job, spec=spec, attempt=attempt, key=key)
            )

    def _pod_group(
        self,
        job: names.JobRef,
        spec: api.FSDPJobSpec,
        launch: decide.Launch,
        profile: api.RuntimeProfileSpec | None,
    ) -> None:
        """Under gangScheduling: the attempt's PodGroup, before its pods, and none of the
        job's older ones (policy/podgroups.py). MissingApi (no such CRD) or a PodGroupConflict
        fails the pass before any pod is made: the user reads why in a condition and an
        Event, and the next pass tries again."""
        gang = spec_gang.effective(spec, profile)
        if gang is None:
            return
        for kind in spec_gang.GangKind:
            if kind != gang.kind:
                self._drop_pod_groups(job, kind)
        wanted = podgroup.pod_group(
            job, spec, gang=gang, attempt=launch.attempt, members=launch.replicas
        )
        groups = podgroups.PodGroups(self.kube, gang.kind)
        found = groups.of_job(job)
        name = wanted["metadata"]["name"]
        existing = [_existing(obj, job) for obj in found]
        todo = podgroup_plan.plan(name=name, spec=wanted["spec"], existing=existing)
        if todo.conflict is not None:
            raise PodGroupConflict(job, found[existing.index(todo.conflict)])
        for stale in todo.delete:
            groups.delete(job.namespace, stale.name)
        if not todo.create:
            return
        held = groups.create(wanted)
        if held and not observe.owned_by(held, job):
            raise PodGroupConflict(job, held)

    def _drop_pod_groups(self, job: names.JobRef, kind: spec_gang.GangKind) -> None:
        """The job's own PodGroups of a scheduler `kind` it no longer uses, deleted. A cluster
        that does not serve that kind's CRD, or does not let the operator read it, has none of
        the operator's."""
        groups = podgroups.PodGroups(self.kube, kind)
        found = groups.of_job_if_served(job)
        for stale in podgroup_plan.leftovers([_existing(obj, job) for obj in found]):
            log.info("%s: deleting PodGroup %s of %s, no more its scheduler", job, stale.name, kind)
            groups.delete(job.namespace, stale.name)

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
        self._each(lambda pod: self._held_by_another(job, pod), pods)

    def _hand_over(self, job: names.JobRef, t: decide.Takeover) -> None:
        """The keepers took the takeover (asked before the status write): the spare carries the
        lost pod's node rank from now on, and the lost pod goes."""
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


class PodGroupConflict(RuntimeError):
    """The attempt's PodGroup name is held by an object the job does not control."""

    def __init__(self, job: names.JobRef, held: Mapping[str, Any]) -> None:
        super().__init__(
            f"{job.name}: not creating the gang beside a PodGroup that is not the job's:"
            f" {observe.conflict(held, job).describe()} (delete it, or rename the job)"
        )


def _existing(found: Mapping[str, Any], job: names.JobRef) -> podgroup_plan.Existing:
    """A PodGroup as read -> what the plan needs of it."""
    return podgroup_plan.Existing(
        name=str((found.get("metadata") or {}).get("name", "")),
        ours=observe.owned_by(found, job),
        spec=dict(found.get("spec") or {}),
    )

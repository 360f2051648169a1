"""Turn API objects (dicts) into the views decide() reads. Pure: no I/O, no clock reads.

Pod and node parsing follows what a kubelet reports: phase, container terminated state (exit
code, reason, termination message), DisruptionTarget, PodScheduled=Unschedulable, image errors,
and the node Ready condition with its transition time.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fsdp_operator.io import cache, reports
from fsdp_operator.types import api, kubetypes, names, observed, queueing, scrape, status
from fsdp_worker import contract

IMAGE_ERRORS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull"}
)


def ts(value: str | None) -> float | None:
    """RFC 3339 timestamp -> unix seconds."""
    if not value:
        return None
    return status.parse_rfc3339(value)


quantity = api.quantity


def _terminated(pod: Mapping[str, Any]) -> dict[str, Any]:
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        if cs.get("name") == names.CONTAINER_NAME:
            return dict((cs.get("state") or {}).get("terminated") or {})
    return {}


def _statuses(pod: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    return list(pod.get("status", {}).get(key) or [])


def _sidecars(pod: Mapping[str, Any]) -> tuple[observed.SidecarView, ...]:
    """The team's sidecars that restarted. Only the worker container's state decides a rank's
    failure (_terminated): a sidecar restarts in place (restartPolicy Always) and the pod's
    phase ignores it, so its crash, OOM kill or exit is told here and judged nowhere."""
    sidecars = {
        c.get("name")
        for c in pod.get("spec", {}).get("initContainers") or []
        if c.get("restartPolicy") == "Always"
    }
    views = []
    for cs in _statuses(pod, "initContainerStatuses"):
        if cs.get("name") not in sidecars or not cs.get("restartCount"):
            continue
        last = (cs.get("lastState") or {}).get("terminated") or {}
        views.append(
            observed.SidecarView(
                name=str(cs["name"]),
                restarts=int(cs["restartCount"]),
                reason=str(last.get("reason", "")),
                exit_code=last.get("exitCode"),
            )
        )
    return tuple(views)


def _init_failed(pod: Mapping[str, Any]) -> dict[str, Any]:
    """A plain init container that failed (the worker never started): what the failed pod is
    blamed on, in place of a worker's termination it never had."""
    for cs in _statuses(pod, "initContainerStatuses"):
        term = (cs.get("state") or {}).get("terminated") or {}
        if term and term.get("exitCode"):
            how = f"{term.get('reason') or 'Error'} (exit {term['exitCode']})"
            return {
                "reason": f"Init:{term.get('reason') or 'Error'}",
                "message": f"init container {cs.get('name')} failed: {how}; the worker never"
                " started",
                "finishedAt": term.get("finishedAt"),
            }
    return {}


def _waiting_reason(pod: Mapping[str, Any]) -> str:
    statuses = _statuses(pod, "initContainerStatuses") + _statuses(pod, "containerStatuses")
    for cs in statuses:
        reason = ((cs.get("state") or {}).get("waiting") or {}).get("reason", "")
        if reason in IMAGE_ERRORS:
            return str(reason)
    return ""


def _condition(obj: Mapping[str, Any], kind: str) -> dict[str, Any]:
    for cond in obj.get("status", {}).get("conditions") or []:
        if cond.get("type") == kind:
            return dict(cond)
    return {}


def _scheduler_message(scheduled: Mapping[str, Any]) -> str:
    """Why the scheduler has not placed the pod, in its words ("0/3 nodes are available: 3
    Insufficient nvidia.com/gpu", 'persistentvolumeclaim "x" not found'); "" once placed."""
    if scheduled.get("status") != "False":
        return ""
    return str(scheduled.get("message") or "")[: observed.SCHEDULER_MESSAGE_LIMIT]


def pod_view(pod: Mapping[str, Any]) -> observed.PodView | None:
    """None for pods without the operator's attempt/rank labels (not ours to judge)."""
    meta = pod.get("metadata", {})
    attempt = names.parse_attempt(meta.get("labels"))
    rank = names.parse_node_rank(meta.get("labels"))
    spare = names.parse_spare(meta.get("labels")) if rank is None else None
    if attempt is None or (rank is None and spare is None):
        return None
    phase = pod.get("status", {}).get("phase", "Pending")
    term = _terminated(pod) or (_init_failed(pod) if phase == "Failed" else {})
    scheduled = _condition(pod, "PodScheduled")
    ready = _condition(pod, "Ready")
    gates = pod.get("spec", {}).get("schedulingGates") or []
    message = str(term.get("message", ""))
    return observed.PodView(
        name=meta["name"],
        attempt=attempt,
        rank=rank if rank is not None else -1,
        spare=spare,
        phase=observed.PodPhase(phase)
        if phase in observed.PodPhase.__members__.values()
        else observed.PodPhase.UNKNOWN,
        node=pod.get("spec", {}).get("nodeName"),
        deleting=bool(meta.get("deletionTimestamp")),
        exit_code=term.get("exitCode"),
        reason=str(term.get("reason", "")),
        message=message,
        termination=reports.termination(message),
        finished=ts(term.get("finishedAt")),
        disrupted=_condition(pod, "DisruptionTarget").get("status") == "True",
        unschedulable=scheduled.get("reason") == "Unschedulable",
        scheduler_message=_scheduler_message(scheduled),
        image_error=_waiting_reason(pod),
        ip=pod.get("status", {}).get("podIP"),
        ready=None if not ready else ready.get("status") == "True",
        ready_changed=ts(ready.get("lastTransitionTime")),
        ready_reason=str(ready.get("reason") or ""),
        gated=any(g.get("name") == queueing.ADMISSION_GATE for g in gates),
        queue_evicted=queueing.eviction_words(_condition(pod, queueing.TERMINATION_TARGET)),
        sidecars=_sidecars(pod),
    )


def claim_view(name: str, claim: Mapping[str, Any] | None) -> observed.ClaimView | None:
    """A claim as kube.get_claim read it (None: there is none); None where it was unreadable."""
    if claim is None:
        return observed.ClaimView(name=name, found=False)
    if not claim:
        return None
    modes = (claim.get("spec") or {}).get("accessModes") or []
    return observed.ClaimView(name=name, found=True, access_modes=tuple(str(m) for m in modes))


def _tolerated(taint: Mapping[str, Any], tolerations: Sequence[kubetypes.Toleration]) -> bool:
    for tol in tolerations:
        if tol.operator == "Exists" and not tol.key:
            return True
        same = tol.key == taint.get("key") and tol.effect in ("", None, taint["effect"])
        if same and (tol.operator == "Exists" or tol.value == taint.get("value")):
            return True
    return False


@dataclasses.dataclass(frozen=True)
class _Needs:
    """What one worker pod of a job needs of a node, parsed once per pass (not once per node)."""

    selector: Mapping[str, str]
    tolerations: Sequence[kubetypes.Toleration]
    resources: tuple[tuple[str, float], ...]

    @classmethod
    def of(cls, spec: api.FSDPJobSpec) -> _Needs:
        wanted = {**(spec.resources.limits or {}), **(spec.resources.requests or {})}
        return cls(
            selector=dict(spec.template.spec.node_selector),
            tolerations=tuple(spec.template.spec.tolerations),
            resources=tuple((k, quantity(v)) for k, v in wanted.items()),
        )


def _fits(node: cache.NodeRecord, needs: _Needs, used: Mapping[str, float]) -> bool:
    labels = node.labels
    if any(labels.get(k) != v for k, v in needs.selector.items()):
        return False
    for taint in node.taints:
        hard = taint.get("effect") in ("NoSchedule", "NoExecute")
        if hard and not _tolerated(taint, needs.tolerations):
            return False
    alloc = node.allocatable
    return all(alloc.get(k, 0.0) - used.get(k, 0.0) >= value for k, value in needs.resources)


def node_record(node: Mapping[str, Any]) -> cache.NodeRecord:
    return cache.node_record(node, ts)


def node_views(
    nodes: Iterable[cache.NodeRecord],
    *,
    spec: api.FSDPJobSpec,
    used: Mapping[str, Mapping[str, float]],
    lease_lost: Mapping[str, float] | None = None,
    lease_quiet: frozenset[str] = frozenset(),
    lease_renewed: Mapping[str, tuple[float, float]] | None = None,
) -> observed.NodeIndex:
    """Nodes with readiness and whether one more worker of this job would fit there, each
    worked out when first read.

    `used` sums the requests of active pods NOT of this job: our own pods free their room on
    restart. `lease_lost`: the nodes lost by their Leases, with their silence (nodelease.py);
    `lease_renewed`: when each last renewed, and its renew period.
    """
    needs, nothing = _Needs.of(spec), dict[str, float]()
    records = {n.name: n for n in nodes}
    silent, renewed = lease_lost or {}, lease_renewed or {}

    def view(name: str) -> observed.NodeView:
        n = records[name]
        return observed.NodeView(
            name=n.name,
            ready=n.ready,
            not_ready_since=n.not_ready_since,
            schedulable=n.schedulable,
            fits=_fits(n, needs, used.get(n.name, nothing)),
            lease_silent_seconds=silent.get(n.name),
            lease_quiet=n.name in lease_quiet or n.name in silent,
            lease_renewed=renewed.get(n.name, (None, None))[0],
            lease_period=renewed.get(n.name, (None, None))[1],
        )

    return observed.NodeIndex(list(records), view)


def controller(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ownerReference marked controller, if any."""
    for ref in obj.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return dict(ref)
    return None


def owned_by(obj: Mapping[str, Any], job: names.JobRef) -> bool:
    """Controlled by this very FSDPJob object (its uid), not merely named or labelled for it."""
    ref = controller(obj)
    return ref is not None and ref.get("uid") == job.uid


def conflict(obj: Mapping[str, Any], job: names.JobRef) -> observed.Conflict:
    """Why `obj`, which carries this job's name or labels, is not the job's."""
    kind = str(obj.get("kind") or "object").lower()
    what = f"{kind} {obj.get('metadata', {}).get('name')}"
    ref = controller(obj)
    if ref is None:
        return observed.Conflict(observed.ConflictKind.FOREIGN, what, "no controller")
    owner = f"{ref.get('kind')} {ref.get('name')} uid {ref.get('uid')}"
    earlier = ref.get("kind") == job.kind and ref.get("name") == job.name
    kind_of = observed.ConflictKind.PREVIOUS_JOB if earlier else observed.ConflictKind.FOREIGN
    return observed.Conflict(
        kind_of, what, owner + (" (deleted: a same-named earlier job)" * earlier)
    )


def status_of(raw: Mapping[str, Any] | None) -> status.FSDPJobStatus:
    """Parse status leniently: fields we do not know (e.g. other tools') are ignored."""
    known = {f.alias or k for k, f in status.FSDPJobStatus.model_fields.items()}
    return status.FSDPJobStatus.model_validate({k: v for k, v in (raw or {}).items() if k in known})


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def progress_of(samples: scrape.Scrape) -> observed.Progress:
    """Rank 0's scraped samples (kube.scrape_metrics) -> what decisions read. Lenient: what a
    worker does not report (an older image) is None, never an error."""

    def num(name: str, **labels: str) -> float | None:
        value = samples.value(name, **labels)
        if value is None and not labels and name in contract.LEGACY_METRIC_NAMES:  # older kit
            value = samples.value(contract.LEGACY_METRIC_NAMES[name])
        return _finite(value)

    def whole(name: str) -> int | None:
        v = num(name)
        return int(v) if v is not None else None

    milestones = {}
    for m in contract.Milestone:
        at = num(contract.METRIC_MILESTONE, milestone=m.value)
        if at is not None and at > 0:
            milestones[m.value] = at
    interval = None
    steps = whole(contract.METRIC_INTERVAL)
    if steps is not None and steps >= 1:

        def given(key: contract.IntervalInput) -> float | None:
            return num(contract.METRIC_INTERVAL_INPUT, input=key.value)

        failures = given(contract.IntervalInput.FAILURES)
        mtbf = given(contract.IntervalInput.MTBF_SECONDS)
        interval = status.CheckpointInterval(
            steps=steps,
            auto=mtbf is not None,
            save_seconds=given(contract.IntervalInput.SAVE_SECONDS),
            step_seconds=given(contract.IntervalInput.STEP_SECONDS),
            mtbf_seconds=mtbf,
            failures=int(failures) if failures is not None else None,
        )
    memory = None
    memory_steps = whole(contract.METRIC_MEMORY_INTERVAL)
    if memory_steps is not None and memory_steps >= 1:
        in_memory = whole(contract.METRIC_MEMORY_STEP)
        memory = status.MemoryTier(
            interval_steps=memory_steps,
            save_seconds=num(contract.METRIC_MEMORY_SAVE_SECONDS),
            sealed_step=in_memory if in_memory is not None and in_memory > 0 else None,
        )
    sealed = whole(contract.METRIC_CKPT_STEP)
    slow = whole(contract.METRIC_SLOW_RANK)
    quarantined = sorted(
        int(step)
        for step, value in samples.by_label(contract.METRIC_QUARANTINED, "step").items()
        if step.isdigit() and value == 1
    )
    return observed.Progress(
        generation=max(0, whole(contract.METRIC_GENERATION) or 0),
        resumed_from_memory=whole(contract.METRIC_RESUMED_FROM_MEMORY) == 1,
        quarantined=tuple(quarantined),
        checkpoint_step=sealed if sealed is not None and sealed > 0 else None,
        # Set before the "loaded" milestone; until then the gauge reads its initial 0.
        resumed_from=whole(contract.METRIC_RESUMED_FROM) if "loaded" in milestones else None,
        step=whole(contract.METRIC_STEP),
        last_step_time=num(contract.METRIC_LAST_STEP_TIME),
        milestones=milestones,
        steps_run=whole(contract.METRIC_STEPS_RUN),
        train_seconds=num(contract.METRIC_STEP_SECONDS_SUM),
        blocked_seconds=num(contract.METRIC_CKPT_BLOCKED),
        interval=interval,
        memory=memory,
        slow_rank=slow if slow is not None and slow >= 0 else None,
        slowdown=num(contract.METRIC_SLOW_RANK_SLOWDOWN),
    )

"""One reconcile pass for one FSDPJob: observe -> decide -> apply, with one status write.

Blocking (the handlers run it in a thread). The order of side effects is what makes the operator
restart-safe: the status (the operator's memory) is written first, then pods are deleted and
created, so a pass cut short anywhere is finished by the next one without duplicate pods.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from typing import Any

import pydantic

from fsdp_operator import decide as dc
from fsdp_operator import kube as k8s
from fsdp_operator import metrics, names, observe, templates
from fsdp_operator import observed as ob
from fsdp_operator import settings as cfg
from fsdp_operator import spec as api
from fsdp_operator import status as st
from fsdp_worker import catalog

log = logging.getLogger(__name__)
_QUARANTINE = {
    catalog.RejectReason.BAD_MARKER,
    catalog.RejectReason.MANIFEST_MISMATCH,
    catalog.RejectReason.CHECKSUM_MISMATCH,
}


@dataclasses.dataclass(frozen=True)
class Context:
    kube: k8s.Kube
    settings: cfg.Settings


def _spec_error(body: dict[str, Any], job: names.JobRef) -> tuple[api.FSDPJobSpec | None, str]:
    """Parse the spec and dry-run templating: what the CRD cannot catch becomes a reason."""
    try:
        spec = api.FSDPJobSpec.model_validate(body.get("spec") or {})
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return None, f"spec.{where}: {first['msg']}"
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


def _checkpoints(
    job: names.JobRef, spec: api.FSDPJobSpec, status: st.FSDPJobStatus, base: str | None,
    *, deep: bool,
) -> tuple[st.CheckpointRef | None, list[str]]:  # fmt: skip
    if base is None or not os.path.isdir(base):
        return None, []
    storage = catalog.LocalStorage(base)
    lineage = catalog.Lineage(attempt=status.attempt, resumed_from_step=status.resumed_from_step)
    chosen, rejected = catalog.select(
        storage, ".", config_hash=spec.training.resume_hash(), lineage=lineage, deep=deep
    )
    for cand in rejected:
        log.info("checkpoint %s rejected: %s %s", cand.path, cand.reason, cand.detail)
    corrupt = [c.path for c in rejected if c.reason in _QUARANTINE]
    if chosen is None or chosen.marker is None:
        return None, corrupt
    m = chosen.marker
    in_pod = (
        f"{names.checkpoint_dir(spec.checkpoint.root, job.name)}/{catalog.step_dir_name(m.step)}"
    )
    ref = st.CheckpointRef(
        step=m.step, path=in_pod, attempt=m.attempt, world_size=m.world_size, time=m.time
    )
    return ref, corrupt


def _progress(
    pods: list[ob.PodView], status: st.FSDPJobStatus, timeout: float
) -> ob.Progress | None:
    current = [p for p in pods if p.attempt == status.attempt]
    if any(p.phase is ob.PodPhase.FAILED or p.deleting for p in current):
        return None  # a failure is being handled: never hold the pass on a dying endpoint
    rank0 = next((p for p in current if p.rank == 0), None)
    if rank0 is None or rank0.phase is not ob.PodPhase.RUNNING or not rank0.ip:
        return None
    got = k8s.scrape_progress(rank0.ip, timeout=timeout)
    return ob.Progress(step=got[0], last_step_time=got[1]) if got else None


def gather(ctx: Context, body: dict[str, Any], now: float) -> ob.Observed:
    meta = body["metadata"]
    job = names.JobRef.of(body)
    status = observe.status_of(body.get("status"))
    spec, error = _spec_error(body, job)
    if spec is None:  # no spec to reason about: fail with the reason, touch nothing
        spec = api.FSDPJobSpec(replicas=1, image="invalid")
        return ob.Observed(spec=spec, status=status, generation=meta.get("generation", 0),
                           now=now, spec_error=error)  # fmt: skip
    raw_pods = ctx.kube.list_job_pods(job.namespace, job.name)
    pods = [v for p in raw_pods if (v := observe.pod_view(p)) is not None]
    ours = {p["metadata"]["uid"] for p in raw_pods}
    others = [p for p in ctx.kube.list_active_pods() if p["metadata"]["uid"] not in ours]
    nodes = observe.node_views(ctx.kube.list_nodes(), spec=spec, other_pods=others)
    base = storage_for(job, spec, ctx.settings)
    ckpt, corrupt = _checkpoints(job, spec, status, base, deep=ctx.settings.deep_verify)
    return ob.Observed(
        spec=spec,
        status=status,
        generation=meta.get("generation", 0),
        now=now,
        pods=pods,
        nodes=nodes,
        checkpoint=ckpt,
        corrupt_checkpoints=corrupt,
        progress=_progress(pods, status, ctx.settings.scrape_timeout_seconds),
        spec_error=error,
        created=observe.ts(meta.get("creationTimestamp")),
    )


def apply(ctx: Context, body: dict[str, Any], obs: ob.Observed, d: dc.Decision) -> None:
    job = names.JobRef.of(body)
    kube = ctx.kube
    kube.patch_status(job.namespace, job.name, d.status.model_dump(mode="json", by_alias=True))
    base = storage_for(job, obs.spec, ctx.settings)
    for path in d.quarantine:
        if base is not None:
            step = int(path.rsplit("-", 1)[-1])
            try:
                catalog.quarantine(catalog.LocalStorage(base), ".", step)
            except catalog.CatalogError as exc:
                log.warning("quarantine of %s failed: %s", path, exc)
    for rm in d.delete:
        kube.delete_pod(job.namespace, rm.name, grace=rm.grace_seconds)
    if d.launch is not None:
        kube.create(templates.service(job=job, spec=obs.spec))
        for pod in templates.worker_pods(
            job=job, spec=obs.spec, attempt=d.launch.attempt, replicas=d.launch.replicas,
            resume_path=d.launch.resume_path, excluded_nodes=d.launch.excluded_nodes,
            worker_module=ctx.settings.worker_module,
        ):  # fmt: skip
            kube.create(pod)
    for ev in d.events:
        kube.event(job, type_=ev.type.value, reason=ev.reason, message=ev.message)
    metrics.record(job=job, obs=obs, decision=d)
    if d.delete_job:
        kube.delete_job(job.namespace, job.name)


def run_pass(ctx: Context, namespace: str, name: str) -> float | None:
    """One pass; returns seconds until the next one (None: the job is gone)."""
    body = ctx.kube.get_job(namespace, name)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    obs = gather(ctx, body, time.time())
    decision = dc.decide(obs, ctx.settings.tunables)
    apply(ctx, body, obs, decision)
    if decision.delete_job:
        return None
    return decision.requeue_after

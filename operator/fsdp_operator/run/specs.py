"""Whether a job's spec can run: parsed, its runtime profile read, rank 0's pod templated, and
(once per generation) that pod put to the API server as a dry run.

What the CRD cannot catch becomes a reason the user reads, naming the job's field. A refusal a
fixed cluster clears (a full quota, the operator's own RBAC) is no fault of the spec: it fails
the pass, which is retried, instead of failing the job. Reads only; writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pydantic

from fsdp_operator.io import kube
from fsdp_operator.policy import decide
from fsdp_operator.render import templates
from fsdp_operator.types import api, names

ProfileOf = Callable[[str], api.RuntimeProfileSpec | None]
"""A runtime profile's spec by name; None when there is none of that name."""

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


def first_launch(spec: api.FSDPJobSpec, attempt: int = 1) -> decide.Launch:
    """The launch templating is tried with before any attempt exists (validation, dry run)."""
    return decide.Launch(attempt=max(1, attempt), replicas=spec.replicas, resume_path="")


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


def profile_of(api_access: kube.Kube, name: str) -> api.RuntimeProfileSpec | None:
    """The runtime profile's spec as the API server has it now (one GET; profile jobs
    only). A revoked grant shows at the next pass, and the job fails naming it."""
    found = api_access.get_profile(name)
    if found is None:
        return None
    try:
        return api.FSDPRuntimeProfile.model_validate({"spec": found.get("spec") or {}}).spec
    except pydantic.ValidationError as exc:
        raise ValueError(f"spec.runtimeProfile={name!r}: the profile is invalid: {exc}") from exc


def dry_run(
    api_access: kube.Kube,
    job: names.JobRef,
    *,
    spec: api.FSDPJobSpec,
    attempt: int,
    profile: api.RuntimeProfileSpec | None,
    worker_module: str,
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
        worker_module=worker_module,
        profile=profile,
    )
    meta = pod["metadata"]
    meta["generateName"] = f"{meta.pop('name')}-dryrun-"
    refused = api_access.dry_run_pod(pod)
    if refused is None:
        return ""
    code, message = refused
    if code in (400, 403, 422) and not any(n in message for n in _NOT_THE_SPECS_FAULT):
        for pod_field, job_field in _POD_TO_JOB_FIELDS:
            message = message.replace(pod_field, job_field)
        return f"the API server refuses the worker pod ({code}): {message}"
    raise RuntimeError(f"dry run of the worker pod failed ({code}): {message}")

"""Pure templating: an FSDPJob spec in, the headless Service and worker pod dicts out.

Everything the operator creates is spelled here (the worker container in worker_container.py,
merging the user's volumes and affinity in podmerge.py), golden-tested, so a reviewer knows
what runs in the cluster. It must stay pure: no kubernetes client objects, no I/O, no clock
reads, no kopf, no torch. What the CRD cannot check (user volumes, env and affinity that would
break the operator's own settings) raises TemplateError naming the field.

Security choices, enforced here rather than left to the user's template:
- The worker command is an argument list for torchrun; nothing passes through a shell.
- Kubernetes expands `$(VAR)` in command, args and env values; `$$` is its escape for a literal
  `$`. Every `$` in those strings is doubled (worker_container.escape), so a user string such
  as a config value containing `$(HOME)` reaches the worker byte for byte.
- The Pod Security "restricted" profile (non-root uid 1000, RuntimeDefault seccomp, no
  privilege escalation, all capabilities dropped); no service-account token (workers hold no
  credentials) unless the job names its own ServiceAccount (`spec.serviceAccountName`, for
  workload identity); no service-link env vars.
- User labels/annotations under `fsdpoperator.io/` or on the operator's own keys are dropped
  (the operator's win). User env vars named `FSDP_*` never get here: the spec model (and the
  CRD) refuse them, since the worker reads that prefix.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from fsdp_operator.policy import decide
from fsdp_operator.render import podmerge, profilepod, worker_container
from fsdp_operator.types import api, names, queueing, spec_gang
from fsdp_worker import contract
from fsdp_worker.contract import config, keeper

JobRef = names.JobRef
DEFAULT_WORKER_MODULE = "fsdp_worker"  # the operator's --worker-module may name the stand-in
RUN_AS_ID = 1000
TemplateError = podmerge.TemplateError
# Rank 0's readiness probe, which a spare carries too (worker_container.py spells it).
progress_probe = worker_container.progress_probe


def owner_reference(job: JobRef) -> dict[str, Any]:
    """Makes the FSDPJob own a child, so deleting the job garbage-collects it."""
    return {
        "apiVersion": job.api_version,
        "kind": job.kind,
        "name": job.name,
        "uid": job.uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _user_keys(values: Mapping[str, str]) -> dict[str, str]:
    """The template's own keys, less the operator's and the Kueue keys it sets itself."""
    return {
        k: v
        for k, v in values.items()
        if not names.is_operator_key(k) and k not in queueing.KUEUE_KEYS
    }


def _labels(job: JobRef, spec: api.FSDPJobSpec, component: names.Component) -> dict[str, str]:
    return {
        **_user_keys(spec.template.metadata.labels),
        names.Label.APP_NAME.value: names.APP_NAME,
        names.Label.APP_INSTANCE.value: names.job_label_value(job.name),
        names.Label.APP_COMPONENT.value: component.value,
        names.Label.APP_MANAGED_BY.value: names.MANAGER,
        **names.selector_labels(job.name),
    }


def gang_key_secret(
    *, job: JobRef, spec: api.FSDPJobSpec, attempt: int, key: bytes
) -> dict[str, Any]:
    """The Secret of an in-place attempt's gang key (`key`, derived by the operator from its
    master key), which only that attempt's pods mount: the keepers sign what they say with
    it. Owned by the job (deleted with it); created before the attempt's pods."""
    labels = {**_labels(job, spec, names.Component.WORKER), names.Label.ATTEMPT.value: str(attempt)}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {
            "name": names.gang_key_name(job.name, attempt=attempt),
            "namespace": job.namespace,
            "labels": labels,
            "ownerReferences": [owner_reference(job)],
        },
        "immutable": True,
        "stringData": {podmerge.GANG_KEY_ITEM: key.hex()},
    }


def service(*, job: JobRef, spec: api.FSDPJobSpec) -> dict[str, Any]:
    """The headless Service giving every worker pod a DNS name (stable across attempts)."""
    ports = [
        {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"], "protocol": "TCP"}
        for p in worker_container.ports()
    ]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": names.service_name(job.name),
            "namespace": job.namespace,
            "labels": _labels(job, spec, names.Component.RENDEZVOUS),
            "ownerReferences": [owner_reference(job)],
        },
        "spec": {
            "clusterIP": "None",
            # Ranks resolve rank 0 before it is Ready (its probe says it stepped lately).
            "publishNotReadyAddresses": True,
            "selector": names.selector_labels(job.name),
            "ports": ports,
        },
    }


def worker_pods(
    job: JobRef,
    spec: api.FSDPJobSpec,
    launch: decide.Launch,
    *,
    cluster_domain: str = names.DEFAULT_CLUSTER_DOMAIN,
    worker_module: str = DEFAULT_WORKER_MODULE,
    profile: api.RuntimeProfileSpec | None = None,
) -> list[dict[str, Any]]:
    """Every rank's pod of one attempt, rank order."""
    return [
        worker_pod(
            job,
            spec,
            launch,
            node_rank=rank,
            cluster_domain=cluster_domain,
            worker_module=worker_module,
            profile=profile,
        )
        for rank in range(launch.replicas)
    ]


def spare_pod(
    job: JobRef,
    spec: api.FSDPJobSpec,
    launch: decide.Launch,
    *,
    index: int,
    cluster_domain: str = names.DEFAULT_CLUSTER_DOMAIN,
    worker_module: str = DEFAULT_WORKER_MODULE,
    profile: api.RuntimeProfileSpec | None = None,
) -> dict[str, Any]:
    """Warm spare `index` of `launch`'s attempt (spec.spares): a non-zero rank's pod (the
    same image, volumes, resources and anti-affinity, so another node), without a node rank:
    its keeper waits for the coordinator to give it a lost node's place, and torchrun's
    `--node-rank` is set then. It carries rank 0's readiness probe, as it may take node rank
    0's place; its keeper answers it while standing by (fsdp_worker.keeper.gang)."""
    pod = worker_pod(
        job,
        spec,
        launch,
        node_rank=min(1, launch.replicas - 1),
        cluster_domain=cluster_domain,
        worker_module=worker_module,
        profile=profile,
    )
    name = names.spare_pod_name(job.name, attempt=launch.attempt, index=index)
    meta, pod_spec = pod["metadata"], pod["spec"]
    meta["name"] = pod_spec["hostname"] = name
    del meta["labels"][names.Label.NODE_RANK.value]
    meta["labels"][names.Label.SPARE.value] = str(index)
    for key in spec_gang.MEMBER_KEYS if spec_gang.effective(spec, profile) else ():
        meta["labels"].pop(key, None)  # not a gang member: it waits for no PodGroup
        meta["annotations"].pop(key, None)
    (container,) = pod_spec["containers"]
    container.setdefault("readinessProbe", progress_probe(spec))
    for var in container["env"]:
        if var["name"] == contract.ENV_GANG:
            gang = keeper.Gang.from_env(var["value"])
            var["value"] = dataclasses.replace(gang, node=-1, spare=index).to_json()
    return pod


@dataclasses.dataclass(frozen=True)
class Slot:
    """One rank's place in one attempt: what every part of its pod is derived from."""

    job: JobRef
    spec: api.FSDPJobSpec
    attempt: int
    node_rank: int
    replicas: int
    resume_path: str
    cluster_domain: str
    worker_module: str = "fsdp_worker"
    reliability: str = ""  # FSDP_RELIABILITY, set only for intervalSteps: auto
    resume_rules: str = ""  # FSDP_RESUME_RULES, set only when the pods choose (auto)
    profile: api.RuntimeProfileSpec | None = None  # spec.runtimeProfile's, as read this pass
    queue: queueing.Queue | None = None  # Kueue's LocalQueue: the pods are one pod group
    pod_group: str = ""  # that group's name ("": a new one for this attempt)

    @property
    def world_size(self) -> int:
        return self.replicas * self.spec.nproc_per_node

    @property
    def pod_name(self) -> str:
        return names.pod_name(self.job.name, attempt=self.attempt, node_rank=self.node_rank)


def worker_pod(
    job: JobRef,
    spec: api.FSDPJobSpec,
    launch: decide.Launch,
    *,
    node_rank: int,
    cluster_domain: str = names.DEFAULT_CLUSTER_DOMAIN,
    worker_module: str = DEFAULT_WORKER_MODULE,
    profile: api.RuntimeProfileSpec | None = None,
) -> dict[str, Any]:
    """One worker pod of `launch`'s attempt: torchrun with a static node rank, restricted,
    owned by the job. Under `spec.runtimeProfile` (`profile` is that object's spec, None when
    it was not found) the pod gets what the profile adds and the capabilities the job asks."""
    if not re.fullmatch(config.FACTORY_PATTERN.split(":")[0] + "$", worker_module):
        raise TemplateError(f"worker module {worker_module!r} is not a dotted module name")
    slot = Slot(
        job=job,
        spec=spec,
        attempt=launch.attempt,
        node_rank=node_rank,
        replicas=launch.replicas,
        resume_path=launch.resume_path,
        cluster_domain=cluster_domain,
        worker_module=worker_module,
        reliability=launch.reliability,
        resume_rules=launch.resume_rules,
        profile=profile,
        queue=launch.queue,
        pod_group=launch.pod_group,
    )
    _check_shape(slot)
    _check_profile(slot)
    profilepod.check(spec, profile)
    overrides = spec.template.spec
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # torchrun forwards SIGTERM and waits; the worker saves before it exits
        "terminationGracePeriodSeconds": overrides.termination_grace_period_seconds,
        "hostname": slot.pod_name,
        "subdomain": names.service_name(job.name),
        "enableServiceLinks": False,
        **_identity(spec),
        # torchrun must not be its PID namespace's init: an init ignores SIGTERM without a
        # handler, and torchrun has none while in rendezvous, so a pod deleted then hung until
        # its grace period ran out (seen on real kubelets). The sandbox's pause is init here.
        "shareProcessNamespace": True,
        "securityContext": _pod_security(spec),
        **_init_containers(spec, profile),
        "containers": [worker_container.render(slot)],
        "volumes": podmerge.volumes(spec, shm_size=profile.shm_size if profile else None)
        + profilepod.volumes(profile)
        + podmerge.gang_key_volumes(spec, name=names.gang_key_name(job.name, attempt=slot.attempt)),
        "affinity": podmerge.affinity(
            overrides.affinity,
            job_name=job.name,
            attempt=launch.attempt,
            excluded_nodes=launch.excluded_nodes,
        ),
    }
    optional = {
        "nodeSelector": dict(overrides.node_selector),
        "tolerations": [toleration.to_api() for toleration in overrides.tolerations],
        "priorityClassName": overrides.priority_class_name,
        "schedulerName": _scheduler(spec, profile),
        "runtimeClassName": profile.runtime_class_name if profile else None,
        "imagePullSecrets": _pull_secrets(spec, profile),
        "topologySpreadConstraints": [c.to_api() for c in overrides.topology_spread_constraints],
        "resourceClaims": [
            c.model_dump(by_alias=True, exclude_none=True) for c in overrides.resource_claims
        ],
    }
    pod_spec.update({key: value for key, value in optional.items() if value})
    pod_spec.update(profilepod.pod_fields(profile))
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _pod_metadata(slot), "spec": pod_spec}


def _scheduler(spec: api.FSDPJobSpec, profile: api.RuntimeProfileSpec | None) -> str | None:
    """The pods' scheduler: spec.gangScheduling's (its profile's) when set, else the
    template's (None: the cluster's default)."""
    gang = spec_gang.effective(spec, profile)
    template_scheduler = spec.template.spec.scheduler_name
    return gang.scheduler(template_scheduler) if gang is not None else template_scheduler


def _gang_member(slot: Slot, labels: dict[str, str], annotations: dict[str, str]) -> None:
    """Under gangScheduling, the keys that make the pod a member of its attempt's PodGroup
    (render/podgroup.py names it); a template's own such keys are dropped then."""
    gang = spec_gang.effective(slot.spec, slot.profile)
    if gang is None:
        return
    for key in spec_gang.MEMBER_KEYS:
        labels.pop(key, None)
        annotations.pop(key, None)
    group = names.pod_group(slot.job.name, attempt=slot.attempt)
    member_labels, member_annotations = gang.member_keys(group)
    labels.update(member_labels)
    annotations.update(member_annotations)


def _pod_security(spec: api.FSDPJobSpec) -> dict[str, Any]:
    """Pod Security "restricted": non-root, RuntimeDefault seccomp; uid, gid and fsGroup 1000
    unless the template sets its own (never 0: the model refuses it), with its groups."""
    own = spec.template.spec.security_context
    ids = {"runAsUser": RUN_AS_ID, "runAsGroup": RUN_AS_ID, "fsGroup": RUN_AS_ID}
    ids.update(own.to_api() if own is not None else {})
    ids.pop("runAsNonRoot", None)
    return {"runAsNonRoot": True, **ids, "seccompProfile": {"type": "RuntimeDefault"}}


def _init_containers(
    spec: api.FSDPJobSpec, profile: api.RuntimeProfileSpec | None
) -> dict[str, Any]:
    """The runtime profile's sidecars (the platform's part starts first), then the team's init
    containers and sidecars; none: no key (the goldens stay as they were)."""
    podmerge.check_init_mounts(spec)
    rendered = profilepod.sidecars(profile) + worker_container.init_containers(spec)
    return {"initContainers": rendered} if rendered else {}


def _pull_secrets(
    spec: api.FSDPJobSpec, profile: api.RuntimeProfileSpec | None
) -> list[dict[str, str]]:
    """The runtime profile's pull secrets, then the team's own (each once)."""
    given = [*(profile.image_pull_secrets if profile else [])]
    given += [s.name for s in spec.template.spec.image_pull_secrets]
    return [{"name": n} for n in dict.fromkeys(given)]


def _identity(spec: api.FSDPJobSpec) -> dict[str, Any]:
    """Who the pods are: the namespace's default account with no token mounted (workers hold
    no credentials), or the job's own ServiceAccount, whose automountServiceAccountToken then
    decides (workload identity injects its own token or asks the node's metadata server, so an
    admin may keep the API token off on the account)."""
    if spec.service_account_name is None:
        return {"automountServiceAccountToken": False}
    return {"serviceAccountName": spec.service_account_name}


def _check_profile(slot: Slot) -> None:
    """The job may use its runtime profile as asked (the admission policies say the same)."""
    name = slot.spec.runtime_profile
    if name is None:
        return
    if slot.profile is None:
        raise TemplateError(
            f"spec.runtimeProfile={name!r}: no {api.PROFILE_KIND} of that name (ask the cluster"
            f" admin; `kubectl get {api.PROFILE_PLURAL}` lists them)"
        )
    refused = slot.profile.refusal(slot.spec, namespace=slot.job.namespace, name=name)
    if refused:
        raise TemplateError(refused)


def _check_shape(slot: Slot) -> None:
    spec, replicas = slot.spec, slot.replicas
    if not 1 <= replicas <= spec.replicas:
        raise TemplateError(f"replicas={replicas} must be within 1..spec.replicas={spec.replicas}")
    if not 0 <= slot.node_rank < replicas:
        raise TemplateError(f"node_rank={slot.node_rank} must be within 0..{replicas - 1}")
    if not 0 <= slot.attempt <= names.MAX_ATTEMPT:
        raise TemplateError(f"attempt={slot.attempt} must be within 0..{names.MAX_ATTEMPT}")
    try:
        spec.training.accumulation_steps(slot.world_size)
    except ValueError as err:
        raise TemplateError(f"replicas={replicas}: {err}") from err


def _pod_metadata(slot: Slot) -> dict[str, Any]:
    job, spec = slot.job, slot.spec
    labels = {
        **_labels(job, spec, names.Component.WORKER),
        names.Label.ATTEMPT.value: str(slot.attempt),
        names.Label.NODE_RANK.value: str(slot.node_rank),
        names.Label.REPLICAS.value: str(slot.replicas),
        names.Label.WORLD_SIZE.value: str(slot.world_size),
    }
    if spec.runtime_profile is not None:
        labels[names.Label.RUNTIME_PROFILE.value] = spec.runtime_profile
    annotations = {
        **profilepod.pod_annotations(slot.profile, _user_keys(spec.template.metadata.annotations)),
        names.Annotation.RESUME_FROM.value: slot.resume_path,
        names.Annotation.RENDEZVOUS_ID.value: names.rendezvous_id(job, attempt=slot.attempt),
        names.Annotation.CONFIG_HASH.value: spec.training.resume_hash(),
    }
    if slot.queue is not None:
        queue_labels, queue_annotations = slot.queue.pod_keys(
            group=slot.pod_group or slot.queue.group(slot.attempt), count=slot.replicas
        )
        labels.update(queue_labels)
        annotations.update(queue_annotations)
    _gang_member(slot, labels, annotations)
    return {
        "name": slot.pod_name,
        "namespace": job.namespace,
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [owner_reference(job)],
    }

"""Pure templating: an FSDPJob spec in, the headless Service and worker pod dicts out.

Everything the operator creates is spelled here (merging the user's volumes and affinity lives
in podmerge.py), golden-tested, so a reviewer knows what runs in the cluster. It must stay
pure: no kubernetes client objects, no I/O, no clock reads, no kopf, no torch. What the CRD
cannot check (user volumes, env and affinity that would break the operator's own settings)
raises TemplateError naming the field.

Security choices, enforced here rather than left to the user's template:
- The worker command is an argument list for torchrun; nothing passes through a shell.
- Kubernetes expands `$(VAR)` in command, args and env values; `$$` is its escape for a literal
  `$`. Every `$` in those strings is doubled (see `escape`), so a user string such as a config
  value containing `$(HOME)` reaches the worker byte for byte.
- The Pod Security "restricted" profile (non-root uid 1000, RuntimeDefault seccomp, no
  privilege escalation, all capabilities dropped); no service-account token (workers hold no
  credentials); no service-link env vars.
- User labels/annotations under `fsdpoperator.io/` or on the operator's own keys are dropped
  (the operator's win). User env vars named `FSDP_*` never get here: the spec model (and the
  CRD) refuse them, since the worker reads that prefix.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping
from typing import Any

from fsdp_operator.policy import decide
from fsdp_operator.render import podmerge
from fsdp_operator.types import api, names, queueing
from fsdp_worker import contract
from fsdp_worker.contract import config

JobRef = names.JobRef
DEFAULT_WORKER_MODULE = "fsdp_worker"  # the operator's --worker-module may name the stand-in
GANG_MODULE = (
    "fsdp_worker.keeper.gang"  # the in-place keeper in front of torchrun (inPlaceRestarts)
)

RUN_AS_ID = 1000
OMP_NUM_THREADS = "OMP_NUM_THREADS"
# PyTorch's flight recorder (gloo and NCCL): the last collectives of each rank, which a rank's
# stall evidence dumps (flight.py). torchtitan turns it on by default the same way.
FLIGHT_RECORDER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FLIGHT_RECORDER_ENTRIES = "2000"


TemplateError = podmerge.TemplateError


def escape(value: str) -> str:
    """Double every `$` so Kubernetes' `$(VAR)` expansion yields `value` literally."""
    return value.replace("$", "$$")


def trainer_arg(arg: str) -> str:
    """A `spec.trainer.args` entry for the pod: its `$(NAME)` references (to the operator's
    variables, api.Trainer checked) stay for Kubernetes to expand; everything else is escaped."""
    return "".join(f"$({text})" if is_ref else escape(text) for text, is_ref in api.arg_parts(arg))


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


def _ports() -> list[dict[str, Any]]:
    return [
        {
            "name": names.RENDEZVOUS_PORT_NAME,
            "containerPort": names.RENDEZVOUS_PORT,
            "protocol": "TCP",
        },
        {"name": names.METRICS_PORT_NAME, "containerPort": names.METRICS_PORT, "protocol": "TCP"},
    ]


def _gang_port(spec: api.FSDPJobSpec) -> list[dict[str, Any]]:
    """The in-place keepers' coordinator (node rank 0's), with failurePolicy.inPlaceRestarts."""
    if not spec.failure_policy.in_place_restarts:
        return []
    return [{"name": names.GANG_PORT_NAME, "containerPort": names.GANG_PORT, "protocol": "TCP"}]


def progress_probe(spec: api.FSDPJobSpec) -> dict[str, Any]:
    """Rank 0's readiness probe: its /progress answer (contract.PROGRESS_PATH) says whether a
    step came within the progress deadline. The kubelet asks from rank 0's own node, which
    NetworkPolicies leave open, so the Ready condition carries the evidence of a hang where the
    operator's scrape is blocked (detect._hung). Asked every sixth of the deadline (1-30 s);
    two misses in a row: a hang shows at most a third of the deadline late. Before the first
    step the startup deadline applies."""
    deadline = spec.failure_policy.progress_deadline_seconds
    startup = spec.failure_policy.startup_deadline
    return {
        "httpGet": {
            "path": f"{contract.PROGRESS_PATH}?within={deadline}&startup={startup}",
            "port": names.METRICS_PORT_NAME,
        },
        "periodSeconds": max(1, min(30, deadline // 6)),
        "timeoutSeconds": 5,
        "failureThreshold": 2,
        "successThreshold": 1,
    }


def service(*, job: JobRef, spec: api.FSDPJobSpec) -> dict[str, Any]:
    """The headless Service giving every worker pod a DNS name (stable across attempts)."""
    ports = [
        {"name": p["name"], "port": p["containerPort"], "targetPort": p["name"], "protocol": "TCP"}
        for p in _ports()
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
    pod = worker_pod(job, spec, launch, node_rank=min(1, launch.replicas - 1),
                     cluster_domain=cluster_domain, worker_module=worker_module,
                     profile=profile)  # fmt: skip
    name = names.spare_pod_name(job.name, attempt=launch.attempt, index=index)
    meta, pod_spec = pod["metadata"], pod["spec"]
    meta["name"] = pod_spec["hostname"] = name
    del meta["labels"][names.Label.NODE_RANK.value]
    meta["labels"][names.Label.SPARE.value] = str(index)
    (container,) = pod_spec["containers"]
    container.setdefault("readinessProbe", progress_probe(spec))
    for var in container["env"]:
        if var["name"] == contract.ENV_GANG:
            gang = {**json.loads(var["value"]), "node": -1, "spare": index}
            var["value"] = json.dumps(gang, separators=(",", ":"))
    return pod


@dataclasses.dataclass(frozen=True)
class _Slot:
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
    slot = _Slot(
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
    overrides = spec.template.spec
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        # torchrun forwards SIGTERM and waits; the worker saves before it exits
        "terminationGracePeriodSeconds": overrides.termination_grace_period_seconds,
        "hostname": slot.pod_name,
        "subdomain": names.service_name(job.name),
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        # torchrun must not be its PID namespace's init: an init ignores SIGTERM without a
        # handler, and torchrun has none while in rendezvous, so a pod deleted then hung until
        # its grace period ran out (seen on real kubelets). The sandbox's pause is init here.
        "shareProcessNamespace": True,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": RUN_AS_ID,
            "runAsGroup": RUN_AS_ID,
            "fsGroup": RUN_AS_ID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [_container(slot)],
        "volumes": podmerge.volumes(spec, shm_size=profile.shm_size if profile else None),
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
        "schedulerName": overrides.scheduler_name,
        "runtimeClassName": profile.runtime_class_name if profile else None,
        "imagePullSecrets": [{"name": n} for n in profile.image_pull_secrets] if profile else [],
    }
    pod_spec.update({key: value for key, value in optional.items() if value})
    return {"apiVersion": "v1", "kind": "Pod", "metadata": _pod_metadata(slot), "spec": pod_spec}


def _check_profile(slot: _Slot) -> None:
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


def _check_shape(slot: _Slot) -> None:
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


def _pod_metadata(slot: _Slot) -> dict[str, Any]:
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
        **_user_keys(spec.template.metadata.annotations),
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
    return {
        "name": slot.pod_name,
        "namespace": job.namespace,
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [owner_reference(job)],
    }


def _command(slot: _Slot) -> list[str]:
    """The container's command: the operator's torchrun launch, then what it runs (the
    built-in trainer's module, or `spec.trainer`'s module or script and arguments), escaped
    for Kubernetes' `$(VAR)` expansion."""
    trainer = slot.spec.trainer
    keeper = ["python", "-m", GANG_MODULE] if slot.spec.failure_policy.in_place_restarts else []
    if trainer is None:
        return [escape(arg) for arg in [*keeper, *_launch(slot), "-m", slot.worker_module]]
    entry = ["-m", trainer.module] if trainer.module is not None else [str(trainer.script)]
    launch = [escape(arg) for arg in [*keeper, *_launch(slot), *entry]]
    return [*launch, *(trainer_arg(arg) for arg in trainer.args)]


def _launch(slot: _Slot) -> list[str]:
    """The torchrun argument list (unescaped); the operator's, whatever the trainer."""
    job, attempt = slot.job, slot.attempt
    endpoint = names.rank0_address(job, attempt=attempt, cluster_domain=slot.cluster_domain)
    return [
        "python",
        "-m",
        "torch.distributed.run",
        f"--nnodes={slot.replicas}",
        f"--nproc-per-node={slot.spec.nproc_per_node}",
        f"--node-rank={slot.node_rank}",
        "--rdzv-backend=static",
        # Static rendezvous takes the endpoint as rank 0's TCPStore (master) address.
        f"--rdzv-endpoint={endpoint}:{names.RENDEZVOUS_PORT}",
        f"--rdzv-id={names.rendezvous_id(job, attempt=attempt)}",
        "--max-restarts=0",  # the operator owns restarts
    ]


def _container(slot: _Slot) -> dict[str, Any]:
    spec = slot.spec
    resources = _resources(slot)
    probe = {"readinessProbe": progress_probe(spec)} if slot.node_rank == 0 else {}
    return {
        "name": names.CONTAINER_NAME,
        "image": spec.image,
        "command": _command(slot),
        "env": _env(slot),
        "ports": _ports() + _gang_port(spec),
        "resources": resources,
        "volumeMounts": podmerge.volume_mounts(spec),
        "terminationMessagePath": contract.DEFAULT_TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {
                "drop": ["ALL"],
                **({"add": sorted(caps)} if (caps := spec.template.spec.capabilities) else {}),
            },
            "readOnlyRootFilesystem": True,  # writes go to /tmp, /dev/shm and the volumes
        },
        **probe,
    }


def _resources(slot: _Slot) -> dict[str, Any]:
    """The job's resources, plus its profile's (RDMA devices, hugepages) in requests and limits
    (extended resources and hugepages need both, and equal); a job asking less gets less."""
    resources = slot.spec.resources.to_api()
    for part in ("requests", "limits"):  # `nvidia.com/gpu: 8` in YAML is a number: a quantity
        if isinstance(resources.get(part), dict):
            resources[part] = {k: str(v) for k, v in resources[part].items()}
    granted = slot.profile.resources if slot.profile else {}
    asked = {**resources.get("requests", {}), **resources.get("limits", {})}
    amounts = {k: str(asked.get(k, v)) for k, v in granted.items()}  # the job may ask less
    for part in ("requests", "limits") if granted else ():
        resources[part] = {**resources.get(part, {}), **amounts}
    return resources


def worker_config(spec: api.FSDPJobSpec) -> config.WorkerConfig:
    """The document every rank reads from FSDP_WORKER_CONFIG."""
    return config.WorkerConfig(training=spec.training, checkpoint=spec.checkpoint.worker_config())


def _env(slot: _Slot) -> list[dict[str, str]]:
    job, spec = slot.job, slot.spec
    user = spec.template.spec.env
    pairs = [
        (contract.ENV_CONTRACT_VERSION, str(contract.CONTRACT_VERSION)),
        (contract.ENV_JOB_NAME, job.name),
        (contract.ENV_JOB_NAMESPACE, job.namespace),
        (contract.ENV_JOB_UID, job.uid),
        (contract.ENV_ATTEMPT, str(slot.attempt)),
        (contract.ENV_CONFIG, worker_config(spec).to_json()),
        (contract.ENV_RESUME, slot.resume_path),
        (contract.ENV_CHECKPOINT_ROOT, names.checkpoint_dir(spec.checkpoint.root, slot.job.name)),
        (contract.ENV_CONFIG_HASH, spec.training.resume_hash()),
        (contract.ENV_METRICS_PORT, str(names.METRICS_PORT)),
        (contract.ENV_TERMINATION_LOG, contract.DEFAULT_TERMINATION_LOG),
        (contract.ENV_HANG_SECONDS, str(spec.failure_policy.progress_deadline_seconds)),
        (contract.ENV_STARTUP_SECONDS, str(spec.failure_policy.startup_deadline)),
    ]
    if slot.reliability:
        pairs.append((contract.ENV_RELIABILITY, slot.reliability))
    if restarts := spec.failure_policy.in_place_restarts:
        rank0 = names.rank0_address(job, attempt=slot.attempt, cluster_domain=slot.cluster_domain)
        gang = {
            "restarts": restarts,
            "coordinator": f"{rank0}:{names.GANG_PORT}",
            "node": slot.node_rank,
            "nodes": slot.replicas,
            "nonRetryable": list(spec.failure_policy.non_retryable_exit_codes),
        }
        pairs.append((contract.ENV_GANG, json.dumps(gang, separators=(",", ":"))))
    if spec.checkpoint.memory is not None:
        pairs.append((contract.ENV_MEMORY_ROOT, contract.MEMORY_MOUNT))
    if slot.resume_rules:
        pairs.append((contract.ENV_RESUME_RULES, slot.resume_rules))
    if all(var.name != OMP_NUM_THREADS for var in user):
        pairs.append((OMP_NUM_THREADS, omp_threads(spec)))
    if all(var.name not in FLIGHT_RECORDER_ENV for var in user):
        pairs.append((FLIGHT_RECORDER_ENV[0], FLIGHT_RECORDER_ENTRIES))
    own = {var.name for var in user}
    defaults = slot.profile.env if slot.profile else []  # the profile's (NCCL_*)
    pairs += [(var.name, var.value or "") for var in defaults if var.name not in own]
    env = [{"name": name, "value": escape(value)} for name, value in pairs]
    for var in user:
        entry = var.to_api()
        if var.value is not None:
            entry["value"] = escape(var.value)
        env.append(entry)
    return env


def omp_threads(spec: api.FSDPJobSpec) -> str:
    """OMP_NUM_THREADS per rank: the pod's CPUs split over its ranks, at least 1.

    Without it each rank would start one OpenMP thread per host core and oversubscribe shared
    nodes (torchrun only sets 1, and only for nprocPerNode > 1). A user env var wins.
    """
    raw = (spec.resources.limits or {}).get("cpu") or (spec.resources.requests or {}).get("cpu")
    if raw is None:
        return "1"
    return str(max(1, int(api.quantity(raw) // spec.nproc_per_node)))

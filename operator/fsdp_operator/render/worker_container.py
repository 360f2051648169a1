"""The worker container of every pod: torchrun's command (the in-place keeper in front of it),
the environment docs/contract.md promises a rank, its ports, rank 0's readiness probe, its
resources and its security context.

Apart from templates.py (the pod around it and the headless Service) because this is the part
a trainer sees: what it is started with and told. Pure as templates.py is: no kubernetes client
objects, no I/O, no clock reads, no kopf, no torch. Every `$` of a user's string is doubled
(`escape`) before Kubernetes' `$(VAR)` expansion sees it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fsdp_operator.render import podmerge
from fsdp_operator.types import api, names, spec_trainer
from fsdp_worker import contract
from fsdp_worker.contract import config, keeper

if TYPE_CHECKING:
    from fsdp_operator.render import templates

GANG_MODULE = (
    "fsdp_worker.keeper.gang"  # the in-place keeper in front of torchrun (inPlaceRestarts)
)

OMP_NUM_THREADS = "OMP_NUM_THREADS"
# PyTorch's flight recorder (gloo and NCCL): the last collectives of each rank, which a rank's
# stall evidence dumps (flight.py). torchtitan turns it on by default the same way.
FLIGHT_RECORDER_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
FLIGHT_RECORDER_ENTRIES = "2000"


def escape(value: str) -> str:
    """Double every `$` so Kubernetes' `$(VAR)` expansion yields `value` literally."""
    return value.replace("$", "$$")


def trainer_arg(arg: str) -> str:
    """A `spec.trainer.args` entry for the pod: its `$(NAME)` references (to the operator's
    variables, spec_trainer.Trainer checked) stay for Kubernetes to expand; everything else is
    escaped."""
    parts = spec_trainer.arg_parts(arg)
    return "".join(f"$({text})" if is_ref else escape(text) for text, is_ref in parts)


def ports() -> list[dict[str, Any]]:
    """The rendezvous and metrics ports of every worker container (the Service names them)."""
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


def _command(slot: templates.Slot) -> list[str]:
    """The container's command: the operator's torchrun launch, then what it runs (the
    built-in trainer's module, or `spec.trainer`'s module or script and arguments), escaped
    for Kubernetes' `$(VAR)` expansion."""
    trainer = slot.spec.trainer
    in_front = ["python", "-m", GANG_MODULE] if slot.spec.failure_policy.in_place_restarts else []
    if trainer is None:
        return [escape(arg) for arg in [*in_front, *_launch(slot), "-m", slot.worker_module]]
    entry = ["-m", trainer.module] if trainer.module is not None else [str(trainer.script)]
    launch = [escape(arg) for arg in [*in_front, *_launch(slot), *entry]]
    return [*launch, *(trainer_arg(arg) for arg in trainer.args)]


def _launch(slot: templates.Slot) -> list[str]:
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


def render(slot: templates.Slot) -> dict[str, Any]:
    """The worker container of `slot`'s pod."""
    spec = slot.spec
    resources = _resources(slot)
    probe = {"readinessProbe": progress_probe(spec)} if slot.node_rank == 0 else {}
    return {
        "name": names.CONTAINER_NAME,
        "image": spec.image,
        "command": _command(slot),
        "env": _env(slot),
        "ports": ports() + _gang_port(spec),
        "resources": resources,
        **_env_from(spec),
        "volumeMounts": podmerge.volume_mounts(spec) + _profile_mounts(slot.profile),
        "terminationMessagePath": contract.DEFAULT_TERMINATION_LOG,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": restricted_context([str(c) for c in spec.template.spec.capabilities]),
        **probe,
    }


def _profile_mounts(profile: api.RuntimeProfileSpec | None) -> list[dict[str, Any]]:
    """The worker's mounts of its runtime profile's volumes (profilepod.py checked them)."""
    return [mount.to_api() for mount in profile.volume_mounts] if profile else []


def restricted_context(caps: list[str], *, read_only_root: bool = True) -> dict[str, Any]:
    """A container's security context under Pod Security "restricted" (the pod's says
    non-root and RuntimeDefault seccomp): no escalation, every capability dropped but `caps`,
    a read-only root (the worker writes to /tmp, /dev/shm and the volumes)."""
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"], **({"add": sorted(caps)} if caps else {})},
        "readOnlyRootFilesystem": read_only_root,
    }


def _env_from(spec: api.FSDPJobSpec) -> dict[str, Any]:
    """template.spec.envFrom on the worker container (its env wins over their keys)."""
    sources = spec.template.spec.env_from
    return (
        {"envFrom": [s.model_dump(by_alias=True, exclude_none=True) for s in sources]}
        if sources
        else {}
    )


def init_containers(spec: api.FSDPJobSpec) -> list[dict[str, Any]]:
    """The team's init containers and native sidecars (restartPolicy Always), in order: the
    worker's restricted context unless they set the fields the model allows; every `$` of
    their strings escaped, as the worker's."""
    return [side_container(c, context=_team_context(c)) for c in spec.template.spec.init_containers]


def _team_context(c: api.Container) -> dict[str, Any]:
    own = c.security_context
    context = restricted_context(
        c.added_capabilities,
        read_only_root=own is None or own.read_only_root_filesystem is not False,
    )
    if own is not None:
        ids = {"runAsUser": own.run_as_user, "runAsGroup": own.run_as_group}
        context.update({k: v for k, v in ids.items() if v is not None})
        if own.run_as_non_root:
            context["runAsNonRoot"] = True
    return context


def side_container(c: api.Container, *, context: dict[str, Any]) -> dict[str, Any]:
    """An init container or native sidecar (the team's, or a runtime profile's) with its
    security `context`; every `$` of its strings escaped, as the worker's."""
    fields: dict[str, Any] = {
        "name": c.name,
        "image": c.image,
        "imagePullPolicy": c.image_pull_policy,
        "command": [escape(a) for a in c.command] or None,
        "args": [escape(a) for a in c.args] or None,
        "workingDir": c.working_dir,
        "env": [_escaped(v.to_api()) for v in c.env] or None,
        "envFrom": [s.model_dump(by_alias=True, exclude_none=True) for s in c.env_from] or None,
        "resources": _quantities(c.resources.to_api()) or None,
        "volumeMounts": [m.to_api() for m in c.volume_mounts] or None,
        "restartPolicy": c.restart_policy,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": context,
    }
    return {k: v for k, v in fields.items() if v is not None}


def _escaped(var: dict[str, Any]) -> dict[str, Any]:
    return {**var, "value": escape(var["value"])} if "value" in var else var


def _quantities(resources: dict[str, Any]) -> dict[str, Any]:
    """`nvidia.com/gpu: 8` in YAML is a number: the pod takes quantities as strings."""
    for part in ("requests", "limits"):
        if isinstance(resources.get(part), dict):
            resources[part] = {k: str(v) for k, v in resources[part].items()}
    return resources


def _resources(slot: templates.Slot) -> dict[str, Any]:
    """The job's resources, plus its profile's (RDMA devices, hugepages) in requests and limits
    (extended resources and hugepages need both, and equal); a job asking less gets less."""
    resources = _quantities(slot.spec.resources.to_api())
    granted = slot.profile.resources if slot.profile else {}
    asked = {**resources.get("requests", {}), **resources.get("limits", {})}
    amounts = {k: str(asked.get(k, v)) for k, v in granted.items()}  # the job may ask less
    for part in ("requests", "limits") if granted else ():
        resources[part] = {**resources.get(part, {}), **amounts}
    return resources


def worker_config(spec: api.FSDPJobSpec) -> config.WorkerConfig:
    """The document every rank reads from FSDP_WORKER_CONFIG."""
    return config.WorkerConfig(training=spec.training, checkpoint=spec.checkpoint.worker_config())


def _env(slot: templates.Slot) -> list[dict[str, Any]]:
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
        (
            contract.ENV_CHECKPOINT_ROOT,
            names.checkpoint_dir(spec.checkpoint.location, slot.job.name),
        ),
        (contract.ENV_CONFIG_HASH, spec.training.resume_hash()),
        (contract.ENV_METRICS_PORT, str(names.METRICS_PORT)),
        (contract.ENV_TERMINATION_LOG, contract.DEFAULT_TERMINATION_LOG),
        (contract.ENV_HANG_SECONDS, str(spec.failure_policy.progress_deadline_seconds)),
        (contract.ENV_STARTUP_SECONDS, str(spec.failure_policy.startup_deadline)),
    ]
    if slot.reliability:
        pairs.append((contract.ENV_RELIABILITY, slot.reliability))
    if restarts := spec.failure_policy.in_place_restarts:
        policy = spec.failure_policy
        pairs.append((contract.ENV_HANG_STEP_TIMES, str(policy.hang_step_times)))
        pairs.append((contract.ENV_HANG_FLOOR_SECONDS, str(policy.hang_floor_seconds)))
        rank0 = names.rank0_address(job, attempt=slot.attempt, cluster_domain=slot.cluster_domain)
        gang = keeper.Gang(
            restarts=restarts,
            coordinator=f"{rank0}:{names.GANG_PORT}",
            node=slot.node_rank,
            nodes=slot.replicas,
            non_retryable=tuple(spec.failure_policy.non_retryable_exit_codes),
            job=job.uid,
            attempt=slot.attempt,
            key_file=keeper.GANG_KEY_FILE,
        )
        pairs.append((contract.ENV_GANG, gang.to_json()))
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
    env: list[dict[str, Any]] = [{"name": n, "value": escape(v)} for n, v in pairs]
    env += _object_store_env(spec)
    for var in user:
        entry = var.to_api()
        if var.value is not None:
            entry["value"] = escape(var.value)
        env.append(entry)
    return env


def _object_store_env(spec: api.FSDPJobSpec) -> list[dict[str, Any]]:
    """checkpoint.objectStore's endpoint, region and Secret keys as the AWS variables (the
    spec model refused template env vars of the same names); none without it."""
    store = spec.checkpoint.object_store
    if store is None:
        return []
    return [
        {**var, "value": escape(var["value"])} if "value" in var else var for var in store.env()
    ]


def omp_threads(spec: api.FSDPJobSpec) -> str:
    """OMP_NUM_THREADS per rank: the pod's CPUs split over its ranks, at least 1.

    Without it each rank would start one OpenMP thread per host core and oversubscribe shared
    nodes (torchrun only sets 1, and only for nprocPerNode > 1). A user env var wins.
    """
    raw = (spec.resources.limits or {}).get("cpu") or (spec.resources.requests or {}).get("cpu")
    if raw is None:
        return "1"
    return str(max(1, int(api.quantity(raw) // spec.nproc_per_node)))

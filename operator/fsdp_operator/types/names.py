"""Names, label keys and ports of everything the operator creates for an FSDPJob.

One place decides how a job's Service, pods, labels and rendezvous id are spelled, so the
templating, the decisions and the API layer agree and an operator restart finds its own objects
again from labels alone. Pure string functions: no I/O, no clock, no kopf, no kubernetes client.

Naming choices:
- The headless Service is `<job>-workers`: a Service named just `<job>` would collide with a
  Service the user may already run under their job's name.
- Pods are `<job>-a<attempt>-<rank>` so a new attempt never waits for old names to be freed.
- Kubernetes wants pod hostnames and Service names to be DNS labels (<= 63 chars; a Service
  must start with a letter) while an FSDPJob name may be a 253-char DNS subdomain with dots or
  a leading digit. Such names are shortened to `<prefix>-<hash8>` (hash of the full name), so
  the result stays unique and stable across attempts; ordinary names pass through unchanged.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from fsdp_operator.types import api
from fsdp_worker import contract

DNS_LABEL_MAX = 63
DEFAULT_CLUSTER_DOMAIN = "cluster.local"

RENDEZVOUS_PORT = 29500
METRICS_PORT = contract.DEFAULT_METRICS_PORT
RENDEZVOUS_PORT_NAME = "rendezvous"
GANG_PORT = 29501  # node rank 0's in-place keeper (fsdp_worker.keeper.gang), with inPlaceRestarts
GANG_PORT_NAME = "gang"
METRICS_PORT_NAME = "metrics"

PREFIX = f"{api.GROUP}/"
MANAGER = "fsdp-operator"
APP_NAME = "fsdpjob"
CONTAINER_NAME = "worker"
SERVICE_SUFFIX = "-workers"

# Pod-name suffix budget: "-a" + 6-digit attempt + "-" + 4-digit rank. Both budgets together
# allow more than 110,000 restarts and 1024 ranks (the CRD's bounds).
MAX_ATTEMPT = 999_999
MAX_RANK = 9_999
_POD_SUFFIX_MAX = len(f"-a{MAX_ATTEMPT}-{MAX_RANK}")
JOB_PART_MAX = DNS_LABEL_MAX - _POD_SUFFIX_MAX  # 50
_HASH_LEN = 8


class Label(enum.StrEnum):
    """Label keys on the operator's objects. Values of the `fsdpoperator.io/*` ones are exact."""

    JOB = f"{PREFIX}job"
    ATTEMPT = f"{PREFIX}attempt"
    NODE_RANK = f"{PREFIX}node-rank"
    SPARE = f"{PREFIX}spare"  # a warm spare's number (spec.spares); it has no node rank yet
    REPLICAS = f"{PREFIX}replicas"  # pods in this attempt
    WORLD_SIZE = f"{PREFIX}world-size"  # ranks in this attempt (replicas x nprocPerNode)
    # the FSDPRuntimeProfile the pod was made under; the admission policy checks it by this
    RUNTIME_PROFILE = f"{PREFIX}runtime-profile"
    APP_NAME = "app.kubernetes.io/name"
    APP_INSTANCE = "app.kubernetes.io/instance"
    APP_COMPONENT = "app.kubernetes.io/component"
    APP_MANAGED_BY = "app.kubernetes.io/managed-by"


class Annotation(enum.StrEnum):
    """Annotations on worker pods: for people and for the operator's own bookkeeping."""

    RESUME_FROM = f"{PREFIX}resume-from"  # the checkpoint this attempt loads ("" = fresh)
    RENDEZVOUS_ID = f"{PREFIX}rendezvous-id"
    CONFIG_HASH = f"{PREFIX}config-hash"  # TrainingConfig.resume_hash()


class Component(enum.StrEnum):
    WORKER = "worker"
    RENDEZVOUS = "rendezvous"


@dataclasses.dataclass(frozen=True)
class JobRef:
    """Identity of one FSDPJob object: enough to name children and to own them."""

    name: str
    namespace: str
    uid: str
    api_version: str = f"{api.GROUP}/{api.VERSION}"
    kind: str = api.KIND

    @classmethod
    def of(cls, obj: Mapping[str, Any]) -> JobRef:
        """From a resource body (a dict as kopf or the API returns it)."""
        meta = obj["metadata"]
        return cls(
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
            api_version=obj.get("apiVersion", f"{api.GROUP}/{api.VERSION}"),
            kind=obj.get("kind", api.KIND),
        )


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:_HASH_LEN]


def job_part(job_name: str) -> str:
    """The job's name as it appears inside child names: a DNS label <= 50 chars, letter first.

    Unchanged when the name already fits; otherwise a readable prefix plus a hash of the name.
    """
    if len(job_name) <= JOB_PART_MAX and re.fullmatch(r"[a-z][-a-z0-9]*[a-z0-9]|[a-z]", job_name):
        return job_name
    clean = re.sub(r"[^-a-z0-9]", "-", job_name.lower())
    if not clean[:1].isalpha():
        clean = "j" + clean
    clean = clean[: JOB_PART_MAX - _HASH_LEN - 1].rstrip("-")
    return f"{clean}-{_hash(job_name)}"


def job_label_value(job_name: str) -> str:
    """The `fsdpoperator.io/job` label value: the name itself unless it exceeds 63 chars."""
    if len(job_name) <= DNS_LABEL_MAX:
        return job_name
    return f"{job_name[: DNS_LABEL_MAX - _HASH_LEN - 1].rstrip('-.')}-{_hash(job_name)}"


def service_name(job_name: str) -> str:
    """The headless Service that gives pods DNS names: `<job>-workers`."""
    return job_part(job_name) + SERVICE_SUFFIX


def network_policy_name(job_name: str) -> str:
    """The job's NetworkPolicy over its gang's ports (render/netpol.py): `<job>-gang`."""
    return job_part(job_name) + "-gang"


def pod_name(job_name: str, *, attempt: int, node_rank: int) -> str:
    """`<job>-a<attempt>-<rank>`; also the pod's hostname, so it is a DNS label."""
    if not 0 <= attempt <= MAX_ATTEMPT:
        raise ValueError(f"attempt={attempt} must be within 0..{MAX_ATTEMPT}")
    if not 0 <= node_rank <= MAX_RANK:
        raise ValueError(f"node_rank={node_rank} must be within 0..{MAX_RANK}")
    return f"{job_part(job_name)}-a{attempt}-{node_rank}"


def spare_pod_name(job_name: str, *, attempt: int, index: int) -> str:
    """`<job>-a<attempt>-s<index>`: a spare of that attempt (it keeps the name when it takes a
    lost node's place)."""
    if not 0 <= index <= MAX_RANK:
        raise ValueError(f"spare index={index} must be within 0..{MAX_RANK}")
    return f"{pod_name(job_name, attempt=attempt, node_rank=0)[:-2]}-s{index}"


def parse_spare(labels: Mapping[str, str] | None) -> int | None:
    return _parse_int(labels, Label.SPARE)


def pod_group(job_name: str, *, attempt: int) -> str:
    """`<job>-g<attempt>`: the Kueue pod group (and Workload) of the gang `attempt` started
    (queueing.py); a label value and a DNS subdomain."""
    if not 0 <= attempt <= MAX_ATTEMPT:
        raise ValueError(f"attempt={attempt} must be within 0..{MAX_ATTEMPT}")
    return f"{job_part(job_name)}-g{attempt}"


def evidence_name(job_name: str, *, attempt: int) -> str:
    """The ConfigMap that keeps a failed attempt's explanation and its ranks' log tails:
    `<job>-a<attempt>-why` (owned by the job: deleted with it, never another job's)."""
    if not 0 <= attempt <= MAX_ATTEMPT:
        raise ValueError(f"attempt={attempt} must be within 0..{MAX_ATTEMPT}")
    return f"{job_part(job_name)}-a{attempt}-why"


def gang_key_name(job_name: str, *, attempt: int) -> str:
    """The Secret that holds an attempt's gang key (mounted into its pods only, the keepers'
    messages signed with it): `<job>-a<attempt>-gang`, owned by the job."""
    if not 0 <= attempt <= MAX_ATTEMPT:
        raise ValueError(f"attempt={attempt} must be within 0..{MAX_ATTEMPT}")
    return f"{job_part(job_name)}-a{attempt}-gang"


def rank0_address(
    job: JobRef, *, attempt: int, cluster_domain: str = DEFAULT_CLUSTER_DOMAIN
) -> str:
    """Fully qualified DNS name of rank 0's pod: `<pod0>.<service>.<namespace>.svc.<domain>`."""
    pod0 = pod_name(job.name, attempt=attempt, node_rank=0)
    return f"{pod0}.{service_name(job.name)}.{job.namespace}.svc.{cluster_domain}"


def rendezvous_id(job: JobRef, *, attempt: int) -> str:
    """torchrun --rdzv-id: unique to the job object (uid, not name) and the attempt."""
    return f"{job.uid.replace('-', '')[:12]}-a{attempt}"


def selector_labels(job_name: str) -> dict[str, str]:
    """Labels selecting every pod of a job, all attempts (the Service's selector)."""
    return {Label.JOB.value: job_label_value(job_name)}


def attempt_selector_labels(job_name: str, *, attempt: int) -> dict[str, str]:
    """Labels selecting the pods of one attempt."""
    return {**selector_labels(job_name), Label.ATTEMPT.value: str(attempt)}


def label_selector(labels: Mapping[str, str]) -> str:
    """`k=v,k2=v2` for list/watch calls."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _parse_int(labels: Mapping[str, str] | None, key: Label) -> int | None:
    raw = (labels or {}).get(key.value)
    if raw is None or not re.fullmatch(r"[0-9]{1,9}", raw):
        return None
    return int(raw)


def parse_attempt(labels: Mapping[str, str] | None) -> int | None:
    """The attempt a pod belongs to, or None when the label is missing or malformed."""
    return _parse_int(labels, Label.ATTEMPT)


def parse_node_rank(labels: Mapping[str, str] | None) -> int | None:
    """The node rank of a pod, or None when the label is missing or malformed."""
    return _parse_int(labels, Label.NODE_RANK)


def is_operator_key(key: str) -> bool:
    """Whether a label/annotation key is reserved for the operator (users cannot set it)."""
    return key.startswith(PREFIX) or key in {label.value for label in Label}


def checkpoint_dir(root: str, job_name: str) -> str:
    """Where one job's checkpoints live under the shared root: `<root>/<job>`.

    Jobs that share a claim (or a root) then never read or overwrite each other's steps.
    """
    return f"{root.rstrip('/')}/{job_name}"

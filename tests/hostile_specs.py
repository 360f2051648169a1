"""Hostile FSDPJob specs: one table for the pydantic model (unit) and the real cluster.

Each case says where it must be stopped and which field the refusal must name:
- ADMISSION: the API server refuses `kubectl apply` (CRD schema, CEL); the model refuses too.
- OPERATOR: admitted, then the operator turns the job Failed/InvalidSpec before any pod exists
  (its own model check, its templating, or the API server's dry run of the worker pod).
"""

from __future__ import annotations

import copy
import dataclasses
import enum
from collections.abc import Callable
from typing import Any


class Where(enum.StrEnum):
    ADMISSION = "admission"
    OPERATOR = "operator"


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    where: Where
    field: str  # must appear in the refusal, in Kubernetes' notation: a.b[0].c
    mutate: Callable[[dict[str, Any]], None]
    dry_run_only: bool = False  # only the API server knows (the model alone accepts it)
    # names PROFILE (gpu-ib): run in a namespace the profile lists unless `listed` is False
    profile: bool = False
    listed: bool = True
    value: str = ""  # the refused value, which the operator's refusal must name too


BASE: dict[str, Any] = {
    "replicas": 2,
    "minReplicas": 1,
    "nprocPerNode": 1,
    "image": "fsdp-worker:test",
    "training": {"steps": 40, "globalBatchSize": 4, "microBatchSize": 1},
    "checkpoint": {"root": "/ckpt", "claimName": "ckpt", "intervalSteps": 5},
    "template": {"spec": {"env": [{"name": "STANDIN_STEP_SECONDS", "value": "0.2"}]}},
}


# The runtime profile the profile cases name: the cluster tests install it with the chart
# (runtimeProfiles) and list their namespace in it; the unit tests hand it to the operator's check.
PROFILE = "gpu-ib"
PROFILE_REGISTRY = "registry.test/ml"
PROFILE_SPEC: dict[str, Any] = {
    "namespaces": [],
    "capabilities": ["IPC_LOCK"],
    "resources": {"rdma/ib": "2"},
    "imageRegistries": [PROFILE_REGISTRY],
    "priorityClassNames": ["training"],
    "env": [{"name": "NCCL_IB_HCA", "value": "mlx5"}],
    "shmSize": "1Gi",
}

# A fabric's profile (as examples/chart-values/gpu-tcpx.yaml): the host's network, a library
# directory from the host and a privileged root daemon beside the worker. The cluster tests
# install it with the chart too; its rdma/ib keeps the pods Pending here (no node has one), so
# nothing of the host is ever mounted or joined on this machine.
FABRIC_PROFILE = "gpu-fabric"
FABRIC_REGISTRY = "registry.test/fabric"
FABRIC_SPEC: dict[str, Any] = {
    "namespaces": [],
    "resources": {"rdma/ib": "1"},
    "imageRegistries": [PROFILE_REGISTRY, FABRIC_REGISTRY],
    "hostNetwork": True,
    "volumes": [
        {"name": "fabric-lib", "hostPath": {"path": "/opt/fabric/lib", "type": "Directory"}},
        {"name": "fabric-socket", "emptyDir": {}},
    ],
    "volumeMounts": [
        {"name": "fabric-lib", "mountPath": "/opt/fabric/lib", "readOnly": True},
        {"name": "fabric-socket", "mountPath": "/run/fabric"},
    ],
    "sidecars": [
        {
            "name": "fabric-daemon",
            "image": f"{FABRIC_REGISTRY}/daemon:1",
            "securityContext": {"privileged": True, "runAsUser": 0},
            "volumeMounts": [{"name": "fabric-socket", "mountPath": "/run/fabric"}],
        }
    ],
}


def spec_of(case: Case) -> dict[str, Any]:
    doc = copy.deepcopy(BASE)
    if case.profile:  # a spec its profile allows, before the case makes it hostile
        doc["runtimeProfile"] = PROFILE
        doc["image"] = f"{PROFILE_REGISTRY}/fsdp-worker:test"
        doc["template"]["spec"]["capabilities"] = ["IPC_LOCK"]
    case.mutate(doc)
    return doc


def _tpl(doc: dict[str, Any]) -> dict[str, Any]:
    return dict(doc["template"]["spec"])


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """Set `a.b.c` (dicts created on the way) to value."""

    def mutate(doc: dict[str, Any]) -> None:
        node = doc
        *parents, leaf = path.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value

    return mutate


def _volume(volume: dict[str, Any], mount: str | None = None) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        doc["template"]["spec"]["volumes"] = [volume]
        if mount is not None:
            doc["template"]["spec"]["volumeMounts"] = [{"name": volume["name"], "mountPath": mount}]

    return mutate


def _env(*entries: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    return _set("template.spec.env", list(entries))


def _term(expr: dict[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [expr]}]
            }
        }
    }


def _init(**container: Any) -> Callable[[dict[str, Any]], None]:
    """One init container (a sidecar with restartPolicy Always) with `container`'s fields."""
    return _set(f"{TPL}.initContainers", [{"name": "side", "image": "busybox:1", **container}])


def _memory(size: str) -> Callable[[dict[str, Any]], None]:
    def mutate(doc: dict[str, Any]) -> None:
        doc["checkpoint"]["memory"] = {"sizeLimit": size}
        doc["failurePolicy"] = {"inPlaceRestarts": 1}  # what the memory tier needs besides

    return mutate


def _store(**fields: Any) -> Callable[[dict[str, Any]], None]:
    """checkpoint.objectStore with `fields` over a good bucket, instead of the claim."""

    def mutate(doc: dict[str, Any]) -> None:
        doc["checkpoint"].pop("claimName")
        doc["checkpoint"]["objectStore"] = {"bucket": "ckpt", **fields}

    return mutate


A, OP = Where.ADMISSION, Where.OPERATOR
STORE = "checkpoint.objectStore"
TPL = "template.spec"
CASES: list[Case] = [
    # --- host access and privilege ---------------------------------------------------------
    Case(
        "hostpath-root",
        A,
        f"{TPL}.volumes[0].hostPath",
        _volume({"name": "host", "hostPath": {"path": "/"}}, "/host"),
    ),
    Case(
        "nfs-volume",
        A,
        f"{TPL}.volumes[0].nfs",
        _volume({"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}}),
    ),
    Case(
        "gitrepo-volume",
        A,
        f"{TPL}.volumes[0].gitRepo",
        _volume({"name": "g", "gitRepo": {"repository": "https://x/y"}}),
    ),
    Case(
        "rbd-volume",
        A,
        f"{TPL}.volumes[0].rbd",
        _volume({"name": "r", "rbd": {"monitors": ["1.2.3.4"], "image": "i"}}),
    ),
    Case(
        "privileged-context",
        A,
        f"{TPL}.securityContext",
        _set(f"{TPL}.securityContext", {"privileged": True}),
    ),
    Case("host-network", A, f"{TPL}.hostNetwork", _set(f"{TPL}.hostNetwork", True)),
    Case("host-pid", A, f"{TPL}.hostPID", _set(f"{TPL}.hostPID", True)),
    Case(
        "sidecar-container",
        A,
        f"{TPL}.containers",
        _set(
            f"{TPL}.containers",
            [{"name": "x", "image": "evil", "securityContext": {"privileged": True}}],
        ),
    ),
    Case(
        "service-account",
        A,
        f"{TPL}.serviceAccountName",
        _set(f"{TPL}.serviceAccountName", "admin"),
    ),
    Case("pin-node-name", A, f"{TPL}.nodeName", _set(f"{TPL}.nodeName", "control-plane")),
    Case(
        "apparmor-unconfined",
        A,
        "template.metadata.annotations",
        _set(
            "template.metadata.annotations",
            {"container.apparmor.security.beta.kubernetes.io/worker": "unconfined"},
        ),
    ),
    # --- escaping paths and variable expansion ---------------------------------------------
    Case("root-dotdot", A, "checkpoint.root", _set("checkpoint.root", "/ckpt/../../etc")),
    Case("root-expansion", A, "checkpoint.root", _set("checkpoint.root", "/ckpt/$(HOME)")),
    Case(
        "data-dotdot",
        A,
        "training.data.path",
        _set("training.data", {"kind": "tokenFile", "path": "/data/../../etc/shadow"}),
    ),
    Case(
        "env-expansion",
        A,
        f"{TPL}.env[0].value",
        _env({"name": "X", "value": "$(FSDP_WORKER_CONFIG)"}),
    ),
    Case(
        "subpath-expr",
        A,
        f"{TPL}.volumeMounts[0].subPathExpr",
        lambda d: (
            _volume({"name": "s", "emptyDir": {}})(d),
            _set(
                f"{TPL}.volumeMounts", [{"name": "s", "mountPath": "/s", "subPathExpr": "$(HOME)"}]
            )(d),
        ),
    ),
    Case(
        "subpath-dotdot",
        OP,
        "subPath",
        lambda d: (
            _volume({"name": "s", "emptyDir": {}})(d),
            _set(f"{TPL}.volumeMounts", [{"name": "s", "mountPath": "/s", "subPath": "../../etc"}])(
                d
            ),
        ),
        dry_run_only=True,
    ),
    Case(
        "mount-over-checkpoints",
        OP,
        f"{TPL}.volumeMounts[0].mountPath",
        _volume({"name": "e", "emptyDir": {}}, "/ckpt/../ckpt"),
    ),
    Case(
        "mount-undeclared",
        OP,
        f"{TPL}.volumeMounts[0].name",
        _set(f"{TPL}.volumeMounts", [{"name": "nope", "mountPath": "/x"}]),
    ),
    Case("image-shell", A, "image", _set("image", "busybox; rm -rf /")),
    Case(
        "factory-shell",
        A,
        "training.model.factory",
        _set("training.model.factory", "os:system; echo"),
    ),
    # --- reserved names ----------------------------------------------------------------------
    Case(
        "env-reserved",
        A,
        f"{TPL}.env[0].name",
        _env({"name": "FSDP_WORKER_CONFIG_FILE", "value": "/tmp/evil.json"}),
    ),
    Case(
        "volume-reserved",
        A,
        f"{TPL}.volumes[0].name",
        _volume({"name": "fsdp-checkpoint", "emptyDir": {}}),
    ),
    Case(
        "cross-namespace-affinity",
        A,
        f"{TPL}.affinity.podAffinity",
        _set(
            f"{TPL}.affinity",
            {
                "podAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": [
                        {"topologyKey": "kubernetes.io/hostname", "namespaces": ["kube-system"]}
                    ]
                }
            },
        ),
    ),
    Case(
        "system-priority",
        A,
        f"{TPL}.priorityClassName",
        _set(f"{TPL}.priorityClassName", "system-node-critical"),
    ),
    # --- runtime profiles: what only a cluster admin's FSDPRuntimeProfile grants --------------
    Case(
        "capability-without-profile",
        A,
        f"{TPL}.capabilities",
        _set(f"{TPL}.capabilities", ["IPC_LOCK"]),
    ),
    Case("rdma-without-profile", A, "resources", _set("resources", {"limits": {"rdma/ib": "1"}})),
    Case(
        "hugepages-without-profile",
        A,
        "resources",
        _set("resources", {"limits": {"hugepages-2Mi": "1Gi", "memory": "2Gi"}}),
    ),
    Case(
        "capability-sys-admin",
        A,
        f"{TPL}.capabilities",
        _set(f"{TPL}.capabilities", ["IPC_LOCK", "SYS_ADMIN"]),
        profile=True,
    ),
    Case(
        "profile-namespace-not-listed",
        A,
        "spec.runtimeProfile",
        lambda d: None,
        profile=True,
        listed=False,
    ),
    Case(
        "profile-capability-not-granted",
        A,
        f"spec.{TPL}.capabilities",
        _set(f"{TPL}.capabilities", ["IPC_LOCK", "SYS_NICE"]),
        profile=True,
    ),
    Case(
        "profile-registry-not-listed",
        A,
        "spec.image",
        _set("image", "docker.io/evil/fsdp-worker:test"),
        profile=True,
    ),
    Case(
        "profile-registry-prefix-trick",
        A,
        "spec.image",
        _set("image", f"{PROFILE_REGISTRY}.evil.example/fsdp-worker:test"),
        profile=True,
    ),
    Case(
        "profile-rdma-over-grant",
        A,
        "spec.resources",
        _set("resources", {"limits": {"rdma/ib": "4"}}),
        profile=True,
    ),
    Case(
        "profile-priority-not-allowed",
        A,
        f"spec.{TPL}.priorityClassName",
        _set(f"{TPL}.priorityClassName", "urgent"),
        profile=True,
    ),
    Case(
        "profile-missing",
        OP,
        "spec.runtimeProfile",
        _set("runtimeProfile", "no-such-profile"),
        profile=True,
    ),
    # --- type confusion and unknown fields ----------------------------------------------------
    Case(
        "affinity-unknown-field",
        A,
        f"{TPL}.affinity.nodeAffinity.bogus",
        _set(f"{TPL}.affinity", {"nodeAffinity": {"bogus": True}}),
    ),
    Case(
        "affinity-list-for-object",
        A,
        f"{TPL}.affinity.podAntiAffinity",
        _set(f"{TPL}.affinity", {"podAntiAffinity": ["not", "an", "object"]}),
    ),
    Case(
        "toleration-seconds-string",
        A,
        f"{TPL}.tolerations[0].tolerationSeconds",
        _set(f"{TPL}.tolerations", [{"key": "k", "tolerationSeconds": "forever"}]),
    ),
    Case("resources-string", A, "resources.requests", _set("resources", {"requests": "4Gi"})),
    Case("quantity-garbage", A, "resources.limits", _set("resources", {"limits": {"cpu": "lots"}})),
    Case(
        "env-valuefrom-unknown",
        A,
        f"{TPL}.env[0].valueFrom.shell",
        _env({"name": "X", "valueFrom": {"shell": "id"}}),
    ),
    Case(
        "two-volume-sources",
        A,
        f"{TPL}.volumes[0]",
        _volume({"name": "two", "emptyDir": {}, "secret": {"secretName": "s"}}),
    ),
    Case("replicas-string", A, "replicas", _set("replicas", "four")),
    # --- oversized fields ---------------------------------------------------------------------
    Case(
        "env-too-many",
        A,
        f"{TPL}.env",
        _env(*({"name": f"V{i}", "value": "x"} for i in range(129))),
    ),
    Case(
        "env-value-too-long", A, f"{TPL}.env[0].value", _env({"name": "BIG", "value": "x" * 5000})
    ),
    Case(
        "label-value-too-long",
        A,
        "template.metadata.labels",
        _set("template.metadata.labels", {"team": "x" * 64}),
    ),
    Case(
        "node-selector-too-long",
        A,
        f"{TPL}.nodeSelector",
        _set(f"{TPL}.nodeSelector", {"pool": "y" * 70}),
    ),
    Case("replicas-huge", A, "replicas", _set("replicas", 100_000)),
    # --- a memory tier that cannot hold a save (every failed memory save ends the rank) -----
    Case("memory-tier-negative", A, "checkpoint.memory.sizeLimit", _memory("-1Gi")),
    Case("memory-tier-tiny", A, "checkpoint.memory.sizeLimit", _memory("4Ki")),
    Case("memory-tier-millis", A, "checkpoint.memory.sizeLimit", _memory("500m")),
    # --- an object store: S3's names, no second home for checkpoints, its variables its own ---
    Case("store-and-claim", A, STORE, _set(STORE, {"bucket": "ckpt"})),
    Case("bucket-uppercase", A, f"{STORE}.bucket", _store(bucket="Team_Ckpt")),
    Case("bucket-ip-address", A, f"{STORE}.bucket", _store(bucket="10.0.0.1")),
    Case("bucket-dotdot", A, f"{STORE}.bucket", _store(bucket="team..ckpt")),
    Case("bucket-reserved", A, f"{STORE}.bucket", _store(bucket="xn--ckpt")),
    Case("prefix-dotdot", A, f"{STORE}.prefix", _store(prefix="team/../other")),
    Case("prefix-absolute", A, f"{STORE}.prefix", _store(prefix="/team")),
    Case("endpoint-scheme", A, f"{STORE}.endpoint", _store(endpoint="file:///etc")),
    Case("endpoint-userinfo", A, f"{STORE}.endpoint", _store(endpoint="http://u:p@s3.local")),
    Case("endpoint-expansion", A, f"{STORE}.endpoint", _store(endpoint="http://$(HOME)")),
    Case("store-secret-name", A, f"{STORE}.credentialsSecret", _store(credentialsSecret="K_1")),
    Case("service-account-name", A, "serviceAccountName", _set("serviceAccountName", "Admin")),
    Case(
        "store-env-taken",
        OP,
        f"{TPL}.env[0].name",
        lambda d: (_store(region="eu-west-1")(d), _env({"name": "AWS_REGION", "value": "x"})(d)),
    ),
    # --- the team's own pod parts (sidecars, ids, envFrom, claims, pull secrets) -------------
    Case(
        "sidecar-privileged",
        A,
        f"{TPL}.initContainers[0].securityContext",
        _init(restartPolicy="Always", securityContext={"privileged": True}),
        value="privileged=true",
    ),
    Case(
        "sidecar-hostpath-volume",
        A,
        f"{TPL}.volumes[0].hostPath",
        lambda d: (
            _volume({"name": "host", "hostPath": {"path": "/var/log"}})(d),
            _init(restartPolicy="Always", volumeMounts=[{"name": "host", "mountPath": "/h"}])(d),
        ),
    ),
    Case(
        "init-net-admin",  # istio-init's
        A,
        f"{TPL}.initContainers[0].securityContext.capabilities.add",
        _init(securityContext={"capabilities": {"add": ["NET_ADMIN", "NET_RAW"]}}),
        value="NET_ADMIN",
    ),
    Case(
        "sidecar-ipc-lock-without-profile",
        A,
        f"{TPL}.initContainers",
        _init(restartPolicy="Always", securityContext={"capabilities": {"add": ["IPC_LOCK"]}}),
        value="IPC_LOCK",
    ),
    Case(
        "run-as-root",
        A,
        f"{TPL}.securityContext.runAsUser",
        _set(f"{TPL}.securityContext", {"runAsUser": 0}),
        value="runAsUser=0",
    ),
    Case(
        "sidecar-run-as-root",
        A,
        f"{TPL}.initContainers[0].securityContext.runAsUser",
        _init(restartPolicy="Always", securityContext={"runAsUser": 0}),
        value="runAsUser=0",
    ),
    Case(
        "run-as-non-root-false",
        A,
        f"{TPL}.securityContext",
        _set(f"{TPL}.securityContext", {"runAsNonRoot": False}),
        value="runAsNonRoot=false",
    ),
    Case(
        "host-network-in-security-context",
        A,
        f"{TPL}.securityContext.hostNetwork",
        _set(f"{TPL}.securityContext", {"hostNetwork": True}),
    ),
    Case(
        "sidecar-named-worker",
        OP,  # the API server admits it (no CEL rule on names); the operator refuses it
        f"{TPL}.initContainers[0]",
        _init(name="worker", restartPolicy="Always"),
        value="'worker'",
    ),
    Case(
        "claim-undeclared",
        OP,
        "spec.resources.claims",
        _set("resources", {"claims": [{"name": "gpus"}]}),
        value="'gpus'",
    ),
    Case(
        "envfrom-name-illegal",
        A,
        f"{TPL}.envFrom[0].configMapRef.name",
        _set(f"{TPL}.envFrom", [{"configMapRef": {"name": "team_env!"}}]),
        value="'team_env!'",
    ),
    Case(
        "pull-secret-empty-name",
        A,
        f"{TPL}.imagePullSecrets[0].name",
        _set(f"{TPL}.imagePullSecrets", [{"name": ""}]),
        value="name=''",
    ),
    Case(
        "profile-sidecar-registry-not-listed",
        A,
        f"spec.{TPL}.initContainers[0].image",
        _init(image="docker.io/evil/shipper:1", restartPolicy="Always"),
        profile=True,
        value="docker.io/evil/shipper:1",
    ),
    # a runtime profile may give pods the host's network, hostPath volumes and privileged
    # sidecars (issue 46 item 2); a job naming one still may not ask for any of them itself
    Case(
        "profile-job-host-network",
        A,
        f"{TPL}.hostNetwork",
        _set(f"{TPL}.hostNetwork", True),
        profile=True,
    ),
    Case(
        "profile-job-hostpath-volume",
        A,
        f"{TPL}.volumes[0].hostPath",
        _volume({"name": "lib", "hostPath": {"path": "/home/kubernetes/bin"}}, "/lib"),
        profile=True,
    ),
    Case(
        "profile-job-privileged-sidecar",
        A,
        f"{TPL}.initContainers[0].securityContext",
        _init(restartPolicy="Always", securityContext={"privileged": True}),
        profile=True,
        value="privileged=true",
    ),
    Case(
        "profile-job-sidecars-field",
        A,
        f"{TPL}.sidecars",
        _set(f"{TPL}.sidecars", [{"name": "d", "image": "d:1"}]),
        profile=True,
    ),
    # --- values Kubernetes itself refuses (only the pod's own validation knows) ---------------
    Case(
        "label-key-invalid",
        A,
        "template.metadata.labels",
        _set("template.metadata.labels", {"-bad/key-": "v"}),
    ),
    Case(
        "volume-name-invalid",
        A,
        f"{TPL}.volumes[0].name",
        _volume({"name": "Bad_Name", "emptyDir": {}}),
    ),
    Case(
        "affinity-operator",
        OP,
        "affinity.nodeAffinity",
        _set(f"{TPL}.affinity", _term({"key": "gpu", "operator": "Sometimes", "values": ["a"]})),
        dry_run_only=True,
    ),
    # the CRD's CEL says what the pod's validation would (the model alone accepts it)
    Case(
        "toleration-operator",
        A,
        "tolerations[].operator must be Exists or Equal",
        _set(f"{TPL}.tolerations", [{"key": "gpu", "operator": "Maybe"}]),
        dry_run_only=True,
    ),
    Case(
        "requests-over-limits",
        OP,
        "resources.requests",
        _set("resources", {"requests": {"cpu": "2"}, "limits": {"cpu": "1"}}),
        dry_run_only=True,
    ),
    Case(
        "unknown-resource-name",
        OP,
        "resources.limits",
        _set("resources", {"limits": {"bogus": "1"}}),
        dry_run_only=True,
    ),
    Case(
        "ephemeral-without-access-modes",
        OP,
        "accessModes",
        _volume(
            {
                "name": "eph",
                "ephemeral": {
                    "volumeClaimTemplate": {"spec": {"resources": {"requests": {"storage": "1Gi"}}}}
                },
            }
        ),
        dry_run_only=True,
    ),
]

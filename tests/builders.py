"""Builders the tests share, in one place (as JobSet's pkg/util/testing/wrappers.go): the
observations the policies' truth tables start from, and the typical spec and pod of the
templating tests. Test modules import these, never each other's.

The observations are built as io/observe.py builds them: a pod's termination message is read
into its typed view, and the status's resume rules are parsed beside it.
"""

from __future__ import annotations

import json
from typing import Any

from fsdp_operator.io import reports
from fsdp_operator.policy import decide
from fsdp_operator.render import templates
from fsdp_operator.types import api, names
from fsdp_operator.types import observed as ob
from fsdp_operator.types import status as st
from fsdp_worker import contract

# --- the policies' truth tables -----------------------------------------------------------------
NOW = 1_000_000.0
CRASH_MSG = '{"class": "RuntimeError", "rank": 3, "step": 51, "exitCode": 1, "message": "boom"}'
CONFIG_MSG = '{"class": "ConfigError", "rank": 0, "step": null, "exitCode": 78, "message": "bad"}'
CRASHED = {"phase": ob.PodPhase.FAILED, "exit_code": 1, "finished": NOW - 2, "message": CRASH_MSG}
"""A pod whose rank crashed two seconds ago (its worker said why)."""
SCRAPED = ob.ScrapeHealth("job-a1-0", failures=0, address="10.0.0.5:9400")
"""The operator's scrapes reach rank 0 and get its metrics (no newer step in them)."""
BLIND = ob.ScrapeHealth(
    "job-a1-0",
    failures=3,
    error="GET http://10.0.0.5:9400/metrics: no answer within 1s",
    address="10.0.0.5:9400",
)
"""The operator's scrapes get no answer from rank 0 (a NetworkPolicy drops them)."""


def make_spec(**over: Any) -> api.FSDPJobSpec:
    doc: dict[str, Any] = {
        "replicas": 4,
        "minReplicas": 2,
        "image": "worker:1",
        "training": {"globalBatchSize": 8, "microBatchSize": 1},
        "failurePolicy": {
            "maxRestarts": 3,
            "maxInfraRestarts": 5,
            "maxRestartsWithoutProgress": 3,
            "nonRetryableExitCodes": [42],
            "backoff": {"initialSeconds": 10, "maxSeconds": 60},
            "nodeLossGraceSeconds": 30,
            "progressDeadlineSeconds": 100,
            "pendingTimeoutSeconds": 50,
        },
    }
    for key, value in over.items():
        doc[key] = value
    return api.FSDPJobSpec.model_validate(doc)


def running_status(**over: Any) -> st.FSDPJobStatus:
    base = {
        "phase": st.Phase.RUNNING,
        "attempt": 1,
        "replicas": 4,
        "world_size": 4,
        "pods_created": True,
        "attempt_started": NOW - 200,
        "last_progress_time": NOW - 10,
        "step": 50,
        "started": NOW - 200,
        "history": [st.HistoryEntry(attempt=1, started=NOW - 200, world_size=4)],
    }
    base.update(over)
    return st.FSDPJobStatus(**base)


def pod_view(**fields: Any) -> ob.PodView:
    """One pod as observe.pod_view makes it: its termination message read once."""
    fields.setdefault("termination", reports.termination(fields.get("message", "")))
    return ob.PodView(**fields)


def pods(attempt: int = 1, n: int = 4, **over: Any) -> list[ob.PodView]:
    """n healthy running pods, one per node; `over` maps rank -> field overrides."""
    out = []
    for r in range(n):
        fields: dict[str, Any] = {
            "name": f"job-a{attempt}-{r}",
            "attempt": attempt,
            "rank": r,
            "phase": ob.PodPhase.RUNNING,
            "node": f"node-{r}",
        }
        fields.update(over.get(f"r{r}", {}))
        out.append(pod_view(**fields))
    return out


def nodes(n: int = 4, down: dict[int, float] | None = None) -> list[ob.NodeView]:
    down = down or {}
    return [
        ob.NodeView(name=f"node-{i}", ready=i not in down, not_ready_since=down.get(i))
        for i in range(n)
    ]


def ckpt(step: int, attempt: int = 1) -> st.CheckpointRef:
    return st.CheckpointRef(step=step, path=f"/ckpt/step-{step}", attempt=attempt, world_size=4)


def observe(**over: Any) -> ob.Observed:
    """A pass of a healthy running attempt 1, or as `over` says. The status's resume rules
    are parsed as the Reconciler parses them (pass `resume_rules` to say otherwise)."""
    fields: dict[str, Any] = {
        "spec": make_spec(),
        "status": running_status(),
        "generation": 1,
        "now": NOW,
        "pods": pods(),
        "nodes": nodes(),
        "checkpoint": ckpt(40),
        "progress": ob.Progress(step=50),
    }
    fields.update(over)
    fields.setdefault("resume_rules", reports.resume_rules(fields["status"].resume_rules))
    return ob.Observed(**fields)


def condition(d: decide.Decision, kind: str) -> st.Condition | None:
    """The decision's condition of that type, if any."""
    return next((c for c in d.status.conditions if c.type == kind), None)


def live_record(phase: str, step: int | None) -> str:
    """The live record a rank keeps in its termination-message file (flight.py)."""
    memory = {"peakRssBytes": 15 << 30, "limitBytes": 16 << 30}
    doc = {
        "class": contract.RecordClass.LIVE,
        "rank": 6,
        "step": step,
        "exitCode": None,
        "message": "",
    }
    return json.dumps({**doc, "phase": phase, "memory": memory})


def oom_killed_in(phase: str, step: int | None = 811) -> dict[str, Any]:
    """A pod the kernel OOM-killed in `phase` after `step`: its live record is its message."""
    killed = {"phase": ob.PodPhase.FAILED, "exit_code": 137, "reason": "OOMKilled"}
    return {**killed, "finished": NOW - 1, "message": live_record(phase, step)}


def in_place_spec(**policy_over: Any) -> api.FSDPJobSpec:
    """make_spec() with three restarts in place allowed."""
    spec = make_spec()
    policy = spec.failure_policy.model_copy(update={"in_place_restarts": 3, **policy_over})
    return spec.model_copy(update={"failure_policy": policy})


def in_place_record(
    generation: int, *, node: int = 2, step: int = 48, **over: Any
) -> dict[str, Any]:
    """A keeper's record of a rank failure restarted in place (fsdp_worker.keeper.gang)."""
    doc: dict[str, Any] = {
        "class": contract.FailureClass.RUNTIME.value,
        "rank": node,
        "step": step,
        "exitCode": 1,
        "message": "CUDA error: an illegal memory access",
        "node": node,
        "torchrunExitCode": 1,
        "time": NOW - 8,
        "generation": generation,
    }
    doc.update(over)
    return doc


def in_place_progress(generation: int, *records: dict[str, Any], **over: Any) -> ob.Progress:
    """Rank 0 of `generation` as scraped, serving the keepers' `records`."""
    read = (reports.in_place_record(r) for r in records)
    fields: dict[str, Any] = {
        "step": 45,
        "generation": generation,
        "restarts_in_place": tuple(r for r in read if r is not None),
        "resumed_from": 40,
        "milestones": {"rendezvous": NOW - 5, "loaded": NOW - 3, "first_step": NOW - 2},
        "steps_run": 5,
        "train_seconds": 5.0,
    }
    fields.update(over)
    return ob.Progress(**fields)


# --- templating ---------------------------------------------------------------------------------
TYPICAL_JOB = names.JobRef(
    name="llama", namespace="team-a", uid="3f2a1b4c-0d1e-4f00-9abc-def012345678"
)
TYPICAL: dict[str, Any] = {
    "replicas": 4,
    "minReplicas": 2,
    "nprocPerNode": 8,
    "image": "registry.example/fsdp-worker:0.1.0",
    "resources": {"limits": {"nvidia.com/gpu": "8", "cpu": "64", "memory": "512Gi"}},
    "training": {
        "model": {"preset": "1b", "seqLen": 2048, "vocabSize": 32000},
        "steps": 10000,
        "globalBatchSize": 256,
        "microBatchSize": 2,
    },
    "checkpoint": {"root": "/ckpt/llama", "intervalSteps": 200, "claimName": "ckpt-rwx"},
    "template": {
        "metadata": {
            "labels": {
                "team": "nlp",
                "fsdpoperator.io/job": "hijack",
                "fsdpoperator.io/attempt": "0",
            },
            "annotations": {"owner": "alice", "fsdpoperator.io/resume-from": "/etc"},
        },
        "spec": {
            "nodeSelector": {"gpu": "h100"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "priorityClassName": "training",
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["a"]}
                                ]
                            },
                            {
                                "matchExpressions": [
                                    {"key": "zone", "operator": "In", "values": ["b"]}
                                ]
                            },
                        ]
                    }
                }
            },
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "tokens"}}],
            "volumeMounts": [{"name": "data", "mountPath": "/data", "readOnly": True}],
            "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
        },
    },
}


def typical_spec(**changes: Any) -> api.FSDPJobSpec:
    """TYPICAL, with `changes` at paths such as `training__steps`."""
    doc = json.loads(json.dumps(TYPICAL))
    for path, value in changes.items():
        node = doc
        *parents, leaf = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return api.FSDPJobSpec.model_validate(doc)


STORE: dict[str, Any] = {
    "bucket": "team-ckpt",
    "prefix": "llama/run-1",
    "endpoint": "http://s3.kube-system.svc.cluster.local:7070",
    "region": "us-east-1",
    "credentialsSecret": "s3-keys",
}


def store_spec(**changes: Any) -> api.FSDPJobSpec:
    """TYPICAL with its claim replaced by STORE (`changes` over STORE's fields), run as its
    own ServiceAccount."""
    checkpoint = {"root": "/ckpt/llama", "intervalSteps": 200, "objectStore": {**STORE, **changes}}
    return typical_spec(checkpoint=checkpoint, serviceAccountName="trainer")


def typical_pod(spec: api.FSDPJobSpec | None = None, **kwargs: Any) -> dict[str, Any]:
    """Rank 1 of attempt 3 of TYPICAL_JOB (4 pods, resuming, two nodes excluded), or as
    `kwargs` say: the Launch's fields, `node_rank`, `worker_module`."""
    launch: dict[str, Any] = {
        "attempt": 3,
        "replicas": 4,
        "resume_path": "/ckpt/llama/step-1200",
        "excluded_nodes": ("node-b", "node-a", "node-b"),
    }
    rank = kwargs.pop("node_rank", 1)
    optional = ("reliability", "resume_rules")
    launch.update({k: kwargs.pop(k) for k in list(kwargs) if k in launch or k in optional})
    launch["excluded_nodes"] = tuple(launch["excluded_nodes"])
    return templates.worker_pod(
        TYPICAL_JOB, spec or typical_spec(), decide.Launch(**launch), node_rank=rank, **kwargs
    )


def completed(step: int, *, sums: dict[str, object] | None = None) -> str:
    """Rank 0's termination message on success: trained to `step`, `step` sealed, with its
    `sums` (contract.sums) when given."""
    doc: dict[str, object] = {
        "class": contract.RecordClass.COMPLETED,
        "rank": 0,
        "step": step,
        "exitCode": 0,
        "message": contract.completion_message(sealed_step=step),
    }
    if sums is not None:
        doc[contract.SUMS] = sums
    return json.dumps(doc)

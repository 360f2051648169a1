"""Integration-test helpers: the shared local stack plus the stand-in job template."""

from __future__ import annotations

import uuid
from typing import Any

from harness.stack import ROOT, Jobs, Operator, free_port, install_crd, install_rbac
from localcluster import images

__all__ = [
    "ROOT",
    "Jobs",
    "Operator",
    "free_port",
    "install_crd",
    "install_rbac",
    "job_doc",
    "unique",
]


def job_doc(name: str, **spec: Any) -> dict[str, Any]:
    """A stand-in job: 2 pods x 1 rank, a step per 0.2 s, checkpoint every 5 steps."""
    env = spec.pop("env", {})
    doc: dict[str, Any] = {
        "apiVersion": "fsdpoperator.io/v1alpha1",
        "kind": "FSDPJob",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "minReplicas": 1,
            "nprocPerNode": 1,
            "image": images.WORKER,
            "training": {"steps": 40, "globalBatchSize": 4, "microBatchSize": 1},
            "checkpoint": {"root": "/ckpt", "claimName": "ckpt", "intervalSteps": 5},
            "failurePolicy": {
                "backoff": {"initialSeconds": 1, "maxSeconds": 4},
                "nodeLossGraceSeconds": 4,
                # The deadline counts from the attempt's start: under a full suite's load on 2
                # CPUs a cold torchrun start (torch read from a node's fresh snapshot) neared
                # 15 s, and a healthy attempt 1 was restarted as hung.
                "progressDeadlineSeconds": 30,
                "pendingTimeoutSeconds": 10,
            },
            "template": {
                "spec": {
                    "env": [
                        {"name": "STANDIN_STEP_SECONDS", "value": "0.2"},
                        *({"name": k, "value": str(v)} for k, v in env.items()),
                    ]
                }
            },
        },
    }
    for key, value in spec.items():
        if isinstance(value, dict) and isinstance(doc["spec"].get(key), dict):
            doc["spec"][key] = {**doc["spec"][key], **value}
        else:
            doc["spec"][key] = value
    return doc


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"

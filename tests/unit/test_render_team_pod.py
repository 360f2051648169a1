"""The team's own pod parts as the pod gets them: sidecars and init containers under the
worker's restricted security context, the pod's own ids, envFrom, DRA claims, topology spread
and pull secrets beside the profile's. Pure templating; no cluster."""

from __future__ import annotations

from typing import Any

import pytest

from fsdp_operator.render import templates
from fsdp_operator.types import api
from tests import builders

SIDECAR = {
    "name": "log-shipper",
    "image": "fluent/fluent-bit:3",
    "restartPolicy": "Always",
    "args": ["--tag=$(POD)"],
    "env": [{"name": "LEVEL", "value": "info"}],
    "volumeMounts": [{"name": "logs", "mountPath": "/logs"}],
    "securityContext": {"runAsUser": 4000, "readOnlyRootFilesystem": False},
}
PREP = {"name": "prepare-data", "image": "busybox:1", "command": ["cp", "-r", "/src", "/logs"]}
TEAM: dict[str, Any] = {
    "volumes": [{"name": "logs", "emptyDir": {}}],
    "initContainers": [PREP, SIDECAR],
    "securityContext": {"runAsUser": 2000, "supplementalGroups": [5000]},
    "envFrom": [{"secretRef": {"name": "team-tokens"}, "prefix": "TEAM_"}],
    "imagePullSecrets": [{"name": "team-registry"}, {"name": "shared"}],
    "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}],
    "topologySpreadConstraints": [
        {"maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "ScheduleAnyway"}
    ],
}


def _pod(**over: Any) -> dict[str, Any]:
    spec = builders.typical_spec(
        template__spec={**TEAM, **over}, resources={"claims": [{"name": "gpus"}]}
    )
    return builders.typical_pod(spec)["spec"]


def test_sidecars_and_init_containers_get_the_workers_restricted_context() -> None:
    pod = _pod()
    prep, sidecar = pod["initContainers"]
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    assert prep["securityContext"] == {**restricted, "readOnlyRootFilesystem": True}
    assert "restartPolicy" not in prep
    assert sidecar["restartPolicy"] == "Always"
    assert sidecar["securityContext"] == {
        **restricted,
        "readOnlyRootFilesystem": False,
        "runAsUser": 4000,
    }
    assert sidecar["args"] == ["--tag=$$(POD)"]  # literal, as the worker's strings
    assert [c["name"] for c in pod["containers"]] == ["worker"]  # the only rank


def test_the_pods_own_ids_replace_1000_and_the_rest_stays_the_operators() -> None:
    assert _pod()["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 2000,
        "runAsGroup": 1000,
        "fsGroup": 1000,
        "supplementalGroups": [5000],
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def test_env_from_claims_spread_and_pull_secrets_reach_the_pod() -> None:
    pod = _pod()
    (worker,) = pod["containers"]
    assert worker["envFrom"] == [{"secretRef": {"name": "team-tokens"}, "prefix": "TEAM_"}]
    assert worker["resources"]["claims"] == [{"name": "gpus"}]
    assert pod["resourceClaims"] == [{"name": "gpus", "resourceClaimTemplateName": "eight-gpus"}]
    assert pod["topologySpreadConstraints"][0]["topologyKey"] == "zone"
    profile = api.RuntimeProfileSpec(namespaces=["team-a"], image_pull_secrets=["shared", "nvcr"])
    spec = builders.typical_spec(
        template__spec=TEAM, resources={"claims": [{"name": "gpus"}]}, runtimeProfile="p"
    )
    with_profile = templates.worker_pod(
        builders.TYPICAL_JOB, spec, templates.decide.Launch(1, 4, ""), node_rank=0, profile=profile
    )
    names = [s["name"] for s in with_profile["spec"]["imagePullSecrets"]]
    assert names == ["shared", "nvcr", "team-registry"]


def test_a_sidecar_mounts_only_the_teams_volumes() -> None:
    bad = {**SIDECAR, "volumeMounts": [{"name": "fsdp-gang-key", "mountPath": "/k"}]}
    with pytest.raises(templates.TemplateError, match=r"initContainers\[1\].volumeMounts\[0\]"):
        _pod(initContainers=[PREP, bad])

"""Checkpoints in an object store, as a user would notice them in the pods the operator makes
and in what it observes: the worker's root is the bucket's URI, endpoint, region and keys
arrive as the standard AWS variables (the keys from the named Secret, by the kubelet), no claim
is mounted, the pods run as the job's own ServiceAccount, and the operator leaves the choice of
a resume point to the pods (it never reads the bucket).
"""

from __future__ import annotations

import json
from typing import Any

import pydantic
import pytest

from fsdp_operator.io import checkpoints
from fsdp_operator.types import api, status
from fsdp_worker import contract
from tests import builders

STORE = builders.STORE
store_spec = builders.store_spec


def container(pod: dict[str, Any]) -> dict[str, Any]:
    (only,) = pod["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def env_of(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {var["name"]: var for var in container(pod)["env"]}


def test_the_workers_root_is_the_buckets_uri_and_its_config_reads_as_the_worker_reads_it() -> None:
    """The job's own prefix reaches the worker as FSDP_CHECKPOINT_ROOT, which overrides the
    config's root; the config stays one the worker's own model parses (a URI in its path
    field would be refused, and the job would fail at start with ConfigError)."""
    from fsdp_worker.kit import environment

    env = env_of(builders.typical_pod(store_spec()))
    worker_config = json.loads(env[contract.ENV_CONFIG]["value"])
    assert "objectStore" not in worker_config["checkpoint"]  # the operator's, not the worker's
    job_root = env[contract.ENV_CHECKPOINT_ROOT]["value"]
    assert job_root == f"s3://team-ckpt/llama/run-1/{builders.TYPICAL_JOB.name}"
    plain = {k: v["value"] for k, v in env.items() if "value" in v}
    with pytest.MonkeyPatch.context() as mp:
        for key, value in plain.items():
            mp.setenv(key, value)
        settings = environment.load_settings()
    assert settings.cfg.checkpoint.root == job_root


def test_without_a_prefix_the_root_is_the_bucket() -> None:
    spec = store_spec(prefix="")
    assert spec.checkpoint.location == "s3://team-ckpt"


def test_endpoint_region_and_keys_arrive_as_the_aws_variables() -> None:
    env = env_of(builders.typical_pod(store_spec()))
    assert env["AWS_ENDPOINT_URL_S3"]["value"] == STORE["endpoint"]
    assert env["AWS_REGION"]["value"] == env["AWS_DEFAULT_REGION"]["value"] == "us-east-1"
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        assert env[key] == {
            "name": key,
            "valueFrom": {"secretKeyRef": {"name": "s3-keys", "key": key}},
        }
    token = env["AWS_SESSION_TOKEN"]["valueFrom"]["secretKeyRef"]
    assert token == {"name": "s3-keys", "key": "AWS_SESSION_TOKEN", "optional": True}


def test_workload_identity_sets_no_keys_and_unset_fields_no_variables() -> None:
    spec = store_spec(credentialsSecret=None, endpoint=None, region=None)
    env = env_of(builders.typical_pod(spec))
    assert not [name for name in env if name.startswith("AWS_")]


def test_no_claim_is_mounted_and_the_user_may_mount_at_root() -> None:
    spec = store_spec()
    pod = builders.typical_pod(spec)
    assert not [v for v in pod["spec"]["volumes"] if v["name"] == "fsdp-checkpoint"]
    assert not [m for m in container(pod)["volumeMounts"] if m["name"] == "fsdp-checkpoint"]


def test_a_store_and_a_claim_are_refused_naming_both() -> None:
    doc = {**builders.TYPICAL, "checkpoint": {"claimName": "ckpt-rwx", "objectStore": STORE}}
    with pytest.raises(pydantic.ValidationError, match=r"objectStore.*claimName='ckpt-rwx'"):
        api.FSDPJobSpec.model_validate(doc)


def test_the_template_env_cannot_override_the_stores_variables() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"env\[0\].name='AWS_ACCESS_KEY_ID'"):
        store_spec_with_env([{"name": "AWS_ACCESS_KEY_ID", "value": "AKIA"}])
    # with workload identity the keys are the user's to set (e.g. a token file path)
    spec = store_spec_with_env(
        [{"name": "AWS_ACCESS_KEY_ID", "value": "AKIA"}], credentialsSecret=None
    )
    assert env_of(builders.typical_pod(spec))["AWS_ACCESS_KEY_ID"]["value"] == "AKIA"


def store_spec_with_env(env: list[dict[str, str]], **changes: Any) -> api.FSDPJobSpec:
    doc = json.loads(json.dumps(builders.TYPICAL))
    doc["checkpoint"] = {"objectStore": {**STORE, **changes}}
    doc["template"]["spec"]["env"] = env
    return api.FSDPJobSpec.model_validate(doc)


def test_the_pods_run_as_the_jobs_service_account_with_its_token_setting() -> None:
    spec = builders.typical_spec(serviceAccountName="trainer")
    pod_spec = builders.typical_pod(spec)["spec"]
    assert pod_spec["serviceAccountName"] == "trainer"
    assert "automountServiceAccountToken" not in pod_spec  # the account's own setting decides


def test_without_a_service_account_no_token_is_mounted() -> None:
    pod_spec = builders.typical_pod(builders.typical_spec())["spec"]
    assert pod_spec["automountServiceAccountToken"] is False
    assert "serviceAccountName" not in pod_spec


def test_the_operator_never_reads_the_bucket_so_the_pods_choose(tmp_path: Any) -> None:
    spec = store_spec()
    template = str(tmp_path / "{namespace}" / "{claim}")
    base = checkpoints.storage_for(builders.TYPICAL_JOB, spec, template)
    found = checkpoints.newest(builders.TYPICAL_JOB, spec, status.FSDPJobStatus(), base, deep=False)
    assert base is None and found.visible is False and found.newest is None

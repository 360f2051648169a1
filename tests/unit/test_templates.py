"""Templating: what a user would notice about the Service and worker pods the operator creates.

Goldens live in tests/unit/golden/; `UPDATE_GOLDEN=1 pytest tests/unit/test_templates.py`
rewrites them, the default compares.
"""

from __future__ import annotations

import json
import os
import pathlib
from collections.abc import Callable
from typing import Any

import pydantic
import pytest
import yaml

from fsdp_operator.policy import decide
from fsdp_operator.render import templates
from fsdp_operator.types import api, names
from fsdp_worker import contract
from fsdp_worker.contract import config as wconfig
from fsdp_worker.contract import config_checkpoint
from tests import builders

GOLDEN = pathlib.Path(__file__).parent / "golden"
JOB = builders.TYPICAL_JOB
TYPICAL = builders.TYPICAL
make_spec = builders.typical_spec
pod = builders.typical_pod


def container(p: dict[str, Any]) -> dict[str, Any]:
    (only,) = p["spec"]["containers"]
    assert isinstance(only, dict)
    return only


def env(p: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e["value"] for e in container(p)["env"]}


def k8s_expand(value: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes' $(VAR) expansion (third_party/forked/golang/expansion/expand.go), ported."""
    out, i = [], 0
    while i < len(value):
        if value[i] != "$" or i + 1 == len(value):
            out.append(value[i])
            i += 1
            continue
        nxt = value[i + 1]
        if nxt == "$":  # escaped
            out.append("$")
            i += 2
        elif nxt == "(" and ")" in value[i + 2 :]:
            end = value.index(")", i + 2)
            name = value[i + 2 : end]
            found = lookup(name)
            out.append(found if found is not None else f"$({name})")
            i = end + 1
        else:
            out.append("$" + nxt)
            i += 2
    return "".join(out)


def container_view(p: dict[str, Any], host_env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """What the process sees: env values expanded in order, then the command against them."""
    seen: dict[str, str] = dict(host_env)
    for e in container(p)["env"]:
        seen[e["name"]] = k8s_expand(e["value"], seen.get)
    argv = [k8s_expand(a, seen.get) for a in container(p)["command"]]
    return argv, seen


# --- goldens ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "build"),
    [
        ("service.yaml", lambda: templates.service(job=JOB, spec=make_spec())),
        ("pod-rank0.yaml", lambda: pod(node_rank=0)),
        ("pod-rank1-fresh.yaml", lambda: pod(node_rank=1, resume_path="", excluded_nodes=[])),
        (
            "pod-rank0-objectstore.yaml",
            lambda: pod(builders.store_spec(), node_rank=0, resume_path=contract.RESUME_AUTO),
        ),
    ],
)
def test_golden(filename: str, build: Callable[[], dict[str, Any]]) -> None:
    text = yaml.safe_dump(build(), sort_keys=True, width=100)
    path = GOLDEN / filename
    if os.environ.get("UPDATE_GOLDEN"):
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
    assert "&id" not in text, "objects shared between places in the output"
    assert path.exists(), f"{path} missing: run with UPDATE_GOLDEN=1 once"
    assert text == path.read_text(), f"{filename} changed; review, then UPDATE_GOLDEN=1"


# --- command ---------------------------------------------------------------------------------


def test_command_is_torchrun_argument_list_without_a_shell() -> None:
    c = container(pod())
    assert "args" not in c
    argv = c["command"]
    assert argv[:3] == ["python", "-m", "torch.distributed.run"]
    assert not {"sh", "bash", "/bin/sh", "/bin/bash", "-c"} & set(argv)
    assert not any(";" in a or "&&" in a or "|" in a for a in argv)
    assert argv[-2:] == ["-m", "fsdp_worker"]
    assert "--nnodes=4" in argv and "--nproc-per-node=8" in argv and "--node-rank=1" in argv
    assert "--max-restarts=0" in argv and "--rdzv-backend=static" in argv
    assert "--rdzv-endpoint=llama-a3-0.llama-workers.team-a.svc.cluster.local:29500" in argv
    assert "--rdzv-id=3f2a1b4c0d1e-a3" in argv


def test_torchrun_accepts_the_command() -> None:
    run = pytest.importorskip("torch.distributed.run")
    argv = container(pod())["command"]
    args = run.get_args_parser().parse_args(argv[3:])
    assert (args.nnodes, args.nproc_per_node, args.node_rank) == ("4", "8", 1)
    assert args.rdzv_backend == "static" and args.max_restarts == 0 and args.module
    assert run.get_rdzv_endpoint(args).endswith(".svc.cluster.local:29500")
    assert args.training_script == "fsdp_worker"


def test_every_rank_rendezvous_on_the_same_rank0_endpoint() -> None:
    pods = templates.worker_pods(JOB, make_spec(), decide.Launch(2, 4, ""))
    endpoints = {a for p in pods for a in container(p)["command"] if a.startswith("--rdzv-")}
    assert len(endpoints) == 3  # backend, endpoint, id: identical across ranks
    assert pods[0]["spec"]["hostname"] == "llama-a2-0"
    assert all(p["spec"]["subdomain"] == "llama-workers" for p in pods)


# --- no $(VAR) expansion of user strings -----------------------------------------------------


def test_dollar_paren_in_user_strings_reaches_the_worker_literally() -> None:
    spec = make_spec()
    # The schema rejects '$(' in env values and '$' in config paths; bypass it (model_construct,
    # model_copy) to prove the escaping holds even for values that slipped past validation.
    note = api.EnvVar.model_construct(name="NOTE", value="$(HOME) $$ $x $")
    overrides = spec.template.spec.model_copy(update={"env": [note]})
    template = spec.template.model_copy(update={"spec": overrides})
    spec = spec.model_copy(update={"template": template})
    data = spec.training.data.model_copy(update={"path": "/data/$(HOME)/$(FSDP_ATTEMPT)"})
    spec = spec.model_copy(update={"training": spec.training.model_copy(update={"data": data})})
    argv, seen = container_view(pod(spec), host_env={"HOME": "/home/worker"})
    config = json.loads(seen[contract.ENV_CONFIG])  # the worker would reject the path, literally
    assert config["training"]["data"]["path"] == "/data/$(HOME)/$(FSDP_ATTEMPT)"
    assert seen["NOTE"] == "$(HOME) $$ $x $"
    assert argv == container(pod())["command"]  # nothing in the command changed under expansion


def test_worker_config_env_is_the_spec_training_and_checkpoint() -> None:
    spec = make_spec()
    _, seen = container_view(pod(spec), host_env={})
    config = wconfig.WorkerConfig.parse(seen[contract.ENV_CONFIG])
    assert config.training == spec.training
    assert config.checkpoint == spec.checkpoint.worker_config()
    assert seen[contract.ENV_RESUME] == "/ckpt/llama/step-1200"
    assert (
        seen[contract.ENV_CHECKPOINT_ROOT]
        == "/ckpt/llama/" + pod()["metadata"]["labels"]["fsdpoperator.io/job"]
    )
    assert seen[contract.ENV_ATTEMPT] == "3"
    assert seen[contract.ENV_METRICS_PORT] == "9400"
    assert seen[contract.ENV_TERMINATION_LOG] == container(pod())["terminationMessagePath"]
    assert seen["NCCL_DEBUG"] == "WARN"


def test_the_fast_hang_rule_reaches_the_worker_only_with_restarts_in_place() -> None:
    """failurePolicy.hangStepTimes (default 3) is FSDP_HANG_STEP_TIMES where a keeper restarts
    the gang in place; without one a hang recreates the gang, and only the deadline judges."""
    assert contract.ENV_HANG_STEP_TIMES not in env(pod())
    kept = make_spec(failurePolicy__inPlaceRestarts=2)
    assert env(pod(kept))[contract.ENV_HANG_STEP_TIMES] == "3"
    assert env(pod(kept))[contract.ENV_HANG_FLOOR_SECONDS] == "10"
    fast = make_spec(failurePolicy__inPlaceRestarts=2, failurePolicy__hangFloorSeconds=2)
    assert env(pod(fast))[contract.ENV_HANG_FLOOR_SECONDS] == "2"
    off = make_spec(failurePolicy__inPlaceRestarts=2, failurePolicy__hangStepTimes=0)
    assert env(pod(off))[contract.ENV_HANG_STEP_TIMES] == "0"
    with pytest.raises(pydantic.ValidationError, match="hangStepTimes"):
        make_spec(failurePolicy__hangStepTimes=-1)
    with pytest.raises(pydantic.ValidationError, match="hangFloorSeconds"):
        make_spec(failurePolicy__hangFloorSeconds=0)


# --- security --------------------------------------------------------------------------------


def test_checkpoint_export_reaches_the_worker_only_when_asked() -> None:
    """spec.checkpoint.export is the worker's checkpoint.export; unset, the document is what a
    worker before the field parses (no `export` key)."""
    plain = json.loads(env(pod())[contract.ENV_CONFIG])
    assert "export" not in plain["checkpoint"]
    spec = make_spec(checkpoint__export={"format": "safetensors"})
    seen = wconfig.WorkerConfig.parse(env(pod(spec))[contract.ENV_CONFIG])
    assert seen.checkpoint.export == config_checkpoint.ExportConfig(
        format=config_checkpoint.ExportFormat.SAFETENSORS
    )
    with pytest.raises(pydantic.ValidationError, match="export.format"):
        make_spec(checkpoint__export={"format": "pickle"})


def test_restricted_security_context_and_no_credentials() -> None:
    p = pod()
    sc = p["spec"]["securityContext"]
    assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 1000
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    csc = container(p)["securityContext"]
    assert csc["allowPrivilegeEscalation"] is False
    assert csc["capabilities"] == {"drop": ["ALL"]}
    assert p["spec"]["automountServiceAccountToken"] is False
    assert p["spec"]["enableServiceLinks"] is False
    assert p["spec"]["restartPolicy"] == "Never"


def test_user_env_cannot_take_over_the_worker_contract() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"env.0.name\n.*'FSDP_WORKER_CONFIG_FILE'"):
        make_spec(template__spec__env=[{"name": "FSDP_WORKER_CONFIG_FILE", "value": "/x"}])


# --- metadata --------------------------------------------------------------------------------


def test_user_labels_cannot_clobber_operator_labels() -> None:
    meta = pod()["metadata"]
    assert meta["labels"]["fsdpoperator.io/job"] == "llama"
    assert meta["labels"]["fsdpoperator.io/attempt"] == "3"
    assert meta["labels"]["fsdpoperator.io/node-rank"] == "1"
    assert meta["labels"]["fsdpoperator.io/world-size"] == "32"
    assert meta["labels"]["team"] == "nlp"
    assert meta["annotations"]["fsdpoperator.io/resume-from"] == "/ckpt/llama/step-1200"
    assert meta["annotations"]["owner"] == "alice"
    assert names.parse_attempt(meta["labels"]) == 3


def test_owner_references_on_everything() -> None:
    expected = [
        {
            "apiVersion": "fsdpoperator.io/v1alpha1",
            "kind": "FSDPJob",
            "name": "llama",
            "uid": JOB.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert pod()["metadata"]["ownerReferences"] == expected
    assert templates.service(job=JOB, spec=make_spec())["metadata"]["ownerReferences"] == expected


def test_headless_service_selects_the_jobs_pods() -> None:
    svc = templates.service(job=JOB, spec=make_spec())
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    selector = svc["spec"]["selector"]
    assert selector.items() <= pod()["metadata"]["labels"].items()


def test_pod_names_unique_per_attempt_and_within_63_chars() -> None:
    job = names.JobRef(name="x" * 200, namespace="team-a", uid=JOB.uid)
    spec = make_spec()
    all_names = [
        p["metadata"]["name"]
        for attempt in (1, 2, 10, 11)
        for p in templates.worker_pods(job, spec, decide.Launch(attempt, 4, ""))
    ]
    assert len(set(all_names)) == len(all_names) == 16
    assert max(map(len, all_names)) <= 63


# --- scheduling ------------------------------------------------------------------------------


def test_excluded_nodes_are_excluded_under_every_user_term() -> None:
    terms = pod()["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert len(terms) == 2  # the user's two ORed terms, each now excluding the nodes
    for term in terms:
        assert {
            "key": "metadata.name",
            "operator": "NotIn",
            "values": ["node-a", "node-b"],
        } in term["matchFields"]
        assert term["matchExpressions"][0]["key"] == "zone"


def test_excluded_nodes_without_user_affinity() -> None:
    spec = make_spec(template__spec__affinity=None)
    node_affinity = pod(spec, excluded_nodes=["n1"])["spec"]["affinity"]["nodeAffinity"]
    assert node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}]}
        ]
    }
    assert "nodeAffinity" not in pod(spec, excluded_nodes=[])["spec"]["affinity"]


def test_one_worker_per_node_within_an_attempt() -> None:
    anti = pod()["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert anti == [
        {
            "labelSelector": {
                "matchLabels": {"fsdpoperator.io/job": "llama", "fsdpoperator.io/attempt": "3"}
            },
            "topologyKey": "kubernetes.io/hostname",
        }
    ]


def test_user_affinity_is_not_mutated() -> None:
    spec = make_spec()
    assert spec.template.spec.affinity is not None
    before = json.dumps(spec.template.spec.affinity.to_api(), sort_keys=True)
    pod(spec)
    pod(spec)
    assert json.dumps(spec.template.spec.affinity.to_api(), sort_keys=True) == before
    assert pod(spec) == pod(spec)


def test_user_scheduling_overrides_pass_through() -> None:
    spec = pod()["spec"]
    assert spec["nodeSelector"] == {"gpu": "h100"}
    assert spec["tolerations"][0]["key"] == "gpu"
    assert spec["priorityClassName"] == "training"
    assert "schedulerName" not in spec


# --- volumes ---------------------------------------------------------------------------------


def test_checkpoint_claim_mounted_at_root() -> None:
    p = pod()
    assert {"name": "fsdp-checkpoint", "persistentVolumeClaim": {"claimName": "ckpt-rwx"}} in p[
        "spec"
    ]["volumes"]
    assert {"name": "fsdp-checkpoint", "mountPath": "/ckpt/llama"} in container(p)["volumeMounts"]
    assert {"name": "data", "mountPath": "/data", "readOnly": True} in container(p)["volumeMounts"]


def test_reserved_volume_name_is_refused_by_the_model() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"volumes.0.name\n.*'fsdp-checkpoint'"):
        make_spec(template__spec__volumes=[{"name": "fsdp-checkpoint", "emptyDir": {}}])


@pytest.mark.parametrize(
    ("volumes", "mounts", "message"),
    [
        ([{"name": "x", "emptyDir": {}}], [{"name": "x", "mountPath": "/ckpt/llama"}], "overlaps"),
        (
            [{"name": "x", "emptyDir": {}}],
            [{"name": "x", "mountPath": "/ckpt/llama/sub"}],
            "overlaps",
        ),
        ([{"name": "x", "emptyDir": {}}], [{"name": "x", "mountPath": "/dev/shm/"}], "overlaps"),
        (
            [{"name": "x", "emptyDir": {}}],
            [{"name": "y", "mountPath": "/y"}],
            r"name='y' is not one",
        ),
        ([{"name": "x", "emptyDir": {}}], [{"name": "x", "mountPath": "rel"}], "absolute"),
    ],
)
def test_user_volumes_cannot_shadow_the_operators(
    volumes: list[dict[str, Any]], mounts: list[dict[str, Any]], message: str
) -> None:
    spec = make_spec(template__spec__volumes=volumes, template__spec__volumeMounts=mounts)
    with pytest.raises(templates.TemplateError, match=message):
        pod(spec)


def test_without_claim_the_user_brings_the_checkpoint_volume() -> None:
    spec = make_spec(
        checkpoint={"root": "/ckpt/llama"},
        template__spec__volumes=[{"name": "ckpt", "persistentVolumeClaim": {"claimName": "mine"}}],
        template__spec__volumeMounts=[{"name": "ckpt", "mountPath": "/ckpt/llama"}],
    )
    p = pod(spec)
    assert "fsdp-checkpoint" not in {v["name"] for v in p["spec"]["volumes"]}
    assert {"name": "ckpt", "mountPath": "/ckpt/llama"} in container(p)["volumeMounts"]


# --- shapes and threads ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"replicas": 3, "node_rank": 0}, "replicas=3: globalBatchSize=256"),
        ({"replicas": 5}, r"replicas=5 must be within 1..spec.replicas=4"),
        ({"node_rank": 4}, r"node_rank=4 must be within 0..3"),
        ({"attempt": -1}, "attempt=-1"),
    ],
)
def test_impossible_shapes_are_rejected(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(templates.TemplateError, match=message):
        pod(**kwargs)


def test_shrunk_attempt_has_matching_sizes() -> None:
    p = pod(replicas=2, node_rank=1)
    assert "--nnodes=2" in container(p)["command"]
    assert p["metadata"]["labels"]["fsdpoperator.io/world-size"] == "16"


@pytest.mark.parametrize(
    ("resources", "user_env", "expected"),
    [
        ({"limits": {"cpu": "64"}}, [], "8"),
        ({"requests": {"cpu": "4"}}, [], "1"),
        ({"requests": {"cpu": "500m"}}, [], "1"),
        ({}, [], "1"),
        ({"limits": {"cpu": "64"}}, [{"name": "OMP_NUM_THREADS", "value": "3"}], "3"),
    ],
)
def test_omp_threads(resources: dict[str, Any], user_env: list[Any], expected: str) -> None:
    spec = make_spec(resources=resources, template__spec__env=user_env)
    values = [e["value"] for e in container(pod(spec))["env"] if e["name"] == "OMP_NUM_THREADS"]
    assert values == [expected]


def test_malformed_user_affinity_is_named() -> None:
    with pytest.raises(pydantic.ValidationError, match=r"affinity.podAntiAffinity\n"):
        make_spec(template__spec__affinity={"podAntiAffinity": ["not", "an", "object"]})
    spec = make_spec(template__spec__affinity={"podAntiAffinity": None})
    assert pod(spec)["spec"]["affinity"]["podAntiAffinity"]


def test_pods_that_choose_their_checkpoint_get_the_operators_rules() -> None:
    rules = contract.ResumeRules(attempt=2, resumed_from_step=40, expect_step=60).to_json()
    chosen = env(pod(resume_path=contract.RESUME_AUTO, resume_rules=rules))
    assert chosen[contract.ENV_RESUME] == "auto" and chosen[contract.ENV_RESUME_RULES] == rules
    assert contract.ENV_RESUME_RULES not in env(pod())  # a named checkpoint needs no rules


# --- the team's own trainer ------------------------------------------------------------------


def test_own_trainer_module_runs_under_the_operators_torchrun() -> None:
    spec = make_spec(image="registry.example/team/llm:7", trainer={"module": "team.train"})
    argv = container(pod(spec))["command"]
    assert argv[:3] == ["python", "-m", "torch.distributed.run"]
    assert "--max-restarts=0" in argv and "--node-rank=1" in argv, "the launch stays ours"
    assert argv[-2:] == ["-m", "team.train"]
    assert container(pod(spec))["image"] == "registry.example/team/llm:7"


@pytest.mark.parametrize(
    ("args", "seen"),
    [
        pytest.param(
            ["--job.dump_folder", "$(FSDP_CHECKPOINT_ROOT)"],
            ["--job.dump_folder", "/ckpt/llama/llama"],
            id="contract-variable-expanded",
        ),
        pytest.param(["--tag=a$(FSDP_ATTEMPT)b"], ["--tag=a3b"], id="inside-an-argument"),
        pytest.param(
            ["$$(FSDP_ATTEMPT)", "$HOME", "$$", "a$"],
            ["$(FSDP_ATTEMPT)", "$HOME", "$", "a$"],
            id="escaped-and-literal",
        ),
    ],
)
def test_trainer_arguments_reach_the_script_as_kubernetes_expands_them(
    args: list[str], seen: list[str]
) -> None:
    spec = make_spec(trainer={"script": "/opt/team/train.py", "args": args})
    argv, _ = container_view(pod(spec), {"HOME": "/root"})
    assert argv[-len(seen) - 1 :] == ["/opt/team/train.py", *seen]


@pytest.mark.parametrize(
    ("trainer", "message"),
    [
        pytest.param({}, "exactly one of module and script", id="neither"),
        pytest.param({"module": "a", "script": "/b.py"}, "exactly one", id="both"),
        pytest.param({"script": "train.py"}, "pattern", id="relative-script"),
        pytest.param({"script": "/opt/../etc/x.py"}, "/../", id="dotdot-script"),
        pytest.param({"module": "a;rm"}, "pattern", id="not-a-module"),
        pytest.param(
            {"module": "t", "args": ["$(HOME)"]},
            "args[0]='$(HOME)' references $(HOME)",
            id="unknown-variable",
        ),
    ],
)
def test_bad_trainer_is_refused_naming_the_field(trainer: dict[str, Any], message: str) -> None:
    with pytest.raises(pydantic.ValidationError) as err:
        make_spec(trainer=trainer)
    assert message in str(err.value) and "trainer" in str(err.value)


def test_every_rank_learns_the_config_hash_its_markers_must_carry() -> None:
    spec = make_spec()
    assert env(pod(spec))[contract.ENV_CONFIG_HASH] == spec.training.resume_hash()
    assert (
        pod(spec)["metadata"]["annotations"][names.Annotation.CONFIG_HASH.value]
        == env(pod(spec))[contract.ENV_CONFIG_HASH]
    )


def test_completion_proof_is_the_operators_not_the_workers() -> None:
    spec = make_spec(checkpoint__completion="DCPMetadata")
    assert spec.checkpoint.completion is contract.Proof.DCP_METADATA
    doc = json.loads(env(pod(spec))[contract.ENV_CONFIG])
    assert "completion" not in doc["checkpoint"], "the worker config stays what workers parse"


# --- runtime profiles ----------------------------------------------------------------------------
GPU_PROFILE = api.RuntimeProfileSpec.model_validate(
    {
        "namespaces": ["team-a"],
        "capabilities": ["IPC_LOCK", "SYS_NICE"],
        "resources": {"rdma/ib": 2, "hugepages-2Mi": "1Gi"},
        "runtimeClassName": "nvidia",
        "shmSize": "64Gi",
        "env": [{"name": "NCCL_IB_HCA", "value": "mlx5"}, {"name": "NCCL_DEBUG", "value": "INFO"}],
        "imagePullSecrets": ["regcred"],
    }
)


def test_a_pod_under_a_runtime_profile_gets_what_it_grants_and_adds() -> None:
    spec = make_spec(runtimeProfile="gpu-ib", template__spec__capabilities=["IPC_LOCK"])
    p = pod(spec, profile=GPU_PROFILE)
    c = container(p)
    assert p["metadata"]["labels"][names.Label.RUNTIME_PROFILE] == "gpu-ib"
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    for part in ("requests", "limits"):  # extended resources need both, equal
        assert c["resources"][part]["rdma/ib"] == "2"
        assert c["resources"][part]["hugepages-2Mi"] == "1Gi"
    assert (
        c["resources"]["limits"]["nvidia.com/gpu"]
        == TYPICAL["resources"]["limits"]["nvidia.com/gpu"]
    )
    assert p["spec"]["runtimeClassName"] == "nvidia"
    assert p["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    shm = next(v for v in p["spec"]["volumes"] if v["name"] == "fsdp-shm")
    assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    # the profile's NCCL defaults, but the job's own NCCL_DEBUG=WARN wins (and appears once)
    names_in_env = [e["name"] for e in c["env"]]
    assert env(p)["NCCL_IB_HCA"] == "mlx5" and names_in_env.count("NCCL_DEBUG") == 1
    assert env(p)["NCCL_DEBUG"] == "WARN"


def test_a_job_may_ask_less_of_a_profile_resource_never_more() -> None:
    spec = make_spec(
        runtimeProfile="gpu-ib", resources={"limits": {"nvidia.com/gpu": "8", "rdma/ib": "1"}}
    )
    assert container(pod(spec, profile=GPU_PROFILE))["resources"]["requests"]["rdma/ib"] == "1"
    spec = make_spec(runtimeProfile="gpu-ib", resources={"limits": {"rdma/ib": "3"}})
    with pytest.raises(templates.TemplateError, match=r"spec.resources: rdma/ib=3 exceeds"):
        pod(spec, profile=GPU_PROFILE)


def test_without_a_profile_the_pod_is_restricted_as_before() -> None:
    p = pod()
    assert names.Label.RUNTIME_PROFILE.value not in p["metadata"]["labels"]
    assert container(p)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "runtimeClassName" not in p["spec"] and "imagePullSecrets" not in p["spec"]
    with pytest.raises(pydantic.ValidationError, match="needs spec.runtimeProfile"):
        make_spec(template__spec__capabilities=["IPC_LOCK"])
    with pytest.raises(pydantic.ValidationError, match="rdma/ib comes only from a runtime"):
        make_spec(resources={"limits": {"rdma/ib": "1"}})


@pytest.mark.parametrize(
    ("namespace", "changes", "refusal"),
    [
        pytest.param("team-b", {}, "namespace 'team-b' is not one of", id="namespace"),
        pytest.param("team-a", {"runtimeProfile": "gone"}, "no FSDPRuntimeProfile", id="missing"),
        pytest.param(
            "team-a",
            {"image": "registry.test/ml/w:1"},
            None,
            id="any-registry-when-none-listed",
        ),
    ],
)
def test_the_operator_checks_the_profile_as_admission_does(
    namespace: str, changes: dict[str, Any], refusal: str | None
) -> None:
    spec = make_spec(**{"runtimeProfile": "gpu-ib", **changes})
    job = names.JobRef(name=JOB.name, namespace=namespace, uid=JOB.uid)
    profile = None if spec.runtime_profile == "gone" else GPU_PROFILE
    launch = decide.Launch(attempt=1, replicas=4, resume_path="")
    if refusal is None:
        templates.worker_pod(job, spec, launch, node_rank=0, profile=profile)
        return
    with pytest.raises(templates.TemplateError, match=refusal):
        templates.worker_pod(job, spec, launch, node_rank=0, profile=profile)


def test_the_gpu_rdma_example_job_gets_its_profile() -> None:
    root = pathlib.Path(__file__).resolve().parents[2] / "examples"
    values = yaml.safe_load((root / "chart-values" / "gpu-rdma.yaml").read_text())
    profile = api.RuntimeProfileSpec.model_validate(values["runtimeProfiles"]["gpu-rdma"])
    doc = yaml.safe_load((root / "llama-7b-rdma.yaml").read_text())
    spec = api.FSDPJobSpec.model_validate(doc["spec"])
    job = names.JobRef(name="llama-7b", namespace="team-a", uid=JOB.uid)
    p = templates.worker_pod(job, spec, decide.Launch(1, 16, ""), node_rank=3, profile=profile)
    c = container(p)
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert c["resources"]["limits"]["rdma/rdma_shared_device_a"] == "1"
    assert p["spec"]["runtimeClassName"] == "nvidia"
    assert env(p)["NCCL_IB_GID_INDEX"] == "3"
    elsewhere = names.JobRef(name="llama-7b", namespace="team-b", uid=JOB.uid)
    with pytest.raises(templates.TemplateError, match="namespace 'team-b'"):
        templates.worker_pod(
            elsewhere, spec, decide.Launch(1, 16, ""), node_rank=0, profile=profile
        )


def test_the_gpu_efa_example_job_gets_its_efa_interfaces_and_the_plugin_variables() -> None:
    """examples/llama-7b-efa.yaml under examples/chart-values/gpu-efa.yaml: every EFA interface
    of the node, IPC_LOCK, and the variables that make NCCL load aws-ofi-nccl and libfabric use
    EFA only (docs/install.md, "EFA")."""
    root = pathlib.Path(__file__).resolve().parents[2] / "examples"
    values = yaml.safe_load((root / "chart-values" / "gpu-efa.yaml").read_text())
    profile = api.RuntimeProfileSpec.model_validate(values["runtimeProfiles"]["gpu-efa"])
    doc = yaml.safe_load((root / "llama-7b-efa.yaml").read_text())
    spec = api.FSDPJobSpec.model_validate(doc["spec"])
    job = names.JobRef(name="llama-7b-efa", namespace="team-a", uid=JOB.uid)
    p = templates.worker_pod(job, spec, decide.Launch(1, 16, ""), node_rank=0, profile=profile)
    c = container(p)
    assert c["securityContext"]["capabilities"]["add"] == ["IPC_LOCK"]
    assert c["resources"]["limits"]["vpc.amazonaws.com/efa"] == "32"
    assert c["resources"]["requests"]["vpc.amazonaws.com/efa"] == "32"
    variables = env(p)
    assert (variables["FI_PROVIDER"], variables["NCCL_NET_PLUGIN"]) == ("efa", "ofi")
    assert "vpc.amazonaws.com/efa" in values["admissionPolicies"]["profileOnlyResources"]


def test_a_quantity_written_as_a_number_reaches_the_pod_as_a_quantity() -> None:
    """`nvidia.com/gpu: 8` in YAML is an int; the pod API wants a quantity string (the
    operator's create failed with a pydantic error before)."""
    spec = api.FSDPJobSpec.model_validate(
        {**TYPICAL, "resources": {"limits": {"nvidia.com/gpu": 8}, "requests": {"cpu": 2}}}
    )
    pod = templates.worker_pod(JOB, spec, decide.Launch(1, 2, ""), node_rank=0)
    res = pod["spec"]["containers"][0]["resources"]
    assert res["limits"] == {"nvidia.com/gpu": "8"} and res["requests"] == {"cpu": "2"}


# --- a runtime profile's pod fragments (GKE's GPUDirect-TCPX) -----------------------------------
def _tcpx() -> tuple[api.RuntimeProfileSpec, api.FSDPJobSpec]:
    root = pathlib.Path(__file__).resolve().parents[2] / "examples"
    values = yaml.safe_load((root / "chart-values" / "gpu-tcpx.yaml").read_text())
    profile = api.RuntimeProfileSpec.model_validate(values["runtimeProfiles"]["gpu-tcpx"])
    doc = yaml.safe_load((root / "llama-7b-tcpx.yaml").read_text())
    return profile, api.FSDPJobSpec.model_validate(doc["spec"])


TCPX_JOB = names.JobRef(name="llama-7b-tcpx", namespace="team-a", uid=JOB.uid)


def test_every_pod_of_a_tcpx_job_gets_the_profiles_network_daemon_and_plugin() -> None:
    """examples/llama-7b-tcpx.yaml under examples/chart-values/gpu-tcpx.yaml: rank pods and
    spares alike run on the node's network with the daemon beside the worker, never as a rank."""
    profile, spec = _tcpx()
    launch = decide.Launch(1, 16, "")
    ranks = [
        templates.worker_pod(TCPX_JOB, spec, launch, node_rank=r, profile=profile) for r in (0, 5)
    ]
    spare = templates.spare_pod(TCPX_JOB, spec, launch, index=0, profile=profile)
    for p in [*ranks, spare]:
        assert (p["spec"]["hostNetwork"], p["spec"]["dnsPolicy"]) == (
            True,
            "ClusterFirstWithHostNet",
        )
        assert p["metadata"]["annotations"]["sidecar.istio.io/inject"] == "false"
        volumes = {v["name"]: v for v in p["spec"]["volumes"]}
        assert volumes["tcpx-libraries"]["hostPath"]["path"] == "/home/kubernetes/bin/nvidia/lib64"
        assert volumes["tcpx-socket"] == {"name": "tcpx-socket", "emptyDir": {}}
        mounts = {m["mountPath"]: m for m in container(p)["volumeMounts"]}
        assert mounts["/usr/local/nvidia/lib64"] == {
            "name": "tcpx-libraries",
            "mountPath": "/usr/local/nvidia/lib64",
            "readOnly": True,
        }
        assert mounts["/run/tcpx"]["name"] == "tcpx-socket"
        (daemon,) = p["spec"]["initContainers"]
        assert daemon["name"] == "tcpx-daemon" and daemon["restartPolicy"] == "Always"
        assert daemon["securityContext"]["privileged"] is True
        assert daemon["securityContext"]["runAsNonRoot"] is False  # the pod's says true
        assert "allowPrivilegeEscalation" not in daemon["securityContext"]  # refused beside it
        assert [c["name"] for c in p["spec"]["containers"]] == [names.CONTAINER_NAME]
        variables = env(p)
        assert variables["NCCL_GPUDIRECTTCPX_UNIX_CLIENT_PREFIX"] == "/run/tcpx"
        assert variables["NCCL_GPUDIRECTTCPX_SOCKET_IFNAME"] == "eth1,eth2,eth3,eth4"
        # the worker stays restricted: only the capability the job asked and the profile grants
        assert container(p)["securityContext"]["capabilities"] == {
            "drop": ["ALL"],
            "add": ["IPC_LOCK"],
        }


def test_a_job_under_no_profile_gets_none_of_the_fragments() -> None:
    _, spec = _tcpx()
    bare = api.FSDPJobSpec.model_validate(
        {**spec.model_dump(by_alias=True, exclude_none=True), "runtimeProfile": None}
        | {"template": {"spec": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}}}
    )
    p = templates.worker_pod(TCPX_JOB, bare, decide.Launch(1, 16, ""), node_rank=0)
    assert "hostNetwork" not in p["spec"] and "dnsPolicy" not in p["spec"]
    assert "initContainers" not in p["spec"]
    assert all("hostPath" not in v for v in p["spec"]["volumes"])
    assert "sidecar.istio.io/inject" not in p["metadata"]["annotations"]


def test_the_profiles_annotations_win_over_the_jobs_and_the_operators_over_both() -> None:
    profile = api.RuntimeProfileSpec(namespaces=["team-a"], annotations={"mesh/inject": "false"})
    spec = make_spec(
        runtimeProfile="p",
        template__metadata__annotations={"mesh/inject": "true", "owner": "alice"},
    )
    annotations = pod(spec, profile=profile)["metadata"]["annotations"]
    assert (annotations["mesh/inject"], annotations["owner"]) == ("false", "alice")
    with pytest.raises(pydantic.ValidationError, match="fsdpoperator.io/resume-from"):
        api.RuntimeProfileSpec(annotations={"fsdpoperator.io/resume-from": "/elsewhere"})


_SOCKET = {"name": "sock", "emptyDir": {}}


@pytest.mark.parametrize(
    ("profile", "job", "refusal"),
    [
        pytest.param(
            {"volumes": [_SOCKET]},
            {"template__spec__volumes": [{"name": "sock", "emptyDir": {}}]},
            r"template.spec.volumes\[0\].name='sock' is also runtime profile 'p''s volumes\[0\]",
            id="volume-name",
        ),
        pytest.param(
            {"sidecars": [{"name": "daemon", "image": "d:1"}]},
            {"template__spec__initContainers": [{"name": "daemon", "image": "busybox:1"}]},
            r"template.spec.initContainers\[0\].name='daemon' is also runtime profile 'p''s"
            r" sidecars\[0\]",
            id="sidecar-name",
        ),
        pytest.param(
            {"volumes": [_SOCKET], "volumeMounts": [{"name": "sock", "mountPath": "/tmp/x"}]},
            {},
            r"volumeMounts\[0\].mountPath='/tmp/x' overlaps '/tmp'",
            id="operator-path",
        ),
        pytest.param(
            {"volumes": [_SOCKET], "volumeMounts": [{"name": "sock", "mountPath": "/data"}]},
            {},
            r"mountPath='/data' is also template.spec.volumeMounts\[0\].mountPath",
            id="job-path",
        ),
    ],
)
def test_a_clash_between_the_profiles_parts_and_the_jobs_names_both(
    profile: dict[str, Any], job: dict[str, Any], refusal: str
) -> None:
    given = api.RuntimeProfileSpec.model_validate({"namespaces": ["team-a"], **profile})
    with pytest.raises(templates.TemplateError, match=refusal):
        pod(make_spec(runtimeProfile="p", **job), profile=given)


@pytest.mark.parametrize(
    ("profile", "refusal"),
    [
        pytest.param(
            {"volumeMounts": [{"name": "nope", "mountPath": "/x"}]},
            r"volumeMounts\[0\].name='nope' is not one of the profile's volumes",
            id="mount-of-no-volume",
        ),
        pytest.param(
            {"sidecars": [{"name": "d", "image": "d:1", "restartPolicy": None}]},
            "only Always",
            id="sidecar-not-native",
        ),
        pytest.param(
            {"volumes": [{"name": "v", "hostPath": {"path": "/a/../etc"}}]},
            "an absolute path without '..'",
            id="hostpath-dotdot",
        ),
        pytest.param(
            {"volumes": [{"name": "v", "hostPath": {"path": "/a"}, "emptyDir": {}}]},
            "exactly one is allowed",
            id="two-sources",
        ),
    ],
)
def test_a_profile_with_broken_fragments_is_refused_naming_the_field(
    profile: dict[str, Any], refusal: str
) -> None:
    with pytest.raises(pydantic.ValidationError, match=refusal):
        api.RuntimeProfileSpec.model_validate(profile)

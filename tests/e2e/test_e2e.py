"""A platform team's first day: the chart's operator, the real worker image, real faults.

Runs against any kubeconfig (tests/e2e/conftest.py): on this machine, kubelet nodes with the
images built here; elsewhere, a kind cluster (``make kind-e2e``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path
from typing import Any

import pytest
import yaml

from fsdp_operator.io import observe
from fsdp_operator.types import names
from fsdp_worker import contract
from fsdp_worker.contract import catalog, selection
from fsdp_worker.runtime import faults as faults_mod
from harness import prometheus, stack
from localcluster import poll
from tests.e2e.conftest import E2E, NAMESPACE, PROFILE, RELEASE, WORKER_UID

# Longer than any one wait below, so a wait that runs out says why (status, Events, the
# operator's log) before pytest-timeout would stop the test without a word.
pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.timeout(900)]
STEPS = 300


def _job(e2e: E2E, name: str, **spec: Any) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((stack.ROOT / "examples" / "tiny-cpu.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"].update(image=e2e.worker_image)
    doc["spec"]["resources"] = {"requests": {"cpu": "500m", "memory": "1Gi"}}
    # A gang of real torch ranks meets slowly on a loaded node (seen: not in 107 s, three jobs
    # importing torch at once beside the CPU tier): the start gets its own deadline.
    doc["spec"]["failurePolicy"].update(
        nodeLossGraceSeconds=4, progressDeadlineSeconds=90, startupDeadlineSeconds=240
    )
    for key, value in spec.items():
        current = doc["spec"].get(key)
        doc["spec"][key] = {**current, **value} if isinstance(current, dict) else value
    return doc


def _wait(jobs: stack.Jobs, name: str, what: str, probe: Any, *, timeout: float = 300) -> Any:
    return poll.until(what, probe, timeout=timeout, every=1.0, diagnosis=lambda: _story(jobs, name))


def _story(jobs: stack.Jobs, name: str) -> str:
    """What a user would look at when a job does not get there: its status, its Events, its
    pods' states and the operator replicas' last log lines."""
    pods = [
        (
            p["metadata"]["name"],
            p["status"].get("phase"),
            [c.get("state") for c in p["status"].get("containerStatuses") or []],
        )
        for p in jobs.pods(name)
    ]
    log = jobs.cluster.kubectl(
        "logs",
        "-n",
        NAMESPACE,
        "-l",
        "app.kubernetes.io/name=fsdp-operator",
        "--prefix",
        "--tail=80",
        check=False,
    )
    return "\n".join(
        [
            f"status: {json.dumps(jobs.status(name))[:3000]}",
            f"events: {jobs.events(name)[-20:]}",
            f"pods: {pods}",
            jobs.pods_report(name, log_lines=40),  # what a pod that does not end was doing
            f"operator log:\n{log.stdout[-6000:]}{log.stderr[-500:]}",
        ]
    )


def _running(jobs: stack.Jobs, name: str, attempt: int) -> list[dict[str, Any]]:
    def probe() -> list[dict[str, Any]] | None:
        s = jobs.status(name)
        pods = jobs.running_pods(name, attempt)
        return pods if s.get("attempt") == attempt and len(pods) == s.get("replicas") else None

    return list(_wait(jobs, name, f"attempt {attempt} running", probe))


def test_operator_runs_from_the_chart_with_in_cluster_credentials(e2e: E2E) -> None:
    pod = e2e.operator.running_pod()
    container = pod["spec"]["containers"][0]
    assert container["image"] == e2e.operator_image
    assert not any(v["name"] == "KUBECONFIG" for v in container.get("env", []))
    assert any("projected" in v for v in pod["spec"]["volumes"]), "a ServiceAccount token"
    status = pod["status"]["containerStatuses"][0]
    assert status["ready"] and status["restartCount"] == 0
    ip = pod["status"]["podIP"]
    with urllib.request.urlopen(f"http://{ip}:8080/healthz", timeout=5) as answer:
        assert answer.status == 200, "the liveness probe's endpoint"
    with urllib.request.urlopen(e2e.operator.metrics_url(), timeout=5) as answer:
        page = answer.read()
    assert b"fsdpjob_jobs" in page, "the operator's own metrics, scraped from its pod"
    assert b"fsdpjob_operator_leader 1.0" in page


def test_the_charts_two_replicas_run_on_two_nodes_and_one_leads(e2e: E2E) -> None:
    leader = e2e.operator.running_pod()
    replicas = e2e.operator.running_pods()
    assert len(replicas) == 2, "values.yaml: replicas 2"
    assert all(p["status"]["containerStatuses"][0]["ready"] for p in replicas)
    nodes = e2e.kube.get_json("nodes")["items"]
    if len(nodes) > 1:  # preferred anti-affinity spreads them (a one-node kind cannot)
        assert len({p["spec"]["nodeName"] for p in replicas}) == 2
    standby = next(p for p in replicas if p["metadata"]["uid"] != leader["metadata"]["uid"])
    url = f"http://{standby['status']['podIP']}:8000/metrics"
    with urllib.request.urlopen(url, timeout=5) as answer:
        page = answer.read()
    assert b"fsdpjob_operator_leader 0.0" in page, "the standby does not act"
    assert b"fsdpjob_reconcile_passes_total 0.0" in page
    pdb = e2e.kube.get_json("pdb", "-n", e2e.operator.namespace)["items"]
    assert [p["spec"]["minAvailable"] for p in pdb] == [1]


def test_trainers_survive_a_rank_crash_in_place_or_recreated_and_a_lost_node(
    e2e: E2E, namespace: str
) -> None:
    """Three jobs at once, sharing the faults, in a namespace that denies all traffic but what
    examples/networkpolicy.yaml lets through (issue 21): the gang, DNS, the keepers' coordinator
    and the operator's scrape.

    - "survivor", the built-in trainer under the admin's runtime profile (conftest's PROFILE):
      its pods run with IPC_LOCK on the real runtime, as a tenant namespace for RDMA jobs is
      set up (docs/install.md). A rank's crash restarts its real torch ranks in place (issue
      23) from the warm launcher, loading the memory tier.
    - "kit", a team's own script on the trainer kit (markers, exact data cursor): its crash
      restarts in place too, the warm launcher running the script as `__main__`.
    - "titan", a team's own trainer that knows nothing of the operator (torchtitan's layout,
      `.metadata` as the proof), without restarts in place: its crash recreates the gang.

    Then a node that runs a pod of each is lost: every job is recreated, and resumes from its
    newest complete checkpoint. The team's two jobs run beside the survivor's pods (a pod
    affinity), so the lost node holds a pod of each."""
    e2e.tenant_policies(namespace)
    e2e.kube.kubectl(
        "label",
        "namespace",
        namespace,
        "--overwrite",
        "pod-security.kubernetes.io/enforce=privileged",
    )
    patch = json.dumps({"spec": {"namespaces": [namespace]}})
    e2e.kube.kubectl("patch", "fsdpruntimeprofiles", PROFILE, "--type=merge", "-p", patch)
    jobs = stack.Jobs(e2e.kube, namespace)
    # ~0.3 s a step here: long enough that the node loss lands mid-run (detection ~12 s).
    job = _job(
        e2e,
        "survivor",
        training={"steps": STEPS},
        runtimeProfile=PROFILE,
        template={"spec": {"capabilities": ["IPC_LOCK"]}},
        checkpoint={"memory": {"intervalSteps": 3, "sizeLimit": "256Mi"}},
        failurePolicy={"inPlaceRestarts": 2},
    )
    # the profile's patch reaches the admission policy through a watch: a moment behind
    poll.until(
        "the survivor admitted under its profile",
        lambda: e2e.kube.kubectl(
            "apply",
            "-n",
            namespace,
            "-f",
            "-",
            input=json.dumps(job),
            check=False,
        ).returncode
        == 0,
        timeout=30,
    )
    # The team's pods go where the survivor's are (two nodes), so a node loss hits all three.
    survivors = {names.Label.JOB.value: names.job_label_value("survivor")}
    term = {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": survivors}}
    beside = {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}
    kit = {"script": "/opt/fsdp-examples/plain_fsdp.py", "args": ["--step-seconds", "0.2"]}
    jobs.apply(
        _own_trainer_job(
            e2e,
            "kit",
            kit,
            template={"spec": {"affinity": beside}},
            failurePolicy={"inPlaceRestarts": 2},
        )
    )
    titan_args = [
        "--dump-folder",
        "$(FSDP_CHECKPOINT_ROOT)",
        "--folder",
        ".",
        "--steps",
        str(OWN_STEPS),
        "--interval",
        "20",
        "--step-seconds",
        "0.2",
    ]
    titan = {"script": "/opt/fsdp-examples/titan_layout.py", "args": titan_args}
    # It serves no progress: hang detection would count from its start (docs/contract.md).
    jobs.apply(
        _own_trainer_job(
            e2e,
            "titan",
            titan,
            template={"spec": {"affinity": beside}},
            checkpoint={"completion": "DCPMetadata"},
            failurePolicy={"progressDeadlineSeconds": 3600},
        )
    )
    ckpt = e2e.claims[namespace, "ckpt"]
    proofs = {
        "survivor": contract.Proof.MARKER,
        "kit": contract.Proof.MARKER,
        "titan": contract.Proof.DCP_METADATA,
    }

    def sealed(name: str) -> int:
        root = ckpt / name
        if not root.is_dir():
            return 0
        found = selection.list_checkpoints(catalog.LocalStorage(str(root)), ".", proof=proofs[name])
        return max((c.step for c in found if c.ok), default=0)

    def trains_on(attempt: int) -> dict[str, list[dict[str, Any]]]:
        """Each job's pods of `attempt`, once that attempt has sealed a checkpoint (the faults
        land by the checkpoints on disk, not by status.step: that is scraped every
        progressDeadlineSeconds / 4, and a CI run whose steps took 0.16 s had a job 125 steps
        further than its status said)."""
        running = {name: _running(jobs, name, attempt) for name in proofs}

        def sealed_in(name: str, before: int) -> bool:
            # a checkpoint of a later attempt is not this one's: its pods are gone (seen: an
            # attempt whose gang never met, the faults then aimed at pods being deleted)
            now = jobs.status(name).get("attempt")
            assert now == attempt, f"{name} is at attempt {now}, not {attempt}\n" + _story(
                jobs, name
            )
            return sealed(name) > before

        for name, before in {name: sealed(name) for name in proofs}.items():
            _wait(
                jobs,
                name,
                f"a checkpoint of attempt {attempt}",
                lambda n=name, b=before: sealed_in(n, b),
            )
        return running

    first = trains_on(1)
    _report_capabilities(e2e, namespace, first["survivor"][0])
    uids = {name: {p["metadata"]["uid"] for p in pods} for name, pods in first.items()}
    crashed = {name: sealed(name) for name in proofs}
    e2e.faults.kill_rank(namespace, first["survivor"][1]["metadata"]["name"], rank=2)
    for name in ("kit", "titan"):
        e2e.faults.kill_rank(namespace, first[name][1]["metadata"]["name"], rank=1)

    def restarted(name: str) -> dict[str, Any] | None:
        s = jobs.status(name)
        done = (s.get("history") or [{}])[-1].get("restartsInPlace") or []
        return done[0] if done and done[0].get("resumed") else None

    for name in ("survivor", "kit"):
        restart = _wait(
            jobs, name, "a restart in place after the crash", lambda n=name: restarted(n)
        )
        s = jobs.status(name)
        story = lambda n=name: _story(jobs, n)  # noqa: E731  (read only when an assert fails)
        assert s["attempt"] == 1 and s["lastFailure"]["cause"] == "Crash", story()
        # the killed rank's pod is blamed, not a survivor whose peer vanished (issue 42's demo)
        assert s["lastFailure"]["pod"] == first[name][1]["metadata"]["name"], story()
        assert restart["resumedFromStep"] >= crashed[name], (restart, story())
        assert {p["metadata"]["uid"] for p in jobs.running_pods(name, 1)} == uids[name]
        log = jobs.cluster.kubectl("logs", "-n", namespace, f"{name}-a1-0", check=False).stdout
        assert "generation 1 starts from the warm launcher" in log, log[-3000:]
        if name == "survivor":  # every rank held the same sealed step
            assert restart["fromMemory"] is True and restart["stepsLost"] <= 3, (restart, story())
    titan = _restarted(jobs, "titan", 2, "Crash")["lastFailure"]
    assert titan["pod"] == first["titan"][1]["metadata"]["name"], titan  # recreated: the same
    # Every job seals again after its restart (the policies let the scrape through: the
    # operator saw the restarted ranks step) before the node goes.
    pods = {
        name: _running(jobs, name, attempt)
        for name, attempt in (("survivor", 1), ("kit", 1), ("titan", 2))
    }
    for name, before in {name: sealed(name) for name in proofs}.items():
        _wait(jobs, name, "a checkpoint after the restart", lambda n=name, b=before: sealed(n) > b)
    lost = pods["survivor"][1]["spec"]["nodeName"]
    for name in ("kit", "titan"):  # beside the survivor's pods
        assert lost in {p["spec"]["nodeName"] for p in pods[name]}, (lost, pods[name])
    e2e.faults.lose_node(lost, freeze=names.Label.JOB.value)  # its pods stop too
    try:
        for name, attempt in (("survivor", 2), ("kit", 2), ("titan", 3)):
            s = _restarted(jobs, name, attempt, "NodeLost")
            assert s["lastFailure"]["node"] == lost, _story(jobs, name)
    finally:
        e2e.faults.restore_node(lost)
    done = {
        name: _wait(
            jobs,
            name,
            "Succeeded",
            lambda n=name: (s := jobs.status(n)).get("phase") == "Succeeded" and s,
            timeout=600,
        )
        for name in proofs
    }
    assert done["survivor"]["step"] == STEPS and done["survivor"]["restarts"]["total"] >= 2
    for name in proofs:  # succeeded, but a pod did not end: the CI log says why (a warning)
        if "PodsDidNotExit" in jobs.events(name):
            warnings.warn(
                f"{name}: pods did not exit:\n{jobs.evidence(name)[-4000:]}", stacklevel=1
            )
    _check_checkpoints(ckpt / "survivor", global_batch=16)
    assert all(s["restarts"]["total"] >= 2 for s in done.values()), done
    # The operator reads no claim (the chart's default): the kit's rank 0 reports what it
    # sealed; titan reports nothing, and only its files say how far it got.
    assert done["kit"]["lastCheckpoint"]["step"] == OWN_STEPS, done["kit"]
    assert sealed("titan") == OWN_STEPS
    found = selection.list_checkpoints(catalog.LocalStorage(str(ckpt / "kit")), ".")
    markers = [c.marker for c in found if c.ok and c.marker is not None]
    last = max(markers, key=lambda m: m.step)
    assert last.step == OWN_STEPS and last.attempt >= 2 and (last.resumed_from_step or 0) > 0
    assert all(m.samples_consumed == m.step * 16 for m in markers), "the kit's data cursor"
    rank0 = names.pod_name("titan", attempt=done["titan"]["attempt"], node_rank=0)
    log = jobs.cluster.kubectl("logs", "-n", namespace, rank0, check=False).stdout
    assert re.search(r"loaded the checkpoint from \S+/step-\d+", log), log[-2000:]


def _report_capabilities(e2e: E2E, namespace: str, pod: dict[str, Any]) -> None:
    """The profile's capability reaches the container on the real runtime (its bounding set
    is IPC_LOCK alone), and its NCCL variable the environment. Printed: the effective set and
    the memlock limit the non-root worker really has (docs/operations.md, "Runtime profiles")."""
    name = pod["metadata"]["name"]
    shell = "grep -E '^Cap(Bnd|Eff)' /proc/self/status; ulimit -l; echo $NCCL_SOCKET_IFNAME"
    out = e2e.kube.kubectl("exec", "-n", namespace, name, "--", "sh", "-c", shell).stdout
    print(f"\n{name} under runtime profile {PROFILE}:\n{out}")
    caps = dict(line.split(":\t") for line in out.splitlines() if line.startswith("Cap"))
    assert int(caps["CapBnd"], 16) == 1 << 14, out  # CAP_IPC_LOCK, nothing else
    assert out.strip().splitlines()[-1] == "eth0", out


def _sealed(root: Path, *, attempt: int) -> int | None:
    """The newest step `attempt` sealed under `root` (None: none yet)."""
    found = (
        selection.list_checkpoints(catalog.LocalStorage(str(root)), ".") if root.is_dir() else []
    )
    steps = [c.step for c in found if c.ok and c.marker is not None and c.marker.attempt == attempt]
    return max(steps, default=None)


def _check_checkpoints(root: Path, *, global_batch: int) -> None:
    """Every sealed checkpoint: its data cursor is exactly step x global batch (no sample
    skipped or repeated across the restarts), and it was written by the non-root worker."""
    storage = catalog.LocalStorage(str(root))
    found = selection.list_checkpoints(storage, ".")
    sealed = [c for c in found if c.ok and c.marker is not None]
    assert sealed, f"no sealed checkpoint under {root}"
    for candidate in sealed:
        marker = candidate.marker
        assert marker is not None
        assert marker.samples_consumed == marker.step * global_batch, candidate.path
        step_dir = root / catalog.step_dir_name(marker.step)
        for path in (step_dir, *step_dir.iterdir()):
            assert path.stat().st_uid == WORKER_UID, f"{path} not written by uid {WORKER_UID}"
    last = max(sealed, key=lambda c: c.step).marker
    assert last is not None and last.step == STEPS
    assert last.attempt >= 2 and (last.resumed_from_step or 0) > 0, "resumed, not restarted"


def test_worker_over_its_memory_limit_is_oom_killed(e2e: E2E, namespace: str) -> None:
    jobs = stack.Jobs(e2e.kube, namespace)
    # 165 M parameters (660 MB in fp32) plus torch itself, against a 1 GiB limit.
    model = {
        "preset": "custom",
        "vocabSize": 32000,
        "seqLen": 32,
        "dim": 1024,
        "nLayers": 8,
        "nHeads": 8,
    }
    doc = _job(
        e2e,
        "hungry",
        replicas=1,
        minReplicas=1,
        nprocPerNode=1,
        training={"model": model, "steps": 20},
        failurePolicy={"maxRestarts": 0},
    )
    doc["spec"]["resources"] = {"limits": {"memory": "1Gi"}, "requests": {"memory": "1Gi"}}
    jobs.apply(doc)
    done = _wait(
        jobs,
        "hungry",
        "Failed",
        lambda: (s := jobs.status("hungry")).get("phase") == "Failed" and s,
    )
    assert done["lastFailure"]["cause"] == "OOMKilled", done["lastFailure"]
    pod = next(p for p in jobs.pods("hungry"))
    terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["reason"] == "OOMKilled", "the kernel, not a test hook, killed it"


def test_failing_ranks_termination_message_reaches_last_failure(e2e: E2E, namespace: str) -> None:
    jobs = stack.Jobs(e2e.kube, namespace)
    data = {"kind": "tokenFile", "path": "/ckpt/no-such-tokens.bin"}
    jobs.apply(_job(e2e, "misconfigured", replicas=1, minReplicas=1, training={"data": data}))
    done = _wait(
        jobs,
        "misconfigured",
        "Failed",
        lambda: (s := jobs.status("misconfigured")).get("phase") == "Failed" and s,
    )
    failure = done["lastFailure"]
    assert failure["cause"] == "ConfigError", failure
    assert "no-such-tokens.bin" in failure["message"], "the rank's own words, via torchrun"
    assert done["restarts"]["total"] == 0, "a config error is not retried"


OWN_STEPS = 400  # at >= 0.2 s a step: the node loss lands while both jobs still train


def _own_trainer_job(e2e: E2E, name: str, trainer: dict[str, Any], **spec: Any) -> dict[str, Any]:
    """A job running one of examples/trainers/ (in the worker image at /opt/fsdp-examples)."""
    doc = _job(e2e, name, nprocPerNode=1, training={"steps": OWN_STEPS}, **spec)
    doc["spec"]["trainer"] = trainer
    return doc


def _restarted(jobs: stack.Jobs, name: str, attempt: int, cause: str) -> dict[str, Any]:
    """Wait for `attempt` of job `name`, and check the failure that led to it."""
    s = _wait(
        jobs,
        name,
        f"attempt {attempt} after {cause}",
        lambda: (s := jobs.status(name)).get("attempt", 0) >= attempt and s,
    )
    assert s["lastFailure"]["cause"] == cause, _story(jobs, name)
    return dict(s)


def _faulty(e2e: E2E, name: str, faults: str, **spec: Any) -> dict[str, Any]:
    doc = _job(e2e, name, **spec)
    doc["spec"]["template"] = {
        "spec": {"env": [{"name": faults_mod.ENV_POD_FAULTS, "value": faults}]}
    }
    return doc


def _fsdpctl(e2e: E2E, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(e2e.kube.kubeconfig), "COLUMNS": "200"}
    return subprocess.run(
        [sys.executable, "-m", "fsdp_operator.cli", "-n", namespace, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_why_a_hang_and_two_ooms_failed_is_told_after_the_pods_are_gone(
    e2e: E2E, namespace: str
) -> None:
    """The FSDP article's debugging advice, in the product: a hang names the rank that is not
    where the others are and keeps every rank's stacks and logs; a kernel OOM kill comes with
    the phase it hit (backward, checkpoint save) and a repeat in the same phase stops the job."""
    jobs = stack.Jobs(e2e.kube, namespace)
    # The start has its own allowance: these jobs start ten ranks on two cores, and with 40 s to
    # the first step a busy run declared "blocked" hung before it, with no phase to tell; the
    # stalls at step 8 are caught 30 s after step 7.
    hang_policy = {"progressDeadlineSeconds": 30, "startupDeadlineSeconds": 120, "maxRestarts": 0}
    # rank 2 (pod 1's first) stops in data loading at step 8; the others wait for it
    jobs.apply(_faulty(e2e, "stuck", "stall_at=2:8:data", failurePolicy=hang_policy))
    # rank 1 (pod 0's second) stops before step 8's end-of-step all_reduce
    jobs.apply(_faulty(e2e, "blocked", "stall_at=1:8:sync", failurePolicy=hang_policy))
    one = {"replicas": 1, "minReplicas": 1, "nprocPerNode": 1}
    limits = {"limits": {"memory": "2Gi"}, "requests": {"cpu": "500m", "memory": "2Gi"}}
    jobs.apply(_faulty(e2e, "oom-backward", "oom_at=0:6:backward", resources=limits, **one))
    jobs.apply(
        _faulty(
            e2e,
            "oom-save",
            "oom_at=0:20:save",
            resources=limits,
            **one,
            failurePolicy={"maxRestarts": 0},
        )
    )
    # Where a NetworkPolicy keeps the operator from rank 0's metrics (issue 21), its silence is
    # no evidence: "blind" trains on past its deadline untouched, and "stuck" is still caught
    # as Hang, on the kubelet's readiness probe of its rank 0.
    blind_policy = {**hang_policy, "startupDeadlineSeconds": 75}
    jobs.apply(
        _faulty(
            e2e,
            "blind",
            "step_sleep=1",
            **one,
            failurePolicy=blind_policy,
            training={"steps": 100000},
        )
    )
    for name in ("blind", "stuck"):
        e2e.gang_only(namespace, name)
    blocked_at = time.time()
    names_ = ("stuck", "blocked", "oom-backward", "oom-save")
    failed: dict[str, dict[str, Any]] = {}
    for name in names_:
        failed[name] = _wait(
            jobs,
            name,
            "Failed",
            lambda name=name: (s := jobs.status(name)).get("phase") == "Failed" and s,
        )
        print(f"{name}: Failed seen {time.time() - blocked_at:.0f}s after the jobs were applied")
    _blind_job_trains_on(e2e, jobs, blocked_at, deadline=30, startup=75)

    blocked = failed["blocked"]["lastFailure"]
    assert blocked["cause"] == "Hang" and blocked["pod"] == "blocked-a1-0", blocked
    assert blocked.get("phase") == "end-of-step sync" and blocked.get("step") == 7, blocked
    assert re.match(
        r"ranks 0,2,3 wait in all_reduce #\d+ \(end-of-step sync, step 8\); "
        r"rank 1 in end-of-step sync at step 8, 1 collective behind",
        blocked["evidence"],
    ), blocked
    evidence = e2e.claims[namespace, "ckpt"] / "blocked" / ".evidence" / "attempt-1"
    assert "in stall_if" in (evidence / "rank-1.txt").read_text(), "its stack is kept"
    assert "in all_reduce" in (evidence / "rank-0.txt").read_text()

    hang = failed["stuck"]["lastFailure"]
    assert hang["cause"] == "Hang" and hang.get("rank") == 1, hang
    assert "readiness probe reports no step progress" in hang["message"], hang
    assert hang.get("phase") == "data loading", hang
    assert hang["pod"] == "stuck-a1-1" and hang["node"], hang
    assert hang["step"] == 7, hang
    # FSDP2's all-gather: all_gather_into_tensor up to torch 2.9, all_gather_single since
    gather = r"all_gather_(into_tensor|single)"
    assert re.match(
        rf"ranks 0,1,3 wait in {gather} #\d+ \(forward, step 8\); "
        r"rank 2 in data loading at step 8",
        hang["evidence"],
    ), hang
    assert hang["diagnosis"].startswith("rank 2 not where the others are")
    assert "FailureExplained" in jobs.events("stuck")

    backward = failed["oom-backward"]
    assert backward["message"].startswith(
        "OOMKilled twice in backward: out of memory in " "backward of block 0: likely activations"
    ), backward
    assert [h["cause"] for h in backward["history"]] == ["OOMKilled", "OOMKilled"]
    assert backward["restarts"]["application"] == 1, "stopped before the budget (5) ran out"
    first = backward["history"][0]["failure"]
    assert first["phase"] == "backward of block 0" and first["step"] == 5
    assert re.search(r"\(last recorded: peak \d+\.\d of 2\.0 GiB\)$", first["message"]), first

    save = failed["oom-save"]["lastFailure"]
    assert save["cause"] == "OOMKilled" and save["phase"] == "checkpoint save", save
    assert "full-state assembly or staging copies on save" in save["diagnosis"]

    # after the pods are gone, the CLI still tells it
    _wait(jobs, "stuck", "pods gone", lambda: not jobs.pods("stuck") or None)
    why = _fsdpctl(e2e, namespace, "why", "stuck")
    assert why.returncode == 0 and "rank 2 not where the others are" in why.stdout, why
    assert f"fsdpctl -n {namespace} logs stuck --attempt 1 --rank 2" in why.stdout
    logs = _fsdpctl(e2e, namespace, "logs", "stuck", "--attempt", "1", "--rank", "2")
    assert logs.returncode == 0, logs.stderr
    assert "first error of the gang" in logs.stdout.splitlines()[0]
    assert "[rank2] thread MainThread:" in logs.stdout and "in stall_if" in logs.stdout
    assert f"{contract.EVIDENCE_PREFIX} " in logs.stdout
    kept = e2e.kube.get_json("configmap", "-n", namespace, hang["evidenceRef"])
    assert kept["metadata"]["ownerReferences"][0]["name"] == "stuck"
    assert sum(len(v) for v in kept["data"].values()) < 1 << 20
    # each rank's stacks and record, on the job's own claim
    evidence = e2e.claims[namespace, "ckpt"] / "stuck" / ".evidence" / "attempt-1"
    kept_files = sorted(p.name for p in evidence.iterdir())
    assert kept_files == sorted(f"rank-{r}.{x}" for r in range(4) for x in ("txt", "fr.json"))


def _condition(job_status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in job_status.get("conditions") or [] if c["type"] == kind), {})


def _blind_job_trains_on(
    e2e: E2E, jobs: stack.Jobs, blocked_at: float, *, deadline: int, startup: int
) -> None:
    """The operator cannot scrape "blind": it says so, and declares no Hang past the deadline
    while the kubelet finds rank 0 stepping. (Never seeing a step, the operator judges it by
    the startup deadline, then by rank 0's readiness.)"""
    seen = _wait(
        jobs,
        "blind",
        "ProgressObserved=False",
        lambda: _condition(s := jobs.status("blind"), "ProgressObserved").get("status") == "False"
        and s,
    )
    cond = _condition(seen, "ProgressObserved")
    assert cond["reason"] == "ScrapeFailing" and f":{names.METRICS_PORT}" in cond["message"], cond
    rank0 = e2e.kube.get_json("pod", "-n", jobs.ns, "blind-a1-0")
    (container,) = rank0["status"]["containerStatuses"]
    started = observe.ts(container["state"]["running"]["startedAt"])
    told = observe.ts(cond["lastTransitionTime"])
    assert started is not None and told is not None
    print(
        f"scrape blocked from the start; rank 0 running -> ProgressObserved=False: "
        f"{told - max(started, blocked_at):.1f}s"
    )
    # past the startup deadline, its grace and two probe periods, counted from rank 0's start
    until = started + max(deadline, startup) + 2 + 2 * max(1, min(30, deadline // 6)) + 5
    _wait(
        jobs,
        "blind",
        "past its deadline",
        lambda: time.time() > until,
        timeout=max(0.0, until - time.time()) + 30,
    )
    job = jobs.status("blind")
    assert job["phase"] == "Running" and job["attempt"] == 1 and not job.get("lastFailure"), job
    rank0 = e2e.kube.get_json("pod", "-n", jobs.ns, "blind-a1-0")
    ready = _condition(rank0["status"], "Ready")
    assert ready.get("status") == "True", rank0["status"]  # the kubelet: a step within 30 s
    assert "ProgressUnobserved" in jobs.events("blind")
    jobs.cluster.kubectl("delete", "fsdpjob", "-n", jobs.ns, "blind", "--wait=false")


def _substituted(expr: str, namespace: str, job: str) -> str:
    """A dashboard query with its template variables set to one job."""
    return (
        expr.replace("$cluster", ".*")  # All: this Prometheus adds no cluster label
        .replace("$job_namespace", namespace)
        .replace("$job_name", job)
    )


def test_prometheus_reads_the_charts_monitors_alerts_and_dashboard(
    e2e: E2E, namespace: str, tmp_path: Path
) -> None:
    """Debian's Prometheus, configured from the chart's PodMonitors and PrometheusRule (as
    prometheus-operator would be), scrapes the operator and the jobs it finds among the
    cluster's pods (harness.prometheus: Debian's build lacks Kubernetes SD): every dashboard
    panel's query returns series for a running job that restarted in place and then was
    recreated (tests/cluster/test_monitoring.py shows the step rate does not spike), every alert's
    metrics are there, and the restart-storm alert fires for a job whose every attempt
    crashes."""
    docs = stack.render_chart(
        namespace=NAMESPACE,
        release=RELEASE,
        values=[
            "metrics.podMonitor.enabled=true",
            "metrics.workerPodMonitor.enabled=true",
            "metrics.prometheusRule.enabled=true",
            "metrics.dashboard.enabled=true",
        ],
    )
    monitors = [d for d in docs if d["kind"] == "PodMonitor"]
    (rule,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    (board,) = [
        d for d in docs if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]
    ]
    dashboard = json.loads(board["data"]["fsdp-operator.json"])
    prom = prometheus.Prometheus(
        tmp_path / "prometheus",
        monitors=monitors,
        rules=rule["spec"],
        list_pods=lambda: list(e2e.kube.get_json("pods", "-A")["items"]),
    )
    prom.start()
    jobs = stack.Jobs(e2e.kube, namespace)
    try:
        # trains until the test deletes it: its series must still be there for every query.
        # Its first crash restarts in place (new processes in the same pods: rank 0's counters
        # start again and its step goes back), its second recreates the gang (attempt 2).
        steady = _job(e2e, "steady", training={"steps": 100 * STEPS})
        steady["spec"]["failurePolicy"]["inPlaceRestarts"] = 1
        jobs.apply(steady)
        storm = _job(
            e2e,
            "storm",
            replicas=1,
            minReplicas=1,
            nprocPerNode=1,
            failurePolicy={
                "maxRestartsWithoutProgress": 30,  # the alert wants 3; a slow machine, more
                "backoff": {"initialSeconds": 1, "maxSeconds": 2},
            },
        )
        storm["spec"]["trainer"] = {"module": "no_such_trainer"}  # every attempt exits 1
        jobs.apply(storm)
        first = _running(jobs, "steady", 1)
        ckpt = e2e.claims[namespace, "ckpt"] / "steady"
        sealed = _wait(
            jobs, "steady", "a checkpoint of attempt 1", lambda: _sealed(ckpt, attempt=1)
        )
        e2e.faults.kill_rank(namespace, first[1]["metadata"]["name"], rank=2)
        _wait(
            jobs,
            "steady",
            "a restart in place, then a checkpoint sealed after it",
            lambda: "RestartedInPlace" in jobs.events("steady")
            and (_sealed(ckpt, attempt=1) or 0) > sealed + STEPS // 10,
        )
        e2e.faults.kill_rank(namespace, first[1]["metadata"]["name"], rank=2)
        _wait(
            jobs,
            "steady",
            "attempt 2 training after the crash",
            lambda: "TrainingResumed" in jobs.events("steady") or None,
        )

        def context() -> str:
            return f"targets:\n{prom.targets()}\nprometheus log:\n{prom.log_tail()}\n" + (
                _story(jobs, "steady")
            )

        storm_alert = (
            f'ALERTS{{alertname="FSDPJobRestartStorm",alertstate="firing",'
            f'job_namespace="{namespace}",job_name="storm"}}'
        )
        poll.until(
            "the restart-storm alert firing for storm",
            lambda: prom.query(storm_alert),
            timeout=300,
            every=2.0,
            diagnosis=lambda: context() + _story(jobs, "storm"),
        )
        quiet = (
            f'ALERTS{{alertname="FSDPJobRestartStorm",job_namespace="{namespace}",'
            f'job_name="steady"}}'
        )
        assert not prom.query(quiet), "one crash is not a storm"

        queries = [
            (panel["title"], _substituted(target["expr"], namespace, "steady"))
            for panel in dashboard["panels"]
            for target in panel.get("targets", [])
        ]
        assert len(queries) >= 15

        def series(what: str, expr: str) -> None:
            poll.until(what, lambda: prom.query(expr), timeout=120, every=2.0, diagnosis=context)

        for title, expr in queries:
            if expr.startswith("DCGM_"):  # NVIDIA's DCGM exporter runs on GPU nodes: none here
                prom.query(expr)  # still a query Prometheus accepts
                continue
            series(f"series for panel {title!r}: {expr}", expr)
        per_job = f'job_namespace="{namespace}",job_name="steady"'
        for group in rule["spec"]["groups"]:
            for alert in group["rules"]:
                prom.query(alert["expr"])  # every expression evaluates
                for metric in set(re.findall(r"\b(fsdpjob_\w+)", alert["expr"])):
                    if metric == "fsdpjob_reconcile_errors_total":
                        continue  # labelled by exception type: no series before the first error
                    selector = metric if "operator" in metric else f"{metric}{{{per_job}}}"
                    series(f"series {selector} for alert {alert['alert']}", selector)
        # the workers' series carry the same job labels as the operator's
        assert prom.query(f"fsdp_train_step{{{per_job}}}")
    finally:
        prom.stop()
        for name in ("steady", "storm"):
            jobs.cluster.kubectl(
                "delete", "fsdpjob", "-n", namespace, name, "--wait=false", check=False
            )

"""Fault scenarios on the local cluster: the operator recovers on its own, or stops with a reason.

Real API server, scheduler and controllers; real torchrun in process-backed pods; the stand-in
worker writes real markers on the shared volume. Each test injects one fault and watches what a
user would watch: status, Events, pods.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fsdp_operator.types import api, names
from fsdp_operator.types import status as st
from fsdp_worker.contract import catalog
from harness import stack
from localcluster import faults as lf
from localcluster import poll
from tests.integration import harness

pytestmark = pytest.mark.cluster


def _attempt(jobs: harness.Jobs, name: str, n: int) -> dict:
    return poll.until(
        f"attempt {n} running",
        lambda: (s := jobs.status(name)).get("attempt", 0) >= n
        and s.get("phase") == "Running"
        and s,
        timeout=60,
    )


def test_a_crash_then_a_hang_restart_in_place_in_the_same_pods(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """failurePolicy.inPlaceRestarts: rank 1 crashes at step 12; both pods' keepers restart
    their ranks from step 10 inside the same pods (no pod deleted, created or restarted). In
    that generation rank 0 stops stepping at step 25 and ends itself at its own hang deadline
    (20 s, before the operator's): restarted in place again, from step 25. Each restart is
    charged, kept in history and told as an Event."""
    name = harness.unique("inplace")
    env = {
        "STANDIN_FAIL_AT_STEP": 12,
        "STANDIN_FAIL_RANK": 1,
        "STANDIN_HANG_AT_STEP": 27,
        "STANDIN_HANG_RANK": 0,
        "STANDIN_HANG_GENERATION": 1,
    }
    doc = harness.job_doc(
        # A restart's own start (imports, rendezvous) is judged by the startup deadline: 10 s
        # for it too recreated the gang once on a loaded machine (a third failure, budget 2).
        # The deadline between steps covers the saves: with a busy neighbour the last save's
        # fsyncs and the ranks' exit took 11-13 s after step 40 (the finished gang was judged
        # hung at 10 s and recreated).
        # 100 steps: generation 2 (from step 25) trains 15 s, three scrapes' worth; at 40 it
        # trained 3 s and once ended before any scrape saw its first step ('resumed' unset).
        name,
        env=env,
        training={"steps": 100},
        failurePolicy={
            "inPlaceRestarts": 2,
            "progressDeadlineSeconds": 20,
            "startupDeadlineSeconds": 60,
        },
    )
    jobs.apply(doc)

    def context() -> str:
        pods = "\n".join(
            jobs.cluster.kubectl("logs", "-n", jobs.ns, p["metadata"]["name"], check=False).stdout
            for p in jobs.pods(name)
        )
        return (
            f"status={jobs.status(name)}\nevents={jobs.events(name)}\n{pods}\n{operator.log_tail()}"
        )

    first = poll.until(
        "both pods of attempt 1 running",
        lambda: len(pods := jobs.running_pods(name, 1)) == 2 and pods,
        diagnosis=context,
    )
    uids = {p["metadata"]["uid"] for p in first}
    done = poll.until(
        "job to succeed after a crash restarted in place",
        lambda: (s := jobs.status(name)).get("phase") == "Succeeded" and s,
        timeout=300,  # a pod that does not end after the last step is deleted 90 s after rank 0's
        diagnosis=context,
    )
    # the gang was never recreated
    assert (
        done["attempt"] == 1
    ), f"{json.dumps(done['history'])}\n{jobs.evidence(name)}\n{operator.log_tail(200)}"
    assert done["restarts"]["application"] == 2 and done["restarts"]["total"] == 2
    restart, hang = done["history"][0]["restartsInPlace"]
    failure = restart["failure"]
    assert (failure["cause"], failure["rank"], failure["step"]) == ("Crash", 1, 12), restart
    assert failure["message"] == "injected" and failure["pod"] == f"{name}-a1-1"
    assert restart["resumedFromStep"] == 10 and restart["stepsLost"] == 2, restart
    stuck = hang["failure"]
    assert (stuck["cause"], stuck["rank"], stuck["step"]) == ("Hang", 0, 27), hang
    assert hang["generation"] == 1 and hang["resumedFromStep"] == 25, hang
    reasons = jobs.events(name)
    assert "RestartedInPlace" in reasons and "Restarting" not in reasons, reasons
    # The same two pods ran it all, and the kubelet never restarted a container.
    pods = jobs.pods(name)
    assert {p["metadata"]["uid"] for p in pods} == uids
    assert all(c["restartCount"] == 0 for p in pods for c in p["status"]["containerStatuses"])
    resume = float(st.parse_rfc3339(restart["resumed"]) - st.parse_rfc3339(failure["time"]))
    after = float(st.parse_rfc3339(hang["resumed"]) - st.parse_rfc3339(stuck["time"]))
    print(
        f"in place: crash -> next first step {resume:.2f}s; the rank's hang verdict -> next "
        f"first step {after:.2f}s"
    )  # the note's figures (-s)
    marker = (jobs.ckpt_dir(name) / "step-100" / "COMPLETE.json").read_text()
    assert '"attempt": 1' in marker
    env = {**os.environ, "KUBECONFIG": str(jobs.cluster.kubeconfig), "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", "fsdp_operator.cli", "-n", jobs.ns, "describe", name],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "1 in place" in out and "RestartedInPlace" in out, out
    assert "total steps redone after restarts: 4" in out, out
    why = subprocess.run(
        [sys.executable, "-m", "fsdp_operator.cli", "-n", jobs.ns, "why", name],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "attempt 1, restarted in place (generation 0): Crash at step 12" in why, why
    assert "attempt 1, restarted in place (generation 1): Hang at step 27" in why, why


def test_crash_restarts_from_newest_complete_checkpoint(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    name = harness.unique("crash")
    jobs.apply(harness.job_doc(name, env={"STANDIN_FAIL_AT_STEP": 12}))
    done = poll.until(
        "job to succeed after one crash",
        lambda: (s := jobs.status(name)).get("phase") == "Succeeded" and s,
        timeout=120,
        diagnosis=operator.log_tail,
    )
    assert done["attempt"] == 2
    assert done["restarts"] == {
        "total": 1,
        "application": 1,
        "infrastructure": 0,
        "withoutProgress": 0,
    }
    assert done["lastFailure"]["cause"] == "Crash" and done["lastFailure"]["rank"] == 0
    assert done["lastFailure"]["message"] == "injected"
    first, second = done["history"][:2]
    assert first["cause"] == "Crash" and second["resumedFromStep"] == 10
    assert done["lastCheckpoint"]["step"] == 40 and done["step"] == 40
    reasons = jobs.events(name)
    assert {"AttemptStarted", "FailureDetected", "Restarting", "Succeeded"} <= set(reasons)
    # the marker of the final checkpoint names the attempt that resumed from step 10
    marker = (jobs.ckpt_dir(name) / "step-40" / "COMPLETE.json").read_text()
    assert '"resumed_from_step": 10' in marker and '"attempt": 2' in marker
    # the CLI tells the same story, with what the failure cost
    env = {**os.environ, "KUBECONFIG": str(jobs.cluster.kubeconfig), "COLUMNS": "200"}
    out = subprocess.run(
        [sys.executable, "-m", "fsdp_operator.cli", "-n", jobs.ns, "describe", name],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert done["history"][0]["stepsLost"] == 2  # rank 0 reported step 12; resumed from 10
    assert "Crash" in out and "total steps redone after restarts: 2" in out
    # the failed attempt's pods are gone; its logs were kept before they went
    failure = done["history"][0]["failure"]
    assert failure["evidenceRef"] and failure["pod"] == done["lastFailure"]["pod"]
    # as a kubectl plugin: `kubectl fsdp` runs kubectl-fsdp from PATH (installed beside fsdpctl)
    plugin = {**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    why = subprocess.run(
        [str(jobs.cluster.bin_dir / "kubectl"), "fsdp", "-n", jobs.ns, "why", name],
        env=plugin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "attempt 1: Crash" in why and "message: injected" in why, why
    # and kubectl's own completion offers the namespace's jobs (through kubectl_complete-fsdp)
    offered = subprocess.run(
        [str(jobs.cluster.bin_dir / "kubectl"), "__complete", "fsdp", "-n", jobs.ns, "why", ""],
        env=plugin,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert name in offered and offered[-1] == ":4", offered
    logs = subprocess.run(
        [
            sys.executable,
            "-m",
            "fsdp_operator.cli",
            "-n",
            jobs.ns,
            "logs",
            name,
            "--attempt",
            "1",
            "--rank",
            "0",
        ],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "first error of the gang" in logs and "injected failure at step 12" in logs, logs
    # and so do the operator's own metrics
    metrics = urllib.request.urlopen(operator.metrics_url(), timeout=5).read().decode()
    assert 'fsdpjob_failures_total{cause="Crash"}' in metrics
    assert "fsdpjob_recovery_seconds_count" in metrics
    # kopf's liveness endpoint answers while the operator works
    assert urllib.request.urlopen(operator.liveness_url, timeout=5).status == 200


def test_an_operator_that_cannot_read_checkpoints_still_resumes_from_the_newest(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """The chart's default install: no checkpoint mount in the operator. A crash used to
    restart from step 0 and quarantine the job's own checkpoints as it reached their steps."""
    operator.stop()
    operator.sees_checkpoints = False
    operator.start()
    try:
        name = harness.unique("blind")
        # 80 steps: attempt 2 trains long enough for the operator to scrape what it loaded
        # (an attempt of a few seconds on a loaded machine ended between two scrapes).
        doc = harness.job_doc(name, env={"STANDIN_FAIL_AT_STEP": 12}, training={"steps": 80})
        jobs.apply(doc)
        done = poll.until(
            "job to succeed after one crash",
            lambda: (s := jobs.status(name)).get("phase") in ("Succeeded", "Failed") and s,
            timeout=120,
            diagnosis=lambda: f"{jobs.status(name)}\n{jobs.events(name)}\n{operator.log_tail()}",
        )
    finally:
        operator.stop()
        operator.sees_checkpoints = True
        operator.start()
    assert done["phase"] == "Succeeded", done
    assert done["attempt"] == 2
    second = done["history"][1]
    # as the pods reported what they loaded
    assert second.get("resumedFromStep") == 10, json.dumps(done["history"])
    assert "Resumed" in jobs.events(name)
    ckpt = jobs.ckpt_dir(name)
    assert not [p.name for p in ckpt.rglob("*") if "quarantined" in p.name]  # writer dirs too
    marker = (ckpt / "step-80" / "COMPLETE.json").read_text()
    assert '"resumed_from_step": 10' in marker and '"attempt": 2' in marker


def _faults(operator: harness.Operator) -> lf.Faults:
    return lf.Faults.for_cluster(operator.cluster.state_dir)


def _pods_of(jobs: harness.Jobs, name: str, attempt: int) -> list[dict]:
    """The gang's pods of `attempt`, once all run (spec.spares' pods are not the gang's)."""

    def gang() -> list[dict]:
        running = jobs.running_pods(name, attempt)
        return [p for p in running if "fsdpoperator.io/spare" not in p["metadata"]["labels"]]

    return poll.until(
        f"pods of attempt {attempt} running",
        lambda: len(p := gang()) == jobs.status(name).get("replicas") and p,
        timeout=60,
        diagnosis=lambda: f"{jobs.status(name)}\n{jobs.events(name)}\n{jobs.pods_report(name)}",
    )


def _step_at_least(jobs: harness.Jobs, name: str, step: int) -> None:
    poll.until(
        f"step >= {step}",
        lambda: (jobs.status(name).get("step") or 0) >= step,
        diagnosis=lambda: f"{jobs.status(name)}\n{jobs.events(name)}\n{jobs.pods_report(name)}",
    )


def _phase(jobs: harness.Jobs, name: str, phase: str, timeout: float = 90) -> dict:
    return poll.until(
        f"phase {phase}",
        lambda: (s := jobs.status(name)).get("phase") == phase and s,
        timeout=timeout,
        diagnosis=lambda: f"{name} status: {jobs.status(name)}",
    )


def test_node_loss_force_deletes_and_restarts_elsewhere(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """The node's kubelet stops (SIGSTOP: no heartbeats, its containers run on). With a 300 s
    nodeLossGraceSeconds, NotReady alone would restart the job 5 minutes after the node turned
    NotReady; its Lease, silent for 8 renewals while the other nodes renew, loses it at once."""
    name = harness.unique("nodeloss")
    doc = harness.job_doc(name, training={"steps": 400})
    doc["spec"]["failurePolicy"]["nodeLossGraceSeconds"] = 300
    jobs.apply(doc)
    victim = next(p for p in _pods_of(jobs, name, 1) if p["metadata"]["name"].endswith("-1"))
    lost = victim["spec"]["nodeName"]
    _step_at_least(jobs, name, 6)
    faults = _faults(operator)
    stopped = time.monotonic()
    faults.lose_node(lost, freeze=names.Label.JOB.value)  # its pods stop too
    try:
        s = poll.until(
            "restart after node loss",
            lambda: (s := jobs.status(name)).get("attempt") == 2 and s,
            timeout=90,
            diagnosis=lambda: f"{jobs.status(name)}\n{operator.log_tail()}",
        )
        print(
            f"kubelet stopped -> attempt 2 in {time.monotonic() - stopped:.1f}s; {s['history'][0]}"
        )
        assert s["lastFailure"]["cause"] == "NodeLost" and s["lastFailure"]["node"] == lost
        assert "stopped renewing its Lease" in s["lastFailure"]["message"], s["lastFailure"]
        assert s["restarts"]["infrastructure"] == 1 and s["restarts"]["application"] == 0
        assert [e["node"] for e in s["excludedNodes"]] == [lost]
        pods = _pods_of(jobs, name, 2)
        assert lost not in {p["spec"]["nodeName"] for p in pods} and len(pods) == 2
        # the lost node's pod was force-deleted: no object waits for a kubelet that is gone
        poll.until(
            "old pods gone",
            lambda: not [
                p
                for p in jobs.pods(name)
                if p["metadata"]["labels"]["fsdpoperator.io/attempt"] == "1"
            ],
        )
        detect = s["history"][0]["detectSeconds"]
        assert detect is not None and detect < 30
    finally:
        faults.restore_node(lost)
    jobs.patch(name, {"suspend": True})  # free the nodes for the next test


def _ready(jobs: harness.Jobs, pod: str) -> bool:
    found = [p for p in jobs.pods() if p["metadata"]["name"] == pod]
    conditions = found[0]["status"].get("conditions") or [] if found else []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def _spare_trained(
    jobs: harness.Jobs, name: str, context: Callable[[], str], attempt: int = 1
) -> dict:
    """The status once `attempt`'s first restart in place (a spare's takeover) trained again."""

    def first_restart(s: dict) -> dict:
        entry = next((e for e in s.get("history", []) if e["attempt"] == attempt), {})
        return (entry.get("restartsInPlace") or [{}])[0]

    return poll.until(
        "the spare trains in the lost pod's node rank",
        lambda: first_restart(s := jobs.status(name)).get("resumed") and s,
        timeout=90,
        diagnosis=context,
    )


def test_a_spare_takes_a_lost_nodes_place_in_place(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """spec.spares 1: a third pod stands by, warm, on the third node. Node rank 0's kubelet
    stops (its keeper was the gang's coordinator, its rank 0 the store's host); from its silent
    Lease the operator promotes the spare to node rank 0 and tells node rank 1's keeper to
    follow it, in a restart in place: the attempt stays 1, node rank 1's pod is the same, the
    lost pod is force-deleted, a new spare is made behind (it waits for a node), the spare's
    rank 0 reports progress and the job finishes. (A non-zero node rank's place, given by the
    coordinator's `replace`, is the frozen-pod scenario's below.)"""
    name = harness.unique("spare")
    # A deadline of 60 s has the kubelets probe rank 0's progress (and the spare) every 10 s.
    # Twice in CI attempt 1's gang never met (rank 0's torchrun never started its ranks; node
    # 1's keeper reached node 0's coordinator only 12 s after start, then lost it for 10 s):
    # undiagnosed, see the note. The operator recreates such a gang (RendezvousTimeout, after
    # the 30 s startup deadline); the takeover is tested on the attempt that trains.
    # 400 steps (80 s): the lost node comes after the gang trains, the spare Ready and its Lease
    # silence; 150 once ended the job before a scrape saw the takeover's first step.
    policy = {
        "inPlaceRestarts": 2,
        "nodeLossGraceSeconds": 300,
        "progressDeadlineSeconds": 60,
        "startupDeadlineSeconds": 30,
    }
    doc = harness.job_doc(name, training={"steps": 400}, spares=1, failurePolicy=policy)
    jobs.apply(doc)

    def context() -> str:
        return f"status={jobs.status(name)}\nevents={jobs.events(name)}\n{operator.log_tail()}"

    trained = poll.until(
        "a gang training (step >= 8)",
        lambda: ((s := jobs.status(name)).get("step") or 0) >= 8 and s,
        timeout=180,
        diagnosis=lambda: f"{context()}\n{jobs.pods_report(name)}",
    )
    attempt = trained["attempt"]
    never_met = [e.get("cause") for e in trained["history"] if e["attempt"] < attempt]
    assert set(never_met) <= {"RendezvousTimeout"}, trained["history"]

    def gang_and_spare() -> tuple[list[dict], dict] | None:
        running = jobs.running_pods(name, attempt)
        gang = [p for p in running if "fsdpoperator.io/node-rank" in p["metadata"]["labels"]]
        spares = [p for p in running if "fsdpoperator.io/spare" in p["metadata"]["labels"]]
        return (
            (sorted(gang, key=lambda p: p["metadata"]["name"]), spares[0])
            if len(gang) == 2 and spares
            else None
        )

    (rank0, rank1), spare = poll.until(
        "the gang and its spare running", gang_and_spare, timeout=90, diagnosis=context
    )
    lost = rank0["spec"]["nodeName"]
    assert spare["spec"]["nodeName"] not in (lost, rank1["spec"]["nodeName"])
    # Standing by, it answers rank 0's readiness probe (it carries it): Ready, as the gang is.
    poll.until(
        "the spare Ready",
        lambda: _ready(jobs, spare["metadata"]["name"]),
        timeout=60,
        diagnosis=context,
    )
    faults = _faults(operator)
    faults.lose_node(lost, freeze=names.Label.JOB.value)  # its pods stop too
    try:
        s = _spare_trained(jobs, name, context, attempt)
        entry = next(e for e in s["history"] if e["attempt"] == attempt)
        restart = entry["restartsInPlace"][0]
        failure = restart["failure"]
        assert s["attempt"] == attempt and failure["cause"] == "NodeLost", restart
        assert (failure["pod"], failure["node"]) == (rank0["metadata"]["name"], lost), failure
        # a gang that never met is charged to the infrastructure budget too
        assert s["restarts"]["infrastructure"] == attempt and s["spares"]["takeovers"] == 1, s
        took = f"{name}-a{attempt}-s0"
        now = {p["metadata"]["name"]: p for p in jobs.running_pods(name, attempt)}
        assert now[took]["metadata"]["labels"]["fsdpoperator.io/node-rank"] == "0"
        assert now[rank1["metadata"]["name"]]["metadata"]["uid"] == rank1["metadata"]["uid"]
        reasons = jobs.events(name)
        assert "SpareTakeover" in reasons, reasons
        assert reasons.count("Restarting") == attempt - 1, reasons  # none for the takeover
        poll.until(
            "the lost pod gone and a new spare made",
            lambda: not [
                p for p in jobs.pods(name) if p["metadata"]["name"] == rank0["metadata"]["name"]
            ]
            and any(p["metadata"]["name"] == f"{name}-a{attempt}-s1" for p in jobs.pods(name)),
            diagnosis=context,
        )
        first = st.parse_rfc3339(restart["resumed"])
        heard = first - st.parse_rfc3339(failure["time"])
        taken = first - st.parse_rfc3339(restart["detected"])
        print(f"spare: last heartbeat -> first step {heard:.2f}s; NodeLost -> {taken:.2f}s")
    finally:
        faults.restore_node(lost)
    done = _phase(jobs, name, "Succeeded", timeout=180)
    assert done["attempt"] == attempt and done["step"] == 400
    poll.until(
        "the spares gone with the job",
        lambda: not [
            p for p in jobs.pods(name) if "fsdpoperator.io/spare" in p["metadata"]["labels"]
        ],
        diagnosis=context,
    )


def _every_node_ready(operator: harness.Operator) -> None:
    poll.until(
        "every node Ready again",
        lambda: all(
            c["status"] == "True"
            for n in operator.cluster.get_json("nodes")["items"]
            for c in n["status"]["conditions"]
            if c["type"] == "Ready"
        ),
        diagnosis=lambda: json.dumps(operator.cluster.get_json("nodes")["items"])[-3000:],
    )


def test_an_api_server_stall_and_a_paused_kubelet_lose_no_node(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """One job (they share it to spare CI a bring-up), two things that are not a lost node.

    A kubelet restart or upgrade that takes a minute, from before the gang's first step: its
    Lease is silent for 60 s (lost by the Lease rule after 8.25 s here), its node NotReady after
    8 s, while its pods start and train on. Lease silence alone is not a loss. Before the first
    step nothing the ranks do can vouch for the node, so the operator asks the gang's keepers
    (inPlaceRestarts): node rank 1's keeper still asks its coordinator, so the node is suspect,
    not lost. Once the gang steps, rank 0 is scraped every second and keeps stepping. NotReady
    is judged after nodeLossGraceSeconds (90 s here). The node is said to be suspect
    (status.suspectNodes, a NodeSuspect Event) and cleared after.

    Then the API server answers nothing for 10 s: 2.5 times the kubelets' 4 s Lease, past the
    operator's 8.25 s of silence for a lost node. Every Lease looks silent, but the operator saw
    no node renew in that time, so it judges none, and the job trains on in attempt 1."""
    name = harness.unique("stall")
    # 2 x 12 s of start-up (before "rendezvous" and before "loaded"): the Lease falls silent
    # well before the first step
    policy = {"inPlaceRestarts": 2, "nodeLossGraceSeconds": 90, "startupDeadlineSeconds": 150}
    env = {"STANDIN_START_SECONDS": 12}
    jobs.apply(harness.job_doc(name, training={"steps": 2000}, failurePolicy=policy, env=env))
    victim = next(p for p in _pods_of(jobs, name, 1) if p["metadata"]["name"].endswith("-1"))

    def why(s: dict[str, Any]) -> str:
        return f"{json.dumps(s)[:3000]}\nevents: {jobs.events(name)}\n{operator.log_tail()}"

    faults = _faults(operator)
    node = victim["spec"]["nodeName"]
    assert (jobs.status(name).get("step") or 0) == 0, why(jobs.status(name))
    faults.pause_kubelet(node)
    try:
        time.sleep(60)
        s = jobs.status(name)
    finally:
        faults.resume_kubelet(node)
    assert s["attempt"] == 1 and "lastFailure" not in s, why(s)
    assert (s.get("step") or 0) >= 50, why(s)  # it started and trained all along (0.2 s a step)
    assert "FailureDetected" not in jobs.events(name), why(s)
    # said, not acted on: suspect while paused (by its keeper's word before the first step),
    # and cleared once it renews
    said = jobs.messages(name, "NodeSuspect")
    assert s.get("suspectNodes") == [node], why(s)
    assert len(said) == 1 and "before the attempt's first step" in said[0], f"{said}\n{why(s)}"
    poll.until(
        f"NodeSuspectCleared for {node}",
        lambda: "NodeSuspectCleared" in jobs.events(name),
        timeout=60,
        diagnosis=lambda: why(jobs.status(name)),
    )
    _every_node_ready(operator)

    faults.stall_apiserver(10)
    stepped = (jobs.status(name).get("step") or 0) + 100
    s = poll.until(
        f"step {stepped} after the stall",
        lambda: ((s := jobs.status(name)).get("step") or 0) >= stepped and s,
        timeout=90,
        diagnosis=lambda: why(jobs.status(name)),
    )
    assert s["attempt"] == 1 and "lastFailure" not in s, why(s)
    assert not s.get("restarts", {}).get("total"), why(s)
    assert jobs.events(name).count("NodeSuspect") == 1, why(s)  # no node renewed: none judged
    jobs.patch(name, {"suspend": True})
    _every_node_ready(operator)


@pytest.mark.parametrize(
    ("fault", "cause", "budget"),
    [("evict", "Evicted", "infrastructure"), ("oom", "OOMKilled", "application")],
)
def test_pod_fault_is_charged_to_the_right_budget(
    jobs: harness.Jobs, operator: harness.Operator, fault: str, cause: str, budget: str
) -> None:
    name = harness.unique(fault)
    # A real memory limit for the kernel to enforce (the oom fault needs one).
    limits = {"limits": {"memory": "1Gi"}, "requests": {"memory": "1Gi"}}
    jobs.apply(harness.job_doc(name, training={"steps": 60}, resources=limits))
    pods = _pods_of(jobs, name, 1)
    _step_at_least(jobs, name, 6)
    getattr(_faults(operator), fault)(jobs.ns, pods[1]["metadata"]["name"])
    done = _phase(jobs, name, "Succeeded", timeout=120)
    assert done["history"][0]["cause"] == cause and done["lastFailure"]["rank"] == 1
    other = {"application", "infrastructure"} - {budget}
    assert done["restarts"][budget] == 1 and done["restarts"][other.pop()] == 0
    assert done["history"][1]["resumedFromStep"] >= 5
    if fault == "oom":
        assert done["lastFailure"]["exitCode"] == 137


@pytest.mark.parametrize(
    ("in_place", "frozen", "spares"),
    [
        pytest.param(0, 0, 0, id="rank-0s-pod-frozen"),
        pytest.param(2, 1, 0, id="in-place-node-1s-pod-frozen"),
        pytest.param(2, 1, 1, id="a-spare-takes-the-frozen-node-1s-place"),
        pytest.param(2, 0, 1, id="a-spare-takes-the-frozen-coordinators-place"),
    ],
)
def test_hang_is_caught_by_the_progress_deadline(
    jobs: harness.Jobs, operator: harness.Operator, in_place: int, frozen: int, spares: int
) -> None:
    """A pod frozen whole (every process stopped, its keeper too) hangs the gang. With restarts
    in place the operator asks the gang's coordinator past the deadline, finds node 1's keeper
    silent and recreates the gang at once, without the grace a restart in place would get;
    with a warm spare standing by, the spare takes node rank 1's place in a restart in place
    (attempt 1 goes on, rank 0's pod stays, the frozen pod goes), and that long before the
    deadline (here 120 s): the keeper's silence and its node's Lease, renewed since, say the
    pod is frozen (policy/frozen.py). Node rank 0's pod frozen holds the coordinator itself,
    which cannot name itself silent: it accepts the operator's asks and answers none, its node
    renewing its Lease, and the spare becomes the coordinator, as early."""
    name = harness.unique("hang")
    policy = {
        "progressDeadlineSeconds": 120 if spares else 10,
        "startupDeadlineSeconds": 60,
        "inPlaceRestarts": in_place,
    }
    jobs.apply(harness.job_doc(name, training={"steps": 400}, failurePolicy=policy, spares=spares))

    def context() -> str:
        return f"{jobs.status(name)}\n{jobs.events(name)}\n{operator.log_tail()}"

    pods = _pods_of(jobs, name, 1)
    if spares:
        poll.until(
            "the spare running",
            lambda: any(
                "fsdpoperator.io/spare" in p["metadata"]["labels"]
                for p in jobs.running_pods(name, 1)
            ),
            timeout=90,
            diagnosis=context,
        )
    _step_at_least(jobs, name, 6)
    pod = next(p for p in pods if p["metadata"]["name"].endswith(f"-{frozen}"))
    _faults(operator).freeze(jobs.ns, pod["metadata"]["name"])
    if spares:
        s = _spare_trained(jobs, name, context)
        failure = s["history"][0]["restartsInPlace"][0]["failure"]
        assert s["attempt"] == 1 and failure["cause"] == "Hang", s
        assert failure["pod"] == pod["metadata"]["name"], failure
        said = (
            "node rank 1's keeper silent for"
            if frozen
            else "node rank 0's keeper, the gang's coordinator, accepted asks and answered none"
        )
        assert said in failure["message"], failure
        assert "renewed its Lease" in failure["message"], failure  # before the deadline
        assert s["spares"]["takeovers"] == 1 and s["restarts"]["application"] == 1, s
        assert not s.get("excludedNodes"), s  # the frozen pod's node is not to blame
        restart = s["history"][0]["restartsInPlace"][0]
        seen = st.parse_rfc3339(failure["time"])  # the last step seen
        print(
            f"frozen node rank {frozen}: last step seen -> taken over "
            f"{st.parse_rfc3339(restart['detected']) - seen:.2f}s, -> first step "
            f"{st.parse_rfc3339(restart['resumed']) - seen:.2f}s"
        )
        reasons = jobs.events(name)
        assert "SpareTakeover" in reasons and "Restarting" not in reasons, reasons
        poll.until(
            "the frozen pod gone",
            lambda: pod["metadata"]["name"] not in {p["metadata"]["name"] for p in jobs.pods(name)},
            diagnosis=context,
        )
        jobs.patch(name, {"suspend": True})
        return
    s = poll.until(
        "hang detected",
        lambda: (s := jobs.status(name)).get("attempt") == 2 and s,
        timeout=90,
        diagnosis=context,
    )
    assert s["history"][0]["cause"] == "Hang" and s["lastFailure"]["rank"] == 0
    message = s["lastFailure"]["message"]
    assert "no step progress" in message or "readiness probe" in message, message
    if in_place:
        assert "not restarted in place: keepers silent: node 1 for" in message, message
        assert not s["history"][0].get("restartsInPlace"), s["history"][0]
    _pods_of(jobs, name, 2)
    jobs.patch(name, {"suspend": True})


def test_a_gang_that_never_meets_is_not_charged_as_the_users_hang(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """Attempt 1's rank 0 serves nothing past the progress deadline (the stand-in holds its
    metrics back, as the kit does until its process group is up): RendezvousTimeout, on the
    infrastructure budget, and attempt 2 trains."""
    name = harness.unique("meet")
    jobs.apply(harness.job_doc(name, training={"steps": 400}, env={"STANDIN_MEET_SECONDS": 600}))
    s = poll.until(
        "attempt 1 ended as a gang that never met",
        lambda: (s := jobs.status(name)).get("attempt", 0) >= 2 and s,
        timeout=120,
        diagnosis=lambda: f"{jobs.status(name)}\n{operator.log_tail()}",
    )
    assert s["history"][0]["cause"] == "RendezvousTimeout", s["history"]
    assert "the gang never met" in s["history"][0]["failure"]["message"]
    assert s["restarts"]["infrastructure"] == 1 and s["restarts"]["application"] == 0, s
    _step_at_least(jobs, name, 6)  # the stand-in holds back in attempt 1 only
    assert jobs.status(name)["restarts"]["application"] == 0
    jobs.patch(name, {"suspend": True})


def test_unschedulable_shrinks_then_grows_back_without_losing_steps(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    name = harness.unique("elastic")
    doc = harness.job_doc(
        name,
        replicas=3,
        minReplicas=1,
        training={"steps": 2000, "globalBatchSize": 6, "microBatchSize": 1},
    )
    jobs.apply(doc)
    pods = _pods_of(jobs, name, 1)
    lost = pods[2]["spec"]["nodeName"]
    _step_at_least(jobs, name, 6)
    # Counted, not assumed to be 1: under a full suite's load an attempt may fail on its own
    # before the fault (once in four full runs the first restart kept 3 replicas).
    before = jobs.status(name)["attempt"]
    faults = _faults(operator)
    faults.lose_node(lost, freeze=names.Label.JOB.value)  # its pods stop too
    try:
        s = poll.until(
            "shrunk attempt",
            lambda: (s := jobs.status(name)).get("attempt", 0) > before
            and s.get("replicas") == 2
            and s.get("phase") == "Running"
            and s,
            timeout=90,
            diagnosis=lambda: f"{jobs.status(name)}\n{operator.log_tail()}",
        )
        assert s["worldSize"] == 2, s
        assert {h.get("cause") for h in s["history"]} & {"NodeLost", "Unschedulable"}, s
        _pods_of(jobs, name, s["attempt"])
        _step_at_least(jobs, name, (s.get("resumedFromStep") or 0) + 3)
        restarts = s["restarts"]["total"]
    finally:
        faults.restore_node(lost)
    # capacity is back (after the node's exclusion expires): a planned restart at full size
    shrunk = s["attempt"]
    s = poll.until(
        "grown back",
        lambda: (s := jobs.status(name)).get("replicas") == 3
        and s.get("attempt", 0) > shrunk
        and s,
        timeout=90,
        diagnosis=operator.log_tail,
    )
    resize = s["history"][shrunk - 1]
    assert resize["cause"] == "Resize" and resize["stepsLost"] == 0, s
    assert s["restarts"]["total"] == restarts  # the planned resize cost no budget
    _pods_of(jobs, name, s["attempt"])
    jobs.patch(name, {"suspend": True})


def test_pods_that_never_schedule_shrink_the_world(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    name = harness.unique("toobig")
    nodes = len(operator.cluster.get_json("nodes")["items"])
    doc = harness.job_doc(
        name,
        replicas=nodes + 1,
        minReplicas=1,
        training={"steps": 30, "globalBatchSize": 12 * (nodes + 1)},
    )
    jobs.apply(doc)
    done = _phase(jobs, name, "Succeeded", timeout=120)
    assert done["history"][0]["cause"] == "Unschedulable"
    assert done["replicas"] <= nodes and done["restarts"]["infrastructure"] >= 1


@pytest.mark.parametrize(
    ("env", "policy", "cause"),
    [
        ({"STANDIN_FAIL_CODE": 78}, {}, "ConfigError"),
        ({"STANDIN_FAIL_CODE": 42}, {"nonRetryableExitCodes": [42]}, "NonRetryableExitCode"),
    ],
)
def test_non_retryable_failure_fails_after_one_attempt(
    jobs: harness.Jobs, operator: harness.Operator, env: dict, policy: dict, cause: str
) -> None:
    name = harness.unique("fatal")
    jobs.apply(harness.job_doc(name, env={"STANDIN_FAIL_AT_STEP": 3, **env}, failurePolicy=policy))
    s = _phase(jobs, name, "Failed")
    assert s["reason"] == cause and s["attempt"] == 1 and s["restarts"]["total"] == 0
    assert s["lastFailure"]["message"] == "injected"
    assert "Failed" in {c["type"] for c in s["conditions"] if c["status"] == "True"}


def test_restart_budget_and_circuit_breaker(jobs: harness.Jobs, operator: harness.Operator) -> None:
    budget = harness.unique("budget")  # fails at step 7 every attempt: progress only at first
    jobs.apply(
        harness.job_doc(
            budget,
            env={"STANDIN_FAIL_AT_STEP": 7, "STANDIN_FAIL_ATTEMPT": 0},
            failurePolicy={"maxRestarts": 1},
        )
    )
    breaker = harness.unique("breaker")  # fails before any checkpoint: never any progress
    jobs.apply(
        harness.job_doc(
            breaker,
            env={"STANDIN_FAIL_AT_STEP": 3, "STANDIN_FAIL_ATTEMPT": 0},
            failurePolicy={"maxRestartsWithoutProgress": 2},
        )
    )
    # A gang that never met (RendezvousTimeout) is an uncharged restart of its own, counted by
    # neither rule (seen once on a loaded machine: the budget job failed at attempt 3).
    s = _phase(jobs, budget, "Failed", timeout=180)
    told = f"{json.dumps(s['history'])}\n{jobs.evidence(budget)}"
    assert s["reason"] == "RestartBudgetExhausted" and "maxRestarts=1" in s["message"], told
    assert s["attempt"] == 2 + _never_met(s) and s["restarts"]["application"] == 1, told
    s = _phase(jobs, breaker, "Failed", timeout=180)
    told = f"{json.dumps(s['history'])}\n{jobs.evidence(breaker)}"
    assert s["reason"] == "CircuitBreaker" and s["attempt"] == 2 + _never_met(s), told


def _never_met(s: dict) -> int:
    """Attempts that ended as a gang that never met."""
    return sum(e.get("cause") == "RendezvousTimeout" for e in s["history"])


@pytest.mark.parametrize("kill_when", ["at-failure", "restarting", "new-pods"])
def test_operator_killed_mid_recovery_makes_no_duplicate_attempt(
    jobs: harness.Jobs, operator: harness.Operator, kill_when: str
) -> None:
    name = harness.unique("opkill")
    # A start judged by a 120 s startup deadline: attempt 2's gang once took over 30 s to meet
    # on a loaded machine, and the recreated attempt 3 is not what this test is about.
    policy = {"startupDeadlineSeconds": 120}
    env = {"STANDIN_FAIL_AT_STEP": 8}
    jobs.apply(harness.job_doc(name, env=env, training={"steps": 30}, failurePolicy=policy))
    _pods_of(jobs, name, 1)
    if kill_when == "at-failure":
        _step_at_least(jobs, name, 7)
    elif kill_when == "restarting":
        poll.until("restart decided", lambda: jobs.status(name).get("attempt") == 2, every=0.05)
    else:
        poll.until(
            "new pods",
            lambda: any(
                p["metadata"]["labels"]["fsdpoperator.io/attempt"] == "2" for p in jobs.pods(name)
            ),
            every=0.05,
        )
    operator.kill()
    try:
        seen_attempts = {
            p["metadata"]["labels"]["fsdpoperator.io/attempt"] for p in jobs.pods(name)
        }
    finally:
        operator.start()
    done = _phase(jobs, name, "Succeeded", timeout=120)
    why = f"{json.dumps(done['history'])}\n{jobs.events(name)}"
    assert done["attempt"] == 2 and done["restarts"]["total"] == 1, why
    assert [h["attempt"] for h in done["history"]] == [1, 2]
    assert seen_attempts <= {"1", "2"}


def test_suspend_saves_and_resume_continues_from_that_step(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    name = harness.unique("suspend")
    jobs.apply(harness.job_doc(name, training={"steps": 60}))
    _pods_of(jobs, name, 1)
    _step_at_least(jobs, name, 7)
    jobs.patch(name, {"suspend": True})
    poll.until("pods gone", lambda: not jobs.pods(name), timeout=60)
    # The phase reads Suspended from the pass that stops the pods; lastCheckpoint shows their
    # SIGTERM save from the pass their exit wakes (CI once read the status in between: step 5).
    s = poll.until(
        "the SIGTERM save in status",
        lambda: (s := jobs.status(name)).get("phase") == "Suspended"
        and (s.get("lastCheckpoint") or {}).get("step", 0) >= 7
        and s,
        timeout=30,
        diagnosis=lambda: f"{name} status: {jobs.status(name)}",
    )
    saved = s["lastCheckpoint"]["step"]
    jobs.patch(name, {"suspend": False})
    done = _phase(jobs, name, "Succeeded", timeout=120)
    assert done["history"][1]["resumedFromStep"] == saved
    assert done["history"][0]["stepsLost"] == 0 and done["restarts"]["total"] == 0


def test_checkpoints_gone_from_storage_stop_the_job_instead_of_a_fresh_start(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    """Step 10 and later were sealed; then the storage lost them (a wrong claim, a wiped
    volume). The next attempt must not quietly train the job again from step 0."""
    name = harness.unique("vanish")
    jobs.apply(harness.job_doc(name, training={"steps": 400}))
    poll.until(
        "a checkpoint sealed",
        lambda: ((s := jobs.status(name)).get("lastCheckpoint") or {}).get("step", 0) >= 10 and s,
        timeout=90,
        diagnosis=lambda: f"{jobs.status(name)}\n{operator.log_tail()}",
    )
    jobs.patch(name, {"suspend": True})
    poll.until("pods gone", lambda: not jobs.pods(name), timeout=60)
    _phase(jobs, name, "Suspended")
    shutil.rmtree(jobs.ckpt_dir(name))
    jobs.patch(name, {"suspend": False})
    failed = _phase(jobs, name, "Failed", timeout=120)
    assert failed["lastFailure"]["cause"] == "ConfigError", failed
    message, sealed = failed["lastFailure"]["message"], failed["sealedStep"]
    assert sealed >= 10 and f"step {sealed} was sealed" in message and "from step 0" in message
    condition = next(c for c in failed["conditions"] if c["type"] == "Failed")
    assert condition["status"] == "True" and "from step 0" in condition["message"], condition
    assert not list(jobs.ckpt_dir(name).glob("step-*"))  # not one step trained from scratch


def test_delete_garbage_collects_everything(jobs: harness.Jobs, operator: harness.Operator) -> None:
    name = harness.unique("gc")
    jobs.apply(harness.job_doc(name, training={"steps": 400}))
    _pods_of(jobs, name, 1)
    jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", jobs.ns, "--wait=false")
    poll.until("pods collected", lambda: not jobs.pods(name), timeout=60)
    svc = jobs.cluster.kubectl("get", "svc", "-n", jobs.ns, "-o", "name").stdout
    assert f"{name}-workers" not in svc


def _plant(directory: Path, *, step: int, attempt: int, config_hash: str, corrupt: bool) -> None:
    """A checkpoint that looks complete: files, then a marker listing them (as a worker would)."""
    storage = catalog.LocalStorage(str(directory))
    name = catalog.step_dir_name(step)
    (directory / name).mkdir(parents=True)
    (directory / name / "rank-0.bin").write_bytes(b"x" * 64)
    marker = catalog.Marker(
        step=step,
        attempt=attempt,
        world_size=2,
        global_batch_size=4,
        samples_consumed=step * 4,
        resumed_from_step=None,
        time=time.time(),
        torch_version="planted",
        config_hash=config_hash,
        files=catalog.build_manifest(storage, name, checksums=False),
    )
    storage.write_atomic(f"{name}/{catalog.MARKER_NAME}", marker.to_json())
    if corrupt:  # truncated after the marker was written: the manifest no longer matches
        (directory / name / "rank-0.bin").write_bytes(b"x" * 10)
    for path in (directory / name, *(directory / name).iterdir()):
        os.chown(path, stack.WORKER_UID, stack.WORKER_UID)  # as the worker (uid 1000) would


def test_lineage_and_verification_choose_the_resume_checkpoint(
    jobs: harness.Jobs, operator: harness.Operator
) -> None:
    name = harness.unique("lineage")
    doc = harness.job_doc(name, env={"STANDIN_FAIL_AT_STEP": 8}, training={"steps": 400})
    jobs.apply(doc)
    _attempt(jobs, name, 2)  # attempt 1 failed at step 8; attempt 2 resumed from step 5
    _step_at_least(jobs, name, 12)  # and wrote step 10 itself
    config_hash = api.FSDPJobSpec.model_validate(doc["spec"]).training.resume_hash()
    ckpts = jobs.ckpt_dir(name)
    # a superseded attempt (1) writing late, past the step attempt 2 resumed from
    _plant(ckpts, step=300, attempt=1, config_hash=config_hash, corrupt=False)
    # attempt 2's own newer checkpoint, damaged after its marker was written
    _plant(ckpts, step=200, attempt=2, config_hash=config_hash, corrupt=True)
    pods = _pods_of(jobs, name, 2)
    _faults(operator).crash(jobs.ns, pods[0]["metadata"]["name"])
    s = _attempt(jobs, name, 3)
    assert s["history"][2]["resumedFromStep"] not in (200, 300)
    assert s["history"][2]["resumedFromStep"] >= 10
    assert s["quarantined"] == ["./step-200"]
    assert (ckpts / "step-300").is_dir()  # lineage rejects, but it is not corruption
    assert not (ckpts / "step-200").exists() and list(ckpts.glob("step-200.quarantined-*"))
    assert "CheckpointQuarantined" in jobs.events(name)
    jobs.patch(name, {"suspend": True})

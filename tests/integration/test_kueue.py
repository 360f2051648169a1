"""FSDPJobs under a real Kueue (v0.17.0, built from its Go module) on the local cluster.

Kueue runs as its own process with its webhooks served by URL (localcluster/kueue.py), for the
plain-pod integration in this module's namespaces only. A job labelled
`kueue.x-k8s.io/queue-name` waits in its LocalQueue as one pod group: Queued while Kueue holds
its pods, never charged as Unschedulable.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from fsdp_operator.types import names
from fsdp_operator.types import status as st
from localcluster import controlplane, poll
from localcluster import faults as lf
from localcluster import kueue as lk
from tests import install_guide
from tests.cluster import test_install_guide as guide_test
from tests.integration import harness

# The module's first test also waits for Kueue's build, which `make test` starts beside pytest
# (on a fresh machine it may still be compiling): more than the 300 s default.
pytestmark = [pytest.mark.cluster, pytest.mark.timeout(600)]
GPUS_PER_POD = 2


@pytest.fixture(scope="module")
def kueue(cluster: controlplane.Cluster) -> Iterator[lk.Kueue]:
    k = lk.Kueue(cluster)
    k.start()
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture
def queued_jobs(jobs: harness.Jobs, kueue: lk.Kueue) -> harness.Jobs:
    kueue.enable(jobs.ns)
    kueue.queue(jobs.ns, name="team", cluster_queue=f"cq-{jobs.ns}", gpus=4)
    return jobs


def _gpu_job(
    name: str, *, steps: int, queue: str | None = "team", priority: str | None = None
) -> dict:
    doc = harness.job_doc(
        name,
        replicas=2,
        minReplicas=2,
        training={"steps": steps},
        resources={"limits": {"nvidia.com/gpu": GPUS_PER_POD}},
    )
    if queue:
        doc["metadata"]["labels"] = {"kueue.x-k8s.io/queue-name": queue}
    if priority:
        doc["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] = priority
    return doc


def _context(jobs: harness.Jobs, kueue: lk.Kueue, *names: str) -> str:
    lines = []
    for name in names:
        s = jobs.status(name)
        group = (s.get("queue") or {}).get("podGroup")
        wl = kueue.workload(jobs.ns, group) if group else None
        lines += [
            f"{name} status: {json.dumps(s)[:3000]}",
            f"{name} events: {jobs.events(name)}",
            f"{name} workload {group}: {json.dumps((wl or {}).get('status'))[:1500]}",
        ]
    pods = [
        (p["metadata"]["name"], p["status"].get("phase"), p["spec"].get("schedulingGates"))
        for p in jobs.pods()
    ]
    lines.append(f"pods: {pods}")
    lines.append(f"kueue log:\n{lk.procs.tail(kueue.log, 20)}")
    return "\n".join(lines)


def _event_words(jobs: harness.Jobs, name: str) -> list[str]:
    items = jobs.cluster.get_json(
        "events", "-n", jobs.ns, "--field-selector", f"involvedObject.name={name}"
    )["items"]
    return [f"{e['reason']}: {e['message']}" for e in items]


def _phase(jobs: harness.Jobs, kueue: lk.Kueue, name: str, phase: str, *, timeout: float) -> dict:
    return poll.until(
        f"{name} phase {phase}",
        lambda: (s := jobs.status(name)).get("phase") == phase and s,
        timeout=timeout,
        diagnosis=lambda: _context(jobs, kueue, name),
    )


def test_a_preempted_job_saves_waits_and_resumes_with_no_steps_lost(
    queued_jobs: harness.Jobs, kueue: lk.Kueue, operator: harness.Operator
) -> None:
    """A higher-priority job takes the quota: Kueue evicts the running job's pod group, its
    ranks save on SIGTERM, it waits Queued (not charged: the cause is Preempted) and resumes
    from that save once the other job is done."""
    jobs = queued_jobs
    kueue.priority_class("fsdpop-low", 100)
    kueue.priority_class("fsdpop-high", 1000)
    low, high = harness.unique("kq-low"), harness.unique("kq-high")
    jobs.apply(_gpu_job(low, steps=150, priority="fsdpop-low"))
    _phase(jobs, kueue, low, "Running", timeout=120)
    poll.until(
        f"{low} step 6",
        lambda: (jobs.status(low).get("step") or 0) >= 6,
        timeout=90,
        diagnosis=lambda: _context(jobs, kueue, low),
    )
    jobs.apply(_gpu_job(high, steps=20, priority="fsdpop-high"))
    preempted = poll.until(
        f"{low} preempted",
        lambda: (s := jobs.status(low)).get("history")
        and s["history"][0].get("cause") == st.Cause.PREEMPTED.value
        and s,
        timeout=60,
        diagnosis=lambda: _context(jobs, kueue, low, high),
    )
    assert "Kueue evicted pod group" in preempted["message"], preempted
    _phase(jobs, kueue, high, "Succeeded", timeout=180)
    poll.until(
        f"{low} attempt 2 trains",
        lambda: (s := jobs.status(low)).get("attempt") == 2
        and s.get("phase") == "Running"
        and (s.get("step") or 0) > (s.get("resumedFromStep") or 0)
        and s,
        timeout=180,
        diagnosis=lambda: _context(jobs, kueue, low, high),
    )
    done = _phase(jobs, kueue, low, "Succeeded", timeout=180)
    first, second = done["history"][0], done["history"][1]
    saved = sorted(p.name for p in jobs.ckpt_dir(low).iterdir())
    why = f"{json.dumps(done['history'])}\nevents: {_event_words(jobs, low)}\nsaved: {saved}"
    assert first["cause"] == st.Cause.PREEMPTED.value and first["stepsLost"] == 0, why
    assert second["resumedFromStep"] and second["resumedFromStep"] >= 6, second
    assert done["restarts"]["application"] == 0 and done["restarts"]["infrastructure"] == 0
    assert done["reliability"]["failures"] == 0, done["reliability"]
    reasons = jobs.events(low)
    assert "FailureDetected" not in reasons and "Queued" in reasons, reasons
    t = st.parse_rfc3339
    ended, admitted = t(first["ended"]), t(done["queue"]["admitted"])
    print(
        f"preempted -> re-admitted {admitted - ended:.1f}s (the other job ran in between); "
        f"re-admitted -> first step {t(second['timeline']['firstStep']) - admitted:.1f}s"
    )


def _gpus_used(kueue: lk.Kueue, cluster_queue: str) -> str | None:
    cq = kueue.kube.get_or_none(f"/apis/kueue.x-k8s.io/v1beta2/clusterqueues/{cluster_queue}")
    for flavor in ((cq or {}).get("status") or {}).get("flavorsUsage") or []:
        for res in flavor.get("resources") or []:
            if res.get("name") == lk.GPU:
                return str(res.get("total"))
    return None


def _admitted_since(wl: dict | None) -> str | None:
    """When the Workload's Admitted condition last turned True (None: not admitted now)."""
    conds = {c["type"]: c for c in ((wl or {}).get("status") or {}).get("conditions") or []}
    admitted = conds.get("Admitted") or {}
    return admitted.get("lastTransitionTime") if admitted.get("status") == "True" else None


def test_a_job_beyond_the_quota_waits_while_the_first_recovers_in_its_group_then_runs(
    queued_jobs: harness.Jobs, kueue: lk.Kueue, operator: harness.Operator
) -> None:
    """Quota for 4 GPUs, two jobs of 4. The second waits Queued with Kueue's reason for longer
    than its pendingTimeoutSeconds (10 s), neither charged nor shrunk. Meanwhile a rank of the
    first crashes: its next attempt's pods replace the gang's in the same pod group, whose
    Workload stays admitted throughout (no requeue), and the waiting job never gets the quota
    in between. When the first job ends, the second runs to the end."""
    jobs = queued_jobs
    name, waiting = harness.unique("kq-crash"), harness.unique("kq-wait")
    jobs.apply(_gpu_job(name, steps=100))
    a = _phase(jobs, kueue, name, "Running", timeout=120)
    group = a["queue"]["podGroup"]
    assert a["queue"]["admitted"] and group == f"{name}-g1"
    poll.until(
        f"{name} step 6",
        lambda: (jobs.status(name).get("step") or 0) >= 6,
        timeout=90,
        diagnosis=lambda: _context(jobs, kueue, name),
    )
    jobs.apply(_gpu_job(waiting, steps=20))
    b = _phase(jobs, kueue, waiting, "Queued", timeout=60)
    cond = next(c for c in b["conditions"] if c["type"] == "Queued")
    assert cond["status"] == "True" and "insufficient" in cond["message"], cond
    since = _admitted_since(kueue.workload(jobs.ns, group))
    assert since is not None
    victim = next(p for p in jobs.running_pods(name, 1) if p["metadata"]["name"].endswith("-1"))
    lf.Faults.for_cluster(operator.cluster.state_dir).crash(jobs.ns, victim["metadata"]["name"])
    seen_waiting: set[str] = set()

    def trained_again() -> dict | None:
        seen_waiting.add(str(jobs.status(waiting).get("phase")))
        assert _admitted_since(kueue.workload(jobs.ns, group)) == since, "admission dropped"
        s = jobs.status(name)
        again = s.get("attempt") == 2 and s.get("phase") == "Running"
        return s if again and (s.get("step") or 0) > (s.get("resumedFromStep") or 0) else None

    s = poll.until(
        f"{name} attempt 2 trains",
        trained_again,
        timeout=150,
        diagnosis=lambda: _context(jobs, kueue, name, waiting),
    )
    assert s["history"][0]["cause"] == st.Cause.CRASH.value and s["restarts"]["application"] == 1
    assert s["queue"]["podGroup"] == group, s["queue"]
    assert seen_waiting == {"Queued"}, seen_waiting
    pods = [p for p in jobs.pods(name) if p["metadata"]["labels"]["fsdpoperator.io/attempt"] == "2"]
    assert {p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for p in pods} == {group}
    _phase(jobs, kueue, name, "Succeeded", timeout=180)
    b = _phase(jobs, kueue, waiting, "Succeeded", timeout=180)
    assert b["attempt"] == 1 and b["replicas"] == 2, b
    assert b["restarts"]["application"] == 0 and b["restarts"]["infrastructure"] == 0
    assert b["queue"]["queuedSeconds"] > 10  # past pendingTimeoutSeconds, uncharged
    reasons = jobs.events(waiting)
    assert "Queued" in reasons and "Admitted" in reasons and "FailureDetected" not in reasons
    wl = kueue.workload(jobs.ns, b["queue"]["podGroup"])
    assert wl is not None and any(
        c["type"] == "Finished" and c["status"] == "True" for c in wl["status"]["conditions"]
    ), wl
    print(
        f"admission latency (attempt created -> pods ungated): {a['queue']['queuedSeconds']:.2f}s;"
        f" crash -> all running in the same group {s['history'][1].get('recoverSeconds'):.1f}s;"
        f" the second job queued {b['queue']['queuedSeconds']:.1f}s"
    )


def test_a_job_shrunk_after_a_lost_node_is_readmitted_at_its_new_size(
    queued_jobs: harness.Jobs, kueue: lk.Kueue, operator: harness.Operator
) -> None:
    """Three pods of 2 GPUs, one per node; a node is lost: the job restarts at two pods in a
    new pod group, admitted for 4 GPUs, and the old group's Workload (6 GPUs) is gone."""
    jobs = queued_jobs
    kueue.queue(jobs.ns, name="team", cluster_queue=f"cq-{jobs.ns}", gpus=6)
    name = harness.unique("kq-shrink")
    doc = _gpu_job(name, steps=300)
    doc["spec"].update(replicas=3, minReplicas=1)
    doc["spec"]["training"]["globalBatchSize"] = 12
    jobs.apply(doc)
    first = _phase(jobs, kueue, name, "Running", timeout=120)
    old_group = first["queue"]["podGroup"]
    poll.until(
        f"{name} step 6",
        lambda: (jobs.status(name).get("step") or 0) >= 6,
        timeout=90,
        diagnosis=lambda: _context(jobs, kueue, name),
    )
    victim = next(p for p in jobs.running_pods(name, 1) if p["metadata"]["name"].endswith("-2"))
    lost = victim["spec"]["nodeName"]
    faults = lf.Faults.for_cluster(operator.cluster.state_dir)
    faults.lose_node(lost, freeze=names.Label.JOB.value)  # its pods stop too
    try:
        s = poll.until(
            f"{name} running at 2 pods",
            lambda: (s := jobs.status(name)).get("attempt", 0) >= 2
            and s.get("replicas") == 2
            and s.get("phase") == "Running"
            and s,
            timeout=180,
            diagnosis=lambda: _context(jobs, kueue, name),
        )
        assert s["history"][0]["cause"] == st.Cause.NODE_LOST.value
        group = s["queue"]["podGroup"]
        assert group != old_group
        wl = kueue.workload(jobs.ns, group)
        usage = wl["status"]["admission"]["podSetAssignments"][0]
        assert usage["count"] == 2 and usage["resourceUsage"]["nvidia.com/gpu"] == "4", usage
        poll.until(
            f"old Workload {old_group} deleted",
            lambda: kueue.workload(jobs.ns, old_group) is None,
            timeout=60,
            diagnosis=lambda: _context(jobs, kueue, name),
        )
        poll.until(  # the ClusterQueue's usage: 4 GPUs now, not the 6 of three pods
            "ClusterQueue uses 4 GPUs",
            lambda: _gpus_used(kueue, f"cq-{jobs.ns}") == "4",
            timeout=60,
            diagnosis=lambda: f"usage {_gpus_used(kueue, f'cq-{jobs.ns}')}",
        )
    finally:
        faults.restore_node(lost)


@pytest.mark.parametrize("command", guide_test.KUEUE_APPLIES, ids=str)
def test_the_install_guides_kueue_objects_are_admitted_by_kueue(
    kueue: lk.Kueue, command: install_guide.Command
) -> None:
    """docs/install.md's Kueue objects, as a user copies them, pass a server-side dry run with
    Kueue's CRDs and webhooks live (tests/cluster/test_install_guide.py runs the rest)."""
    cluster = kueue.cluster
    cluster.kubectl("create", "namespace", guide_test.NAMESPACE, check=False)  # the guide's tenant
    argv, stdin = guide_test.apply_argv(command)
    done = cluster.kubectl(*argv, input=stdin, check=False)
    assert done.returncode == 0, f"{command}\n{done.stderr}"

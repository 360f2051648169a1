"""Two operators, one Lease: the standby finishes what a dead leader started, a clean shutdown
hands over, and a leader cut off from the API server stops writing before anyone may take over.

Both replicas run as processes with the chart's RBAC against the real API server; the session's
own operator is stopped (cleanly: it hands the Lease back) for these tests and started again
after them.
"""

from __future__ import annotations

import datetime
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from harness import stack
from localcluster import controlplane, network, poll
from localcluster import faults as lf
from tests.integration import harness, netcut

pytestmark = pytest.mark.cluster
LEADER = "fsdpjob_operator_leader"
WRITES = ("create", "update", "patch", "delete")


@pytest.fixture
def solo_session(operator: harness.Operator) -> Iterator[harness.Operator]:
    """The session's operator out of the way (its Lease released), back afterwards."""
    operator.stop()
    try:
        yield operator
    finally:
        operator.start()
        poll.until(
            "the session's operator leading again", lambda: operator.sample(LEADER) == 1, timeout=60
        )


def _start(op: harness.Operator, *, leads: bool) -> harness.Operator:
    op.start()
    poll.until(
        f"{op.identity} {'leading' if leads else 'standing by'}",
        lambda: op.sample(LEADER) == (1 if leads else 0),
        timeout=60,
        diagnosis=op.log_tail,
    )
    return op


@pytest.fixture
def pair(solo_session: harness.Operator, tmp_path: Path) -> Iterator[list[harness.Operator]]:
    ops = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        ops.append(
            harness.Operator(
                solo_session.cluster,
                solo_session.kubeconfig,
                tmp_path / name,
                identity=f"ha-{name}",
            )
        )
    try:
        _start(ops[0], leads=True)
        _start(ops[1], leads=False)
        yield ops
    finally:
        for op in ops:
            op.stop()  # cleanly: the session's operator gets the Lease back at once


def _holder(cluster: controlplane.Cluster) -> str:
    lease = cluster.get_json("lease", "fsdp-operator", "-n", stack.OP_NS)
    return str(lease["spec"].get("holderIdentity") or "")


def _writes(op: harness.Operator) -> float:
    """Writes this replica sent to the API server (leases not counted: renewing is its job)."""
    with urllib.request.urlopen(op.metrics_url(), timeout=2) as resp:
        text = resp.read().decode()
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == "fsdpjob_operator_api_requests_total"
        and s.labels.get("verb") in WRITES
        and s.labels.get("resource") != "leases"
    )


def _attempts(jobs: harness.Jobs, name: str) -> list[str]:
    return sorted(p["metadata"]["labels"]["fsdpoperator.io/attempt"] for p in jobs.pods(name))


def test_the_standby_finishes_a_recovery_when_the_leader_is_killed(
    pair: list[harness.Operator], jobs: harness.Jobs
) -> None:
    leader, standby = pair
    name = harness.unique("hakill")
    jobs.apply(harness.job_doc(name, env={"STANDIN_FAIL_AT_STEP": 8}, training={"steps": 30}))
    poll.until(
        "restart decided", lambda: jobs.status(name).get("attempt") == 2, timeout=90, every=0.05
    )
    leader.kill()  # in the middle of the recovery: old pods going, new ones perhaps not created
    poll.until(
        "the standby leads",
        lambda: standby.sample(LEADER) == 1,
        timeout=30,
        diagnosis=standby.log_tail,
    )
    assert _holder(jobs.cluster) == standby.identity
    done = poll.until(
        "job done",
        lambda: (s := jobs.status(name)).get("phase") == "Succeeded" and s,
        timeout=120,
        diagnosis=standby.log_tail,
    )
    assert done["attempt"] == 2 and done["restarts"]["total"] == 1
    assert [h["attempt"] for h in done["history"]] == [1, 2]
    assert _attempts(jobs, name) == ["2", "2"]  # exactly one attempt's pods, no duplicates


def test_a_clean_shutdown_hands_the_lease_over(
    pair: list[harness.Operator], jobs: harness.Jobs
) -> None:
    leader, standby = pair
    name = harness.unique("hastop")
    jobs.apply(harness.job_doc(name, training={"steps": 400}))
    poll.until("running", lambda: jobs.status(name).get("phase") == "Running", timeout=60)
    passes = standby.sample("fsdpjob_reconcile_passes_total")
    assert passes == 0, "a standby runs no passes"
    leader.stop()  # SIGTERM: the leader releases the Lease on its way out
    assert "released lease" in leader.log_tail()
    poll.until(
        "the standby leads",
        lambda: standby.sample(LEADER) == 1,
        timeout=10,
        diagnosis=standby.log_tail,
    )
    assert _holder(jobs.cluster) == standby.identity
    poll.until(
        "the new leader's passes",
        lambda: (standby.sample("fsdpjob_reconcile_passes_total") or 0) > 0,
        timeout=10,
    )
    jobs.patch(name, {"suspend": True})
    poll.until(
        "suspended by the new leader",
        lambda: jobs.status(name).get("phase") == "Suspended",
        timeout=60,
    )


def _logged(op: harness.Operator, pattern: str) -> float:
    """Unix time of the first log line matching `pattern` (the log's own timestamps)."""
    for line in op.log_tail(lines=100000).splitlines():
        if re.search(pattern, line):
            stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
            return stamp.timestamp()
    raise AssertionError(f"no log line matches {pattern!r}")


def test_a_leader_cut_off_from_the_api_server_writes_nothing_after_its_renew_deadline(
    solo_session: harness.Operator, jobs: harness.Jobs, tmp_path: Path
) -> None:
    cluster = solo_session.cluster
    relay = netcut.Relay((network.GATEWAY, cluster.ports["apiserver"]))
    kubeconfig = yaml.safe_load(solo_session.kubeconfig.read_text())
    for entry in kubeconfig["clusters"]:
        entry["cluster"]["server"] = f"https://127.0.0.1:{relay.port}"
    cut_kubeconfig = tmp_path / "through-relay.kubeconfig"
    cut_kubeconfig.write_text(yaml.safe_dump(kubeconfig))
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    a = harness.Operator(cluster, cut_kubeconfig, tmp_path / "a", identity="cut-a")
    b = harness.Operator(cluster, solo_session.kubeconfig, tmp_path / "b", identity="cut-b")
    try:
        _start(a, leads=True)
        _start(b, leads=False)
        name = harness.unique("hacut")
        jobs.apply(harness.job_doc(name, training={"steps": 2000}))
        poll.until("running", lambda: (jobs.status(name).get("step") or 0) >= 3, timeout=90)
        relay.cut()
        poll.until(
            "a stops leading", lambda: a.sample(LEADER) == 0, timeout=20, diagnosis=a.log_tail
        )
        written = _writes(a)
        poll.until("b leads", lambda: b.sample(LEADER) == 1, timeout=30, diagnosis=b.log_tail)
        # A failure only the new leader may handle, while the old one still believes in it.
        rank0 = next(p for p in jobs.pods(name) if p["metadata"]["name"].endswith("-a1-0"))
        lf.Faults.for_cluster(cluster.state_dir).crash(jobs.ns, rank0["metadata"]["name"])
        poll.until(
            "b restarts the job",
            lambda: (s := jobs.status(name)).get("attempt") == 2 and s.get("phase") == "Running",
            timeout=90,
            diagnosis=b.log_tail,
        )
        relay.heal()  # whatever a had queued in the cut may arrive now
        time.sleep(6)  # a's next tries see b's lease; its watches catch up
        assert _writes(a) == written, "the cut-off leader wrote after it stopped leading"
        assert a.sample(LEADER) == 0 and b.sample(LEADER) == 1
        assert _holder(cluster) == "cut-b"
        # a stopped acting before its lease could expire, so before b could take it.
        assert _logged(a, "cut-a stops leading") < _logged(b, "cut-b leads")
        assert _attempts(jobs, name) == ["2", "2"]
        jobs.patch(name, {"suspend": True})
    finally:
        for op in (a, b):
            op.stop()
        relay.close()

"""A lost node's ranks resume on a spare from their peer's memory (issue 48 item 3): real torch
ranks, 2 pods x 2 ranks with the memory tier and peer copies, a warm spare on the third node.

Not in tests/integration: the stand-in worker has no memory tier. Node rank 1's node is lost
(kubelet and pod processes stopped); the spare takes its node rank in place (the attempt and
node rank 0's pod stay), and its ranks, whose memory volume is new and empty, get the step
from node rank 0's ranks, which keep their copies: the restart loads from memory, not the
claim.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from fsdp_operator.types import names
from fsdp_operator.types import status as st
from harness import stack
from localcluster import poll
from tests.e2e.conftest import E2E, spare_job

pytestmark = [pytest.mark.cluster, pytest.mark.torch, pytest.mark.timeout(900)]
NPROC = 2
STEPS = 5000  # ~0.2 s each: never done before the takeover is seen (the job is deleted after)


def _job(e2e: E2E, name: str) -> dict[str, Any]:
    doc = spare_job(e2e, name, nproc=NPROC, steps=STEPS)
    # The claim every 50 steps, memory every 2 (peerCopy is on by default): a restart that
    # loads the claim trains tens of steps again, one from memory a few.
    doc["spec"]["checkpoint"].update(
        intervalSteps=50, memory={"intervalSteps": 2, "sizeLimit": "256Mi"}
    )
    return doc


def _gang_and_spare(jobs: stack.Jobs, name: str, attempt: int) -> tuple[dict, dict] | None:
    """`attempt`'s node rank 1 and its spare, once both run and the spare is Ready."""
    running = jobs.running_pods(name, attempt)
    rank1 = [p for p in running if p["metadata"]["labels"].get(names.Label.NODE_RANK.value) == "1"]
    spare = [p for p in running if names.Label.SPARE.value in p["metadata"]["labels"]]
    ready = spare and any(
        c["type"] == "Ready" and c["status"] == "True"
        for c in spare[0].get("status", {}).get("conditions", [])
    )
    return (rank1[0], spare[0]) if rank1 and ready else None


def test_a_spare_in_a_lost_nodes_place_resumes_from_its_peers_memory(
    e2e: E2E, namespace: str
) -> None:
    jobs, name = stack.Jobs(e2e.kube, namespace), "peer-memory"
    jobs.apply(_job(e2e, name))
    trained = poll.until(
        "a gang training past its first claim save (step >= 60)",
        lambda: ((s := jobs.status(name)).get("step") or 0) >= 60 and s,
        timeout=420,
        diagnosis=lambda: jobs.diagnosis(name),
    )
    attempt = trained["attempt"]
    victim, spare = poll.until(
        "node rank 1 and a Ready spare running",
        lambda: _gang_and_spare(jobs, name, attempt),
        timeout=180,
        diagnosis=lambda: jobs.diagnosis(name),
    )
    lost = victim["spec"]["nodeName"]
    before = jobs.status(name)
    seen, claimed = before.get("step") or 0, (before.get("lastCheckpoint") or {}).get("step", 0)
    e2e.faults.lose_node(lost, freeze=names.Label.JOB.value)  # its pods stop too
    try:

        def took_over() -> dict[str, Any] | None:
            s = jobs.status(name)
            entry = next((e for e in s.get("history", []) if e["attempt"] == attempt), {})
            done = entry.get("restartsInPlace") or []
            return done[0] if done and done[0].get("resumed") else None

        restart = poll.until(
            "the spare trains in node rank 1's place",
            took_over,
            timeout=300,
            diagnosis=lambda: jobs.diagnosis(name),
        )
    finally:
        e2e.faults.restore_node(lost)
    s = jobs.status(name)
    story = f"{restart}\n{jobs.diagnosis(name)}"
    assert s["attempt"] == attempt and restart["failure"]["cause"] == "NodeLost", story
    assert restart["failure"]["pod"] == victim["metadata"]["name"], story
    assert s["spares"]["takeovers"] == 1, story
    # From memory: node rank 0's ranks sent the spare's ranks their copies of the step, at
    # most two memory saves (every 2 steps) behind the last the operator saw (the newest
    # save's copies may still have been travelling), not the claim's.
    assert restart["fromMemory"] is True, story
    assert restart["resumedFromStep"] >= max(seen - 4, claimed), (seen, claimed, story)
    log = jobs.cluster.kubectl(
        "logs", "-n", namespace, spare["metadata"]["name"], check=False
    ).stdout
    got = re.findall(r"rank (\d) got its step (\d+) back from rank (\d)'s copy", log)
    assert {(r, peer) for r, _, peer in got} == {("2", "0"), ("3", "1")}, log[-4000:]
    first = st.parse_rfc3339(restart["resumed"])
    taken = first - st.parse_rfc3339(restart["detected"])
    heard = first - st.parse_rfc3339(restart["failure"]["time"])
    print(
        f"peer memory: NodeLost -> first step {taken:.2f}s, last heartbeat -> first step "
        f"{heard:.2f}s, resumed from step {restart['resumedFromStep']} (step {seen} scraped "
        f"before the loss, the claim's newest {claimed})"
    )
    jobs.cluster.kubectl("delete", "fsdpjob", name, "-n", namespace, "--wait=false")
